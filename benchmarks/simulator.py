"""The deployed pipeline (NPU submodels in the bit-exact simulator, CPU submodels in ONNX
Runtime) against ONNX Runtime running the float model, one inference each, interleaved.

Each recipe is built up to ``compile`` (from the content cache when it can; the compile stage
itself proves the simulator bit-identical to the integer reference on every tensor crossing
GMEM). Then, on the first verify image, ``--runs`` rounds of: the float original
(``import/model.onnx``) in ONNX Runtime, then the deployed pipeline (`npubuild.runtime.Runner`
with the simulator as its NPU backend, as verify runs it). The table gives the medians of wall
time and of CPU time (this process, every thread) and their ratios; CPU time is the steadier
figure on a shared machine. The simulator also reports how many program steps one run executes.

    python3 benchmarks/simulator.py [--recipes R.yaml ...] [--runs 7] [--json out.json]

Goal (issue 23): the deployed pipeline within 5x of ONNX Runtime float.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.builds import add_build_options, build_roots

RECIPES = ("recipes/yolov8.yaml", "recipes/zoo/yolov8n-640.yaml",
           "recipes/zoo/light-resnet50.yaml", "recipes/zoo/ppocr-v4-det.yaml")


def build(recipe: Path, root: Path, cache: Path):
    from npubuild import api
    from npubuild.recipe import load_recipe

    loaded = load_recipe(recipe)
    session = api.session_for(loaded, build_root=root, cache=cache)
    report = api.build(session, "compile")
    return session.paths.root, report, loaded


def first_sample(loaded, build_dir: Path) -> dict:
    from npubuild.quant import data, onnx_inputs
    from npubuild.quant.pipeline import SplitPipeline
    from npubuild.stages.files import verify_files

    pipeline = SplitPipeline(build_dir / "split")
    inputs = onnx_inputs.input_infos(pipeline, loaded.recipe.model.inputs)
    return next(data.load_samples(verify_files(loaded), inputs, 1))


def clocked(fn) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


def measure(recipe: Path, root: Path, cache: Path, runs: int) -> dict:
    from npubuild import onnx_io
    from npubuild.runtime import Runner
    from npubuild.runtime.simulator import simulator_backend

    build_dir, report, loaded = build(recipe, root, cache)
    feeds = first_sample(loaded, build_dir)
    session = onnx_io.session(build_dir / "import" / "model.onnx")
    deployed = Runner(build_dir / "split", backends={"npu": simulator_backend(build_dir)})
    float_run = lambda: session.run(None, feeds)
    deployed_run = lambda: deployed.run(feeds)
    float_run(), deployed_run()  # warm: sessions, simulators, first-touch of LMEM pages
    floats, sims = [], []
    for _ in range(runs):
        floats.append(clocked(float_run))
        sims.append(clocked(deployed_run))
    med = lambda xs, i: statistics.median(x[i] for x in xs)
    graphs = report["compile"]["graphs"]
    return {"recipe": str(recipe.relative_to(REPO)) if recipe.is_relative_to(REPO) else str(recipe),
            "npu_graphs": len(graphs), "groups": sum(g["groups"] for g in graphs.values()),
            "bit_exact": report["simulator"]["bit_exact"],
            "steps_per_run": sum(g["steps_per_run"] for g in report["simulator"]["graphs"].values()),
            "float_wall": med(floats, 0), "float_cpu": med(floats, 1),
            "deployed_wall": med(sims, 0), "deployed_cpu": med(sims, 1)}


def print_table(rows: list[dict], runs: int) -> None:
    print(f"one inference, median of {runs} interleaved runs (seconds)\n")
    head = ("recipe", "NPU graphs", "groups", "steps", "bit exact", "ORT float wall",
            "deployed wall", "ratio wall", "ORT float CPU", "deployed CPU", "ratio CPU")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        print(f"| {r['recipe']} | {r['npu_graphs']} | {r['groups']} | {r['steps_per_run']} | "
              f"{'yes' if r['bit_exact'] else 'NO'} | {r['float_wall']:.3f} | "
              f"{r['deployed_wall']:.3f} | {r['deployed_wall'] / r['float_wall']:.2f}x | "
              f"{r['float_cpu']:.3f} | {r['deployed_cpu']:.3f} | "
              f"{r['deployed_cpu'] / max(r['float_cpu'], 1e-9):.2f}x |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", type=Path, default=[REPO / r for r in RECIPES])
    parser.add_argument("--runs", type=int, default=7)
    add_build_options(parser)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with build_roots(args) as (root, cache):
        rows = []
        for recipe in args.recipes:
            rows.append(measure(recipe.resolve(), root, cache, args.runs))
            print(f"{recipe}: done", file=sys.stderr)
    print_table(rows, args.runs)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 0 if all(r["bit_exact"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
