"""The integer reference (what calibration scoring, the auto-precision search and verify's
bisection run dozens of times): its conv accumulators in float32 where exact (the default)
against float64 everywhere, on every quantized graph of a build, both in this run. Prints a
table of seconds per pass over the graphs and checks the two give the same integers.

    python3 benchmarks/reference.py build/ppocr-v4-det [--runs 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

import numpy as np

from npubuild.quant import reference
from npubuild.quant.qgraph import QGraph


def int_inputs(qgraph: QGraph, seed: int) -> dict[str, np.ndarray]:
    """Seeded integers over each input's whole range (its dtype and shape from the graph)."""
    rng = np.random.default_rng(seed)
    out = {}
    for name in qgraph.inputs:
        p = qgraph.tensors[name]
        if p.is_float:
            out[name] = rng.standard_normal(p.shape).astype(p.dtype)
            continue
        info = np.iinfo(p.dtype)
        out[name] = rng.integers(info.min, info.max + 1, p.shape).astype(p.dtype)
    return out


def one_pass(graphs: list[QGraph]) -> tuple[float, list]:
    start = time.perf_counter()
    results = [reference.run_reference(g, int_inputs(g, i)) for i, g in enumerate(graphs)]
    return time.perf_counter() - start, results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("build", type=Path, help="a build directory (build/<recipe name>)")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    graphs = [QGraph.load(p) for p in sorted((args.build / "quantize").glob("*.qgraph.json"))]
    exact = reference._exact_float
    modes = {"float32 where exact": exact, "float64 always": lambda xs, w: np.float64}
    times, outputs = {}, {}
    for _ in range(args.runs):  # interleaved, so load drifts hit both alike
        for mode, choose in modes.items():
            reference._exact_float = choose
            seconds, outputs[mode] = one_pass(graphs)
            times.setdefault(mode, []).append(seconds)
    reference._exact_float = exact
    same = all(np.array_equal(a[t], b[t]) for a, b in zip(*outputs.values()) for t in a)
    base = statistics.median(times["float64 always"])
    print(f"{len(graphs)} quantized graphs of {args.build}; identical integers: {same}\n")
    print("| conv accumulator | median s per pass | vs float64 |\n|---|---|---|")
    for mode, values in times.items():
        median = statistics.median(values)
        print(f"| {mode} | {median:.2f} | {base / median:.2f}x |")


if __name__ == "__main__":
    main()
