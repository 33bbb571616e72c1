"""Real chips: model x chip -> the vendor artifact and how the deployed model compares.

Each cell is one build (`npubuild run R --target CHIP`, a matrix build of one: the chip-free
stages shared across chips through the content cache) through the chip's vendor toolchain, and
one row: artifact bytes, NPU/CPU ops as the vendor placed them, output cosine over all verify
samples / on the worst sample and per `verify.slices`, the vendor runtime's seconds per image
(RKNN's simulator, TPU-MLIR's cmodel, TFLite's reference kernels, timed on compile's proof
inputs), build seconds (every stage, the run that built it), and the vendor's figures (cycles,
inferences/s).

    python3 benchmarks/real_targets.py [--models yolov8n mobilenetv2 ...] [--chips rk3588 ...]
                                       [--json out.json] [--from-json a.json b.json ...]

Models: `recipes/real/<model>-<chip>.yaml` where it exists (YOLOv8n with two outputs, the
Keras MobileNetV2), else the zoo recipe `recipes/zoo/<model>.yaml` built for the chip.
Toolchains install on first use (`npubuild toolchain install ...` beforehand keeps that out of
the build seconds).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CHIPS = ("rk3588", "ethos-u55-256", "bm1684x")
MODELS = ("yolov8n", "mobilenetv2", "ppocr-cls", "light-squeezenet", "light-shufflenet",
          "face-detection", "light-resnet50")
ZOO_NAMES = {"yolov8n": "yolov8n-320"}


def recipe_for(model: str, chip: str) -> tuple[Path, bool]:
    """(recipe, whether it is a zoo recipe to build with --target)."""
    real = REPO / "recipes" / "real" / f"{model}-{chip}.yaml"
    if real.is_file():
        return real, False
    return REPO / "recipes" / "zoo" / f"{ZOO_NAMES.get(model, model)}.yaml", True


def build(model: str, chip: str, root: Path) -> dict:
    recipe, zoo = recipe_for(model, chip)
    cmd = [sys.executable, "-m", "npubuild", "run", str(recipe), "--build-dir", str(root / "build"),
           "--cache", str(root / "cache"), "-q"] + (["--target", chip] if zoo else [])
    start = time.perf_counter()
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO)
    wall = time.perf_counter() - start
    name = _recipe_name(recipe)
    folder = root / "build" / (f"{name}@{chip}" if zoo else name)
    report = json.loads((folder / "report.json").read_text()) if (folder / "report.json").is_file() else {}
    error = next((line for line in done.stderr.splitlines() if line.startswith("error:")), "")
    error = error or str(report.get("error") or "")  # a matrix cell's error is in its report
    return row(model, chip, report, wall, error)


def _recipe_name(recipe: Path) -> str:
    for line in recipe.read_text().splitlines():
        if line.startswith("name:"):
            return line.split(":", 1)[1].strip()
    return recipe.stem


def row(model: str, chip: str, report: dict, wall: float, error: str) -> dict:
    vendor = report.get("vendor") or {}
    accuracy = report.get("accuracy") or {}
    outputs = accuracy.get("outputs") or {}
    stages = report.get("stages") or {}
    return {
        "model": model, "chip": chip, "passed": (report.get("verify") or {}).get("passed"),
        "artifact_bytes": vendor.get("artifact_bytes"), "npu_ops": vendor.get("npu_ops"),
        "cpu_ops": vendor.get("cpu_ops"),
        "split_nodes": [(report.get("split") or {}).get("npu_nodes"),
                        (report.get("split") or {}).get("cpu_nodes")],
        "cosine": {n: [round(m["cosine"], 4), round(m.get("min_sample_cosine") or m["cosine"], 4)]
                   for n, m in outputs.items()},
        "slices": {n: [round(m["cosine"], 4), round(m.get("min_sample_cosine") or m["cosine"], 4)]
                   for n, m in (accuracy.get("slices") or {}).items()},
        # the vendor's runtime alone, per image, on compile's proof inputs (deployed artifacts)
        "seconds_per_image": vendor.get("seconds_per_run"),
        "build_seconds": round(sum(s.get("built_seconds") or 0 for s in stages.values()), 1),
        "wall_seconds": round(wall, 1), "cycles": vendor.get("cycles"),
        "inferences_per_second": vendor.get("inferences_per_second"),
        "quantizers": _quantizers(report), "error": (error.splitlines() or [""])[0][:160]}


def _quantizers(report: dict) -> dict:
    """Per quantizer, the worst NPU-output cosine of its artifact against the float submodel."""
    out: dict[str, float] = {}
    for graph in ((report.get("compile") or {}).get("graphs") or {}).values():
        for q, info in (graph.get("quantizers") or {}).items():
            for m in (info.get("proof") or {}).values():
                out[q] = round(min(out.get(q, 1.0), m["cosine"]), 4)
    return out


def _pair(v: list | None) -> str:
    return f"{v[0]:.4f} / {v[1]:.4f}" if v else "-"


def table(rows: list[dict]) -> str:
    head = ("| model | chip | verify | artifact bytes | ops NPU/CPU (vendor) | nodes NPU/CPU (split) "
            "| cosine all / worst | slices all / worst | vendor vs npubuild quantizer (worst NPU "
            "output) | s per image | build s | vendor cycles | vendor inf/s | error |")
    lines = [head, "|" + "---|" * 14]
    for r in rows:
        cos = "; ".join(f"{n[-24:]}: {_pair(v)}" for n, v in r["cosine"].items()) or "-"
        sl = "; ".join(f"{n}: {_pair(v)}" for n, v in r["slices"].items()) or "-"
        q = " / ".join(f"{r['quantizers'].get(k, '-')}" for k in ("vendor", "npubuild"))
        fmt = lambda v: "-" if v is None else f"{v:,}" if isinstance(v, int) else str(v)
        lines.append(f"| {r['model']} | {r['chip']} | {'pass' if r['passed'] else 'fail' if r['passed'] is False else '-'} "
                     f"| {fmt(r['artifact_bytes'])} | {fmt(r['npu_ops'])}/{fmt(r['cpu_ops'])} "
                     f"| {fmt(r['split_nodes'][0])}/{fmt(r['split_nodes'][1])} | {cos} | {sl} | {q} "
                     f"| {fmt(r['seconds_per_image'])}{'†' if r.get('seconds_kind') == 'verify' else ''} "
                     f"| {fmt(r['build_seconds'])} "
                     f"| {fmt(r['cycles'])} | {fmt(r['inferences_per_second'])} "
                     f"| {(r['error'].splitlines() or [''])[0]} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="*", default=list(MODELS))
    p.add_argument("--chips", nargs="*", default=list(CHIPS))
    p.add_argument("--root", type=Path, default=REPO / "build" / "real_targets")
    p.add_argument("--json", type=Path)
    p.add_argument("--from-json", type=Path, nargs="*")
    args = p.parse_args(argv)
    if args.from_json:  # a later file's cell replaces an earlier one's (a re-run)
        cells = {(r["model"], r["chip"]): r for path in args.from_json
                 for r in json.loads(path.read_text())}
        order = {m: i for i, m in enumerate(MODELS)}
        rows = sorted(cells.values(), key=lambda r: (order.get(r["model"], 99), r["model"], r["chip"]))
    else:
        os.makedirs(args.root, exist_ok=True)
        rows = []
        for model in args.models:
            for chip in args.chips:
                rows.append(build(model, chip, args.root))
                print(f"{model} on {chip}: {rows[-1]['wall_seconds']} s "
                      f"{'pass' if rows[-1]['passed'] else rows[-1]['error'] or 'fail'}",
                      file=sys.stderr, flush=True)
                if args.json:
                    args.json.write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0 if all(r["passed"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
