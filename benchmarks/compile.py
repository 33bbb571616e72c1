"""The compile stage on YOLOv8n-320, YOLOv8n-640 and Keras MobileNetV2-224, per chip.

For each recipe and chip the recipe is built up to ``quantize`` (a matrix cell,
``build/<name>@<chip>/``, from the cache when it can), then the ``compile`` stage function runs
and is timed (plan of the groups and of the baseline, program and plan files, timelines, the
in-stage proof, the IR dump). Then the simulator alone: a fresh `Simulator` loads each
``compile/graph_<i>/program.npz`` and runs one seeded random input, median of ``--runs``,
checked bit for bit against ``run_reference`` (whose time is shown for scale). GMEM traffic
comes from the stage's report: grouped, the one layer per group baseline and the lower bound
(every weight, model input and output moved once); grouped / lower bound is the figure of merit.

    python3 benchmarks/compile.py [--runs 3] [--recipes R.yaml ...] [--chips npu-16m npu-tiny]
        [--json out.json]

MobileNetV2 needs scripts/make_mobilenetv2.py run first (models/ is git-ignored).
Goals: the simulator runs YOLOv8n in under 5 s on 2 cores (issue 6); grouped within 1.2x of
the lower bound on these three models on npu-16m (issue 23).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.builds import add_build_options, build_roots
from npubuild import api
from npubuild.backends import SIMULATED
from npubuild.quant.qgraph import QGraph
from npubuild.quant.reference import run_reference
from npubuild.recipe import load_recipe
from npubuild.runtime.simulator import Simulator
from npubuild.stages import StageContext
from npubuild.stages import compile as compile_stage
from npubuild.targets import load_chip, preset_names

RECIPES = ("recipes/yolov8.yaml", "recipes/zoo/yolov8n-640.yaml", "recipes/mobilenetv2-tf.yaml")


def build_cell(recipe: Path, chip: str, root: Path, cache: Path) -> tuple[Path, dict, float]:
    """Build up to quantize (cached), then run the compile stage itself (never from the cache)."""
    loaded = load_recipe(recipe).for_target(chip)
    session = api.session_for(loaded, build_root=root, cache=cache)
    api.build(session, "quantize")
    out = session.paths.stage_dir("compile")
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    ctx = StageContext(loaded, loaded.chip(), {"quantize": session.paths.stage_dir("quantize")},
                       out)
    start = time.perf_counter()
    report = compile_stage.run(ctx)
    return session.paths.root, report, time.perf_counter() - start


def time_simulator(build_dir: Path, runs: int) -> dict:
    sim_times, ref_times, exact = [], [], True
    for qpath in sorted((build_dir / "quantize").glob("graph_*.qgraph.json")):
        qgraph = QGraph.load(qpath)
        program = build_dir / "compile" / qgraph.name / "program.npz"
        rng = np.random.default_rng(0)
        inputs = {t: rng.integers(-128, 128, info.shape).astype(info.dtype)
                  for t, info in ((t, qgraph.tensors[t]) for t in qgraph.inputs)}
        sims, refs = [], []
        for _ in range(runs):
            start = time.perf_counter()
            got = Simulator(program).run(inputs)
            sims.append(time.perf_counter() - start)
            start = time.perf_counter()
            want = run_reference(qgraph, inputs)
            refs.append(time.perf_counter() - start)
        exact &= all(np.array_equal(v, want[t]) for t, v in got.items())
        sim_times.append(statistics.median(sims))
        ref_times.append(statistics.median(refs))
    return {"simulator_s": sum(sim_times), "reference_s": sum(ref_times), "bit_exact": exact}


def row(recipe: Path, chip: str, report: dict, stage_s: float, sim: dict) -> dict:
    est, graphs = report["estimate"], report["compile"]["graphs"]
    return {
        "recipe": recipe.stem, "chip": chip, "npu_graphs": len(graphs),
        "layers": sum(g["layers"] for g in graphs.values()),
        "groups": sum(g["groups"] for g in graphs.values()),
        "slices": sum(g["slices"] for g in graphs.values()),
        "h_sliced": sum(g["h_sliced_groups"] for g in graphs.values()),
        "compile_s": stage_s,
        "plan_s": sum(g["seconds"]["plan"] for g in graphs.values()),
        **sim, "stage_bit_exact": report["simulator"]["bit_exact"],
        "gmem": est["gmem_bytes"], "gmem_baseline": est["gmem_bytes_no_grouping"],
        "gmem_lower_bound": est["gmem_bytes_lower_bound"],
        "lmem_peak": est["lmem_peak_bytes"], "cycles": est["cycles"], "fps": est["fps"],
        "cycles_baseline": est["cycles_no_grouping"], "fps_baseline": est["fps_no_grouping"]}


def print_table(rows: list[dict]) -> None:
    head = ("recipe", "chip", "graphs", "groups (slices, H-sliced)", "compile s", "plan s",
            "sim s", "ref s", "exact", "GMEM grouped", "per layer", "grp/per layer",
            "lower bound", "grp/LB", "LMEM peak", "cycles", "fps", "per layer fps")
    lines = []
    for r in rows:
        lines.append((r["recipe"], r["chip"], str(r["npu_graphs"]),
                      f"{r['groups']} ({r['slices']}, {r['h_sliced']})",
                      f"{r['compile_s']:.2f}", f"{r['plan_s']:.2f}", f"{r['simulator_s']:.2f}",
                      f"{r['reference_s']:.2f}",
                      "yes" if r["bit_exact"] and r["stage_bit_exact"] else "NO",
                      f"{r['gmem']:,}", f"{r['gmem_baseline']:,}",
                      f"{r['gmem'] / r['gmem_baseline']:.2f}", f"{r['gmem_lower_bound']:,}",
                      f"{r['gmem'] / r['gmem_lower_bound']:.2f}", f"{r['lmem_peak']:,}",
                      f"{r['cycles']:,}", f"{r['fps']:.1f}", f"{r['fps_baseline']:.1f}"))
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for line in lines:
        print("| " + " | ".join(line) + " |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--recipes", nargs="+", type=Path, default=[REPO / r for r in RECIPES])
    simulated = [c for c in preset_names() if load_chip(c).backend == SIMULATED]  # npubuild's compiler
    parser.add_argument("--chips", nargs="+", default=["npu-16m"], choices=simulated)
    parser.add_argument("--json", type=Path)
    add_build_options(parser)
    args = parser.parse_args()
    with build_roots(args) as (root, cache):
        rows = []
        for recipe in args.recipes:
            for chip in args.chips:
                build_dir, report, stage_s = build_cell(recipe, chip, root, cache)
                rows.append(row(recipe, chip, report, stage_s,
                                time_simulator(build_dir, args.runs)))
                print(f"{recipe.stem} {chip}: done", file=sys.stderr)
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["bit_exact"] and r["stage_bit_exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
