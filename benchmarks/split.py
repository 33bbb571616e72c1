"""Partition time of the split on the real YOLOv8n and on a synthetic 20,000-node graph.

Rows: ``partition`` is the cut alone (levels + segments, the near-linear core); ``plan`` adds
shape inference, the per-node support check and the policy loop; ``split`` on YOLOv8n adds
writing the submodels and ONNX Runtime's proof. Prints a table (wall time, median of runs).

    python3 benchmarks/split.py [--runs 3] [--nodes 20000]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent


def yolov8n():
    import onnx

    from npubuild.recipe.paths import resolve

    from npubuild.onnx_io import fix_input_shapes

    model = onnx.load(str(resolve("pkg:nudenet/320n.onnx", REPO)))
    return fix_input_shapes(model, {"images": [1, 3, 320, 320]})


def synthetic(nodes: int):
    """A residual chain of elementwise ops; every 50th node is Erf (not on npu-16m), so the
    cut has ~2 × nodes / 50 segments and many skip edges cross them."""
    from onnx import TensorProto, helper

    made, names = [], ["x"]
    for i in range(nodes):
        if i % 50 == 49:
            op, args = "Erf", [names[-1]]
        elif i % 7 == 6 and i >= 20:
            op, args = "Add", [names[-1], names[-1 - (i % 13) - 5]]
        else:
            op, args = ("Relu", "Sigmoid", "Tanh")[i % 3], [names[-1]]
        made.append(helper.make_node(op, args, [f"t{i}"], name=f"n{i}"))
        names.append(f"t{i}")
    graph = helper.make_graph(made, "synthetic",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8, 8])],
                              [helper.make_tensor_value_info(names[-1], TensorProto.FLOAT, None)])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 10
    return model


def timed(fn, runs: int) -> tuple[float, object]:
    times, result = [], None
    for _ in range(runs):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def rows_for(label: str, model, chip, runs: int, with_split: bool) -> list[tuple]:
    from npubuild.recipe.model import SplitSpec
    from npubuild.split import plan_split, split_model
    from npubuild.split.partition import partition

    plan = plan_split(model, chip)
    seconds, segments = timed(lambda: partition(plan.graph.preds, plan.on_npu), runs)
    n = len(plan.graph)
    out = [(label, n, "partition", seconds, len(segments))]
    seconds, plan = timed(lambda: plan_split(model, chip), runs)
    out.append((label, n, "plan (infer + check + cut)", seconds, len(plan.segments)))
    seconds, plan = timed(lambda: plan_split(model, chip, SplitSpec(policy="min_cost")), runs)
    out.append((label, n, "plan, policy min_cost", seconds, len(plan.segments)))
    if with_split:
        with tempfile.TemporaryDirectory() as tmp:
            seconds, report = timed(lambda: split_model(model, chip, None, tmp), runs)
        out.append((label, n, "split (write + ORT proof)", seconds,
                    report["npu_segments"] + report["cpu_segments"]))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--nodes", type=int, default=20000)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from npubuild.targets import load_chip

    chip = load_chip("npu-16m")
    rows = rows_for("YOLOv8n 320", yolov8n(), chip, args.runs, with_split=True)
    rows += rows_for(f"synthetic {args.nodes:,}", synthetic(args.nodes), chip, args.runs,
                     with_split=False)
    print(f"split on {chip.name}, median of {args.runs} runs (wall time)\n")
    print(f"| {'model':<17} | {'nodes':>6} | {'step':<27} | seconds | segments |")
    print(f"|{'-' * 19}|{'-' * 8}|{'-' * 29}|---------|----------|")
    for label, n, step, seconds, segments in rows:
        print(f"| {label:<17} | {n:>6} | {step:<27} | {seconds:7.4f} | {segments:>8} |")


if __name__ == "__main__":
    main()
