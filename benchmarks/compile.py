"""The compile stage on YOLOv8n-320, YOLOv8n-640 and Keras MobileNetV2-224 (or the zoo), per chip.

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
    python3 benchmarks/compile.py --zoo --baseline-tree ../base [-j 2] [--no-sim] [--reuse-quantize]
        --build-dir B --cache C

``--plan-only`` (with ``--baseline-tree``) times only the group search, program and estimate of
both compilers on each cell's quantized graphs, ``--plan-runs`` times each, interleaved (medians),
and checks that both wrote byte-identical plans (the sha256 of each graph's plan.json content):
the table of issue 23's planner speed-up.

    python3 benchmarks/compile.py --plan-only --baseline-tree /work/main --reuse-quantize
        --recipes recipes/zoo/birdnet.yaml ... --build-dir B --cache C [--plan-runs 3]

``--zoo`` adds every recipe of recipes/zoo/ (and recipes/zoo/keras/) whose model file exists
(models/ is generated: scripts/make_zoo_models.py, scripts/make_keras_zoo.py; MobileNetV2 needs
scripts/make_mobilenetv2.py). ``--baseline-tree DIR`` plans the same quantized graphs with the
compiler of another checkout (``git worktree add --detach DIR <commit>``) and with this one, each
in a subprocess of its own (`benchmarks/compile_plan.py`), so only the compilers differ: groups,
GMEM bytes and NPU cycles side by side, GMEM baseline / ours and NPU fps ours / baseline (> 1:
ours is better). An older compiler may read a newer graph's layer differently (a per-channel
PRelu's negative side, whose per-channel parameters it does not load): ``weights Δ`` counts the
weight bytes ours sees and it does not, and ``same weights`` adds them to its GMEM before the
ratio. ``-j N`` builds the cells up to quantize in N processes first; ``--reuse-quantize``
takes a cell's quantize folder as an earlier run left it in ``--build-dir`` (the content cache's
keys include npubuild's code, so an edit to the compiler would otherwise quantize again).
Goals: the simulator runs YOLOv8n in under 5 s on 2 cores (issue 6); grouped within 1.2x of
the lower bound on these three models on npu-16m (issue 23).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor
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


def quantize_cell(recipe: Path, chip: str, root: Path, cache: Path, reuse: bool = False) -> str:
    """Build ``recipe`` on ``chip`` up to quantize (from the cache when it can; an earlier run's
    quantize folder as it is with ``reuse``); '' when done, else the error's first line."""
    try:
        session = api.session_for(load_recipe(recipe).for_target(chip), build_root=root,
                                  cache=cache)
        if not (reuse and any(session.paths.stage_dir("quantize").glob("graph_*.qgraph.json"))):
            api.build(session, "quantize")
    except Exception as exc:  # noqa: BLE001 - a cell that cannot be built is a row saying why
        return f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return ""


def build_cell(recipe: Path, chip: str, root: Path, cache: Path) -> tuple[Path, dict, float]:
    """Run the compile stage itself (never from the cache) on the cell's quantized graphs."""
    loaded = load_recipe(recipe).for_target(chip)
    session = api.session_for(loaded, build_root=root, cache=cache)
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


def plan_with(tree: Path, recipe: Path, chip: str, build_dir: Path) -> dict:
    """The compiler of checkout ``tree`` on this cell's quantized graphs (`compile_plan.py`)."""
    spec = load_recipe(recipe).recipe.compile
    env = {**os.environ, "PYTHONPATH": str(tree.resolve())}
    done = subprocess.run([sys.executable, str(REPO / "benchmarks" / "compile_plan.py"), chip,
                           "true" if spec.layer_group else "false", spec.on_no_fit,
                           str(build_dir / "quantize")],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode != 0 or not done.stdout.strip():
        return {"error": (done.stderr.strip().splitlines() or ["no output"])[-1]}
    result = json.loads(done.stdout.splitlines()[-1])
    if "error" in result:
        return result
    if Path(result["npubuild"]).resolve() != (tree / "npubuild").resolve():
        return {"error": f"imported {result['npubuild']}, not {tree}'s npubuild"}
    graphs = result["graphs"].values()
    cycles = sum(g["cycles"] for g in graphs)
    return {"groups": sum(g["groups"] for g in graphs),
            "gmem": sum(g["gmem_bytes"] for g in graphs),
            "lower_bound": sum(g.get("gmem_lower_bound", 0) for g in graphs),
            "weights": sum(g["weight_bytes"] for g in graphs), "cycles": cycles,
            "npu_fps": result["clock_hz"] / cycles if cycles else 0.0,
            "plan_s": sum(g["plan_s"] for g in graphs),
            "plans": [g.get("plan_sha256") for g in graphs]}


def plan_times(tree: Path, recipe: Path, chip: str, build_dir: Path, runs: int) -> dict:
    """This checkout's and ``tree``'s compilers on the cell's quantized graphs, ``runs`` times
    each, interleaved (ours, theirs, ours, ...) so load on the machine falls on both alike;
    the median plan time of each and whether every run of both wrote the same plans."""
    ours, base = [], []
    for _ in range(runs):
        ours.append(plan_with(REPO, recipe, chip, build_dir))
        base.append(plan_with(tree, recipe, chip, build_dir))
    failed = next((r["error"] for r in ours + base if "error" in r), None)
    if failed:
        return {"error": failed}
    plans = {tuple(r["plans"]) for r in ours + base}
    return {**ours[0], "plan_s": statistics.median(r["plan_s"] for r in ours),
            "base": {**base[0], "plan_s": statistics.median(r["plan_s"] for r in base)},
            "same_plans": len(plans) == 1 and None not in next(iter(plans))}


def print_plan_times(rows: list[dict]) -> None:
    """Plan time of ours against the baseline tree's (medians of interleaved runs), and whether
    the two wrote byte-identical plans."""
    head = ("recipe", "chip", "layers", "groups", "plan s", "baseline plan s", "speedup",
            "same plans", "GMEM grouped", "lower bound", "grp/LB", "baseline grp/LB")
    lines = []
    for r in rows:
        if "error" in r:
            continue
        ours, base = r, r["base"]
        lines.append((r["recipe"], r["chip"], str(r["layers"]), f"{ours['groups']} / "
                      f"{base['groups']}", f"{ours['plan_s']:.2f}", f"{base['plan_s']:.2f}",
                      f"{base['plan_s'] / ours['plan_s']:.1f}x",
                      "yes" if r["same_plans"] else "NO", f"{ours['gmem']:,}",
                      f"{ours['lower_bound']:,}", f"{ours['gmem'] / ours['lower_bound']:.3f}",
                      f"{base['gmem'] / ours['lower_bound']:.3f}"))
    _markdown(head, lines)


def plan_cell(recipe: Path, chip: str, root: Path, cache: Path, error: str, args) -> dict:
    """One row of ``--plan-only``: both compilers' plans of the cell's quantized graphs."""
    if error:
        return {"recipe": recipe.stem, "chip": chip, "error": error}
    session = api.session_for(load_recipe(recipe).for_target(chip), build_root=root, cache=cache)
    build_dir = session.paths.root
    found = plan_times(args.baseline_tree, recipe, chip, build_dir, args.plan_runs)
    layers = sum(len(QGraph.load(p).layers)
                 for p in (build_dir / "quantize").glob("graph_*.qgraph.json"))
    return {"recipe": recipe.stem, "chip": chip, "layers": layers, **found}


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
        "npu_fps": est.get("npu_fps", est["fps"]),
        "cycles_baseline": est["cycles_no_grouping"], "fps_baseline": est["fps_no_grouping"]}


def print_table(rows: list[dict]) -> None:
    head = ("recipe", "chip", "graphs", "groups (slices, H-sliced)", "compile s", "plan s",
            "sim s", "ref s", "exact", "GMEM grouped", "per layer", "grp/per layer",
            "lower bound", "grp/LB", "LMEM peak", "cycles", "fps", "per layer fps")
    lines = []
    for r in rows:
        if "error" in r:
            continue
        timed = "simulator_s" in r
        lines.append((r["recipe"], r["chip"], str(r["npu_graphs"]),
                      f"{r['groups']} ({r['slices']}, {r['h_sliced']})",
                      f"{r['compile_s']:.2f}", f"{r['plan_s']:.2f}",
                      f"{r['simulator_s']:.2f}" if timed else "-",
                      f"{r['reference_s']:.2f}" if timed else "-",
                      "yes" if r["bit_exact"] and r["stage_bit_exact"] else "NO",
                      f"{r['gmem']:,}", f"{r['gmem_baseline']:,}",
                      f"{r['gmem'] / r['gmem_baseline']:.2f}", f"{r['gmem_lower_bound']:,}",
                      f"{r['gmem'] / r['gmem_lower_bound']:.2f}", f"{r['lmem_peak']:,}",
                      f"{r['cycles']:,}", f"{r['fps']:.1f}", f"{r['fps_baseline']:.1f}"))
    _markdown(head, lines)


def print_comparison(rows: list[dict]) -> None:
    """Ours against the baseline tree's compiler on the same quantized graphs. ``weights Δ``:
    weight bytes our compiler counts that the baseline's does not (layers an older compiler
    reads differently); ``same weights`` adds them to the baseline's GMEM before the ratio."""
    head = ("recipe", "chip", "groups", "GMEM grouped", "lower bound", "grp/LB", "per layer",
            "baseline groups", "baseline GMEM", "baseline/ours GMEM", "weights Δ",
            "same weights", "NPU fps", "baseline NPU fps", "fps ours/baseline", "plan s",
            "baseline plan s")
    lines = []
    for r in rows:
        ours, base = r.get("ours"), r.get("base")
        if "error" in r or base is None:
            continue
        lead = (r["recipe"], r["chip"], str(r["groups"]), f"{r['gmem']:,}",
                f"{r['gmem_lower_bound']:,}", f"{r['gmem'] / r['gmem_lower_bound']:.2f}",
                f"{r['gmem_baseline']:,}")
        failed = ours.get("error") and f"ours: {ours['error']}" or \
            base.get("error") and f"baseline: {base['error']}"
        if failed:
            lines.append(lead + ("-", failed) + ("-",) * 8)
            continue
        extra = ours["weights"] - base["weights"]
        lines.append(lead + (str(base["groups"]), f"{base['gmem']:,}",
                             f"{base['gmem'] / ours['gmem']:.3f}", f"{extra:,}",
                             f"{(base['gmem'] + extra) / ours['gmem']:.3f}",
                             f"{ours['npu_fps']:.1f}", f"{base['npu_fps']:.1f}",
                             f"{ours['npu_fps'] / base['npu_fps']:.3f}",
                             f"{ours['plan_s']:.2f}", f"{base['plan_s']:.2f}"))
    _markdown(head, lines)


def print_errors(rows: list[dict]) -> None:
    for r in rows:
        if "error" in r:
            print(f"- {r['recipe']} {r['chip']}: not compiled: {r['error']}")


def _markdown(head: tuple, lines: list[tuple]) -> None:
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for line in lines:
        print("| " + " | ".join(line) + " |")


def recipe_list(args) -> list[Path]:
    """The recipes asked for, then (``--zoo``) every zoo recipe whose model file exists."""
    recipes = list(args.recipes)
    if args.zoo:
        from benchmarks.zoo import zoo_recipes
        from npubuild.errors import UserError

        for recipe in zoo_recipes(None):
            try:
                load_recipe(recipe)
            except UserError as exc:  # a model not generated yet, said once, not a crash
                print(f"# {recipe.stem}: skipped, {str(exc).splitlines()[0]}", file=sys.stderr)
                continue
            recipes.append(recipe)
    return list(dict.fromkeys(recipes))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--recipes", nargs="+", type=Path, default=[REPO / r for r in RECIPES])
    parser.add_argument("--zoo", action="store_true", help="add every zoo recipe")
    simulated = [c for c in preset_names() if load_chip(c).backend == SIMULATED]  # npubuild's compiler
    parser.add_argument("--chips", nargs="+", default=["npu-16m"], choices=simulated)
    parser.add_argument("--baseline-tree", type=Path,
                        help="another checkout whose compiler plans the same quantized graphs")
    parser.add_argument("-j", "--jobs", type=int, default=1,
                        help="processes building the cells up to quantize")
    parser.add_argument("--no-sim", action="store_true",
                        help="skip the separate simulator timing (the stage's proofs still run)")
    parser.add_argument("--reuse-quantize", action="store_true",
                        help="use a cell's quantize folder an earlier run left in --build-dir")
    parser.add_argument("--plan-only", action="store_true",
                        help="with --baseline-tree: only the group search of both compilers, "
                             "timed and compared plan for plan (no compile stage, simulator)")
    parser.add_argument("--plan-runs", type=int, default=3,
                        help="interleaved runs of each compiler with --plan-only (median)")
    parser.add_argument("--json", type=Path)
    add_build_options(parser)
    args = parser.parse_args()
    if args.plan_only and not args.baseline_tree:
        parser.error("--plan-only compares against --baseline-tree")
    recipes = recipe_list(args)
    cells = [(recipe, chip) for recipe in recipes for chip in args.chips]
    with build_roots(args) as (root, cache):
        with ProcessPoolExecutor(max(args.jobs, 1)) as pool:
            errors = list(pool.map(quantize_cell, *zip(*cells), [root] * len(cells),
                                   [cache] * len(cells), [args.reuse_quantize] * len(cells)))
        rows = []
        for (recipe, chip), error in zip(cells, errors):
            cell = plan_cell if args.plan_only else compile_cell
            rows.append(cell(recipe, chip, root, cache, error, args))
            print(f"{recipe.stem} {chip}: {rows[-1].get('error', 'done')}", file=sys.stderr)
    if args.plan_only:
        print_plan_times(rows)
        print_errors(rows)
        if args.json:
            args.json.write_text(json.dumps(rows, indent=2) + "\n")
        return 0 if all(r.get("same_plans", True) for r in rows) else 1
    print_table(rows)
    if args.baseline_tree:
        print()
        print_comparison(rows)
    print_errors(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["bit_exact"] and r["stage_bit_exact"] for r in rows
                    if "error" not in r) else 1


def compile_cell(recipe: Path, chip: str, root: Path, cache: Path, error: str, args) -> dict:
    """One table row: the compile stage timed, the simulator (unless ``--no-sim``), the
    baseline tree's plan; a cell that failed is a row with its error."""
    if error:
        return {"recipe": recipe.stem, "chip": chip, "error": error}
    try:
        build_dir, report, stage_s = build_cell(recipe, chip, root, cache)
    except Exception as exc:  # noqa: BLE001 - a failed compile is a row for the table
        return {"recipe": recipe.stem, "chip": chip,
                "error": f"compile: {type(exc).__name__}: {str(exc).splitlines()[0]}"}
    if "graphs" not in report["estimate"]:  # no NPU graph
        return {"recipe": recipe.stem, "chip": chip, "error": "no NPU graph"}
    sim = {"bit_exact": True} if args.no_sim else time_simulator(build_dir, args.runs)
    found = row(recipe, chip, report, stage_s, sim)
    if args.baseline_tree:  # both compilers the same way, each in its own interpreter
        found["ours"] = plan_with(REPO, recipe, chip, build_dir)
        found["base"] = plan_with(args.baseline_tree, recipe, chip, build_dir)
    return found


if __name__ == "__main__":
    sys.exit(main())
