"""The zoo conformance table: every recipe in recipes/zoo/ (and recipes/zoo/keras/ when present)
built on every preset chip (ARCHITECTURE §8), twice: as a user writes it from the README
(``as_written``: the model, its data, the chip, `min_cosine: 0.99` and its task check, no
per-model quantization setting) and as tuned (the recipe file as it is).

First the model-generation scripts run (scripts/make_zoo_models.py, and scripts/make_keras_zoo.py
when it exists), then each recipe is built as a matrix build (``build/<name>@<chip>/``: the
chip-independent stages once, restored from the content cache for every chip) and one table is
printed: model x chip -> the last stage reached, NPU/CPU segments and nodes, output cosine over
all verify samples / on the worst sample, simulator bit-exact, GMEM ratio (grouped / one layer
per group), fps, seconds per stage (the run that built it, from report.json's ``built_seconds``:
also when this run found it cached; "-" when it was restored from a cache that another run
filled), and the first line of the error if any.

fps is the build's own estimate, end to end: the NPU segments' cycles at the chip's clock plus
the CPU segments measured with ONNX Runtime on this machine (`npubuild.runtime.cpu_time`).

    python3 benchmarks/zoo.py [--models GLOB ...] [--chips npu-16m ...] [-j 2] [--json out.json]
    python3 benchmarks/zoo.py --as written ...                # only the as-written copies
    python3 benchmarks/zoo.py --scheduler local:2 ...       # every cell a Dask task
    python3 benchmarks/zoo.py --from-json a.json b.json     # one table from earlier runs

Exit code 0 when every tuned cell on npu-16m passed verify and no cell anywhere failed with an
unexplained error ("likely a bug", "internal error" or an uncaught exception); 1 otherwise.
The as-written cells are the measure of how npubuild does on a model it has never seen.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import subprocess
import sys
import time
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

ZOO = REPO / "recipes" / "zoo"
GENERATORS = (REPO / "scripts" / "make_zoo_models.py", REPO / "scripts" / "make_keras_zoo.py")
CHIPS = ("npu-16m", "npu-strict", "npu-tiny")
MUST_PASS = "npu-16m"
STAGE_ABBREV = {"import": "imp", "surgery": "sur", "fusion": "fus", "split": "spl",
                "quantize": "qnt", "compile": "cmp", "verify": "ver"}
UNEXPLAINED = ("likely a bug", "internal error", "Traceback", "uncaught ")


def zoo_recipes(patterns: list[str] | None) -> list[Path]:
    """recipes/zoo/*.yaml then recipes/zoo/keras/*.yaml, filtered by name globs."""
    found = sorted(ZOO.glob("*.yaml")) + sorted((ZOO / "keras").glob("*.yaml"))
    if not patterns:
        return found
    return [p for p in found if any(fnmatch.fnmatch(p.stem, pat) for pat in patterns)]


# What a user writes in `quantization:` from the README: the calibration data, nothing tuned.
WRITTEN_QUANTIZATION = ("data", "samples")
WRITTEN_MIN_COSINE = 0.99
WRITTEN_SUFFIX = ".written"


def as_written(recipe: Path, out_dir: Path) -> Path:
    """A copy of ``recipe`` as a user would write it from the README, in ``out_dir``: the
    model, its inputs, surgery, fusion, split, the chip, calibration and verify data, verify's
    task check, and `min_cosine: 0.99`; no per-model quantization setting (scheme,
    granularity, method, overrides, auto, int16_where_underflows, compare_samples ...) and no
    lowered bar (`min_sample_cosine`). Relative paths become absolute, so the copy reads the
    same files; its name gets ``.written`` (its own build directory)."""
    import yaml

    data = yaml.safe_load(recipe.read_text())
    base = recipe.resolve().parent
    calibration = (data.get("quantization") or {}).get("calibration") or {}
    data["quantization"] = {"calibration": {k: calibration[k] for k in WRITTEN_QUANTIZATION
                                            if k in calibration}}
    verify = data.setdefault("verify", {})
    verify["min_cosine"] = WRITTEN_MIN_COSINE
    verify.pop("min_sample_cosine", None)
    data["name"] = f"{data['name']}{WRITTEN_SUFFIX}"
    model = data["model"]
    model["path"] = _absolute(model["path"], base)
    for spec in model.get("inputs") or []:
        if (spec.get("proof") or {}).get("data"):
            spec["proof"]["data"] = _absolute(spec["proof"]["data"], base)
    for section in (data["quantization"]["calibration"], verify):
        if section.get("data"):
            section["data"] = _absolute(section["data"], base)
    for key in ("target",):
        if str(data.get(key, "")).endswith((".yaml", ".yml")):
            data[key] = _absolute(data[key], base)
    out = Path(out_dir) / f"{recipe.stem}{WRITTEN_SUFFIX}.yaml"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(f"# derived from {recipe.name} by benchmarks/zoo.py (as a user writes it)\n"
                   + yaml.safe_dump(data, sort_keys=False))
    return out


def _absolute(spec, base: Path):
    """A recipe path (or list of them) made absolute; ``pkg:`` paths stay as they are."""
    if isinstance(spec, list):
        return [_absolute(s, base) for s in spec]
    if spec.startswith("pkg:") or Path(spec).is_absolute():
        return spec
    return str(base / spec)


def run_generators() -> None:
    for script in GENERATORS:
        if script.exists():
            started = time.perf_counter()
            subprocess.run([sys.executable, str(script)], check=True, cwd=REPO,
                           env={**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"},
                           stdout=subprocess.DEVNULL)
            print(f"# {script.relative_to(REPO)}: {time.perf_counter() - started:.1f} s",
                  file=sys.stderr)


# ---- one recipe on every chip (in a worker process) ----------------------------------------

def build_recipe(recipe: str, chips: list[str], build_root: str | None,
                 cache: str | None) -> list[dict]:
    """Build ``recipe`` for each chip; every outcome (an uncaught exception included) is data."""
    failed = build_shared(recipe, chips, build_root, cache)
    return failed or [zoo_cell(recipe, chip, build_root, cache) for chip in chips]


def build_shared(recipe: str, chips: list[str], build_root: str | None,
                 cache: str | None) -> list[dict] | None:
    """The chip-independent stages, once (the cells restore them from the content cache);
    the cells when the recipe cannot even load or npubuild crashed, else None."""
    from npubuild import api
    from npubuild.errors import NpubuildError
    from npubuild.matrix import shared_prefix
    from npubuild.recipe import load_recipe

    try:
        loaded = load_recipe(recipe)
    except NpubuildError as exc:
        return [{"recipe": recipe, "target": chip, "ok": False, "exit_code": exc.exit_code,
                 "report": {}, "error": str(exc)} for chip in chips]
    try:
        api.build(api.session_for(loaded.for_target(chips[0]), build_root=_path(build_root),
                                  cache=_path(cache)), shared_prefix(None))
    except NpubuildError:
        pass  # each cell meets the same error and records it with its report
    except Exception as exc:  # noqa: BLE001 - the table shows what npubuild did not explain
        return [_crash(recipe, chip, exc) for chip in chips]
    return None


def zoo_cell(recipe: str, chip: str, build_root: str | None, cache: str | None,
             shared_failed: list[dict] | None = None) -> dict:
    """One cell (model x chip): its build and the seconds each stage took to build."""
    from npubuild.matrix import build_cell

    if shared_failed:
        return next(c for c in shared_failed if c["target"] == chip)
    started = time.perf_counter()
    try:
        cell = build_cell(recipe, {"target": chip}, None, _path(build_root), _path(cache))
    except Exception as exc:  # noqa: BLE001
        cell = _crash(recipe, chip, exc)
    cell["recipe"], cell["wall_seconds"] = recipe, round(time.perf_counter() - started, 2)
    cell["build_seconds"] = _build_seconds(cell.get("report") or {})
    return cell


def cells_on_dask(scheduler: str, jobs: list[tuple]) -> list[dict]:
    """Every cell as a Dask task (``--scheduler``), after its recipe's shared stages (a task
    the cells depend on, so no cell waits for another recipe); cells in table order. Workers
    share artifacts through the content cache (``$NPUBUILD_REMOTE`` for other machines)."""
    from npubuild.distributed import dask_client

    with dask_client(scheduler) as client:
        cells = []
        for recipe, chips, build_root, cache in jobs:
            shared = client.submit(build_shared, recipe, chips, build_root, cache, pure=False)
            cells += [client.submit(zoo_cell, recipe, chip, build_root, cache, shared, pure=False)
                      for chip in chips]
        return client.gather(cells)


def _path(text: str | None) -> Path | None:
    return Path(text) if text else None


def _crash(recipe: str, chip: str, exc: Exception) -> dict:
    where = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    at = f" at {Path(where.filename).name}:{where.lineno}" if where else ""
    return {"recipe": recipe, "target": chip, "ok": False, "exit_code": None, "report": {},
            "error": f"uncaught {type(exc).__name__}{at}: {exc}"}


def _build_seconds(report: dict) -> dict[str, float]:
    """Seconds each stage took in the run that built it (report.json's ``built_seconds``)."""
    stages = report.get("stages") or {}
    return {name: info["built_seconds"] for name, info in stages.items()
            if isinstance(info.get("built_seconds"), (int, float))}


# ---- the table -----------------------------------------------------------------------------

def row(cell: dict) -> dict:
    """One table row from a cell: figures from its report.json, None where a stage did not run."""
    from npubuild.stages import PIPELINE

    report = cell.get("report") or {}
    stages = report.get("stages") or {}
    done = [s.name for s in PIPELINE
            if (stages.get(s.name) or {}).get("status") in ("built", "restored", "current", "cached")]
    split, est = report.get("split") or {}, report.get("estimate") or {}
    outputs = (report.get("accuracy") or {}).get("outputs") or {}
    cos = [m["cosine"] for m in outputs.values() if m.get("cosine") is not None]
    worst = [m["min_sample_cosine"] for m in outputs.values()
             if m.get("min_sample_cosine") is not None]
    grouped, per_layer = est.get("gmem_bytes"), est.get("gmem_bytes_no_grouping")
    error = cell.get("error") or ""
    stem = Path(cell["recipe"]).stem
    written = stem.endswith(WRITTEN_SUFFIX)
    return {
        "model": stem.removesuffix(WRITTEN_SUFFIX), "as": "written" if written else "tuned",
        "chip": cell["target"],
        "reached": done[-1] if done else "-", "passed": bool(cell.get("ok")),
        "segments": [split.get("npu_segments"), split.get("cpu_segments")],
        "nodes": [split.get("npu_nodes"), split.get("cpu_nodes")],
        "cosine": min(cos) if cos else None, "worst_cosine": min(worst) if worst else None,
        "bit_exact": (report.get("simulator") or {}).get("bit_exact"),
        "gmem_ratio": grouped / per_layer if grouped and per_layer else None,
        "fps": est.get("fps"), "npu_fps": est.get("npu_fps"), "cpu_seconds": est.get("cpu_seconds"),
        "seconds": {s: t for s, t in (cell.get("build_seconds") or {}).items()
                    if s in STAGE_ABBREV and s in done},
        "wall_seconds": cell.get("wall_seconds"),
        "error": error.splitlines()[0] if error else "",
        "unexplained": any(u in error for u in UNEXPLAINED),
    }


def _pair(values: list) -> str:
    return "-" if values[0] is None else f"{values[0]}/{values[1]}"


def _num(value, fmt: str) -> str:
    return "-" if value is None else format(value, fmt)


def markdown(rows: list[dict]) -> str:
    head = ("| model | as | chip | reached | seg NPU/CPU | nodes NPU/CPU | cosine all / worst | "
            "bit-exact | GMEM ratio | fps | s per stage (imp sur fus spl qnt cmp ver) | error |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        cos = "-" if r["cosine"] is None else f"{r['cosine']:.4f} / {_num(r['worst_cosine'], '.4f')}"
        secs = " ".join(_num(r["seconds"].get(s), ".1f") for s in STAGE_ABBREV)
        exact = {True: "yes", False: "NO", None: "-"}[r["bit_exact"]]
        error = r["error"].replace("|", "\\|")
        error = error if len(error) <= 160 else error[:157] + "..."
        lines.append(f"| {r['model']} | {r.get('as', 'tuned')} | {r['chip']} | {r['reached']} | "
                     f"{_pair(r['segments'])} | "
                     f"{_pair(r['nodes'])} | {cos} | {exact} | {_num(r['gmem_ratio'], '.3f')} | "
                     f"{_num(r['fps'], ',.0f')} | {secs} | {error} |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    must = [r for r in rows if r["chip"] == MUST_PASS and r.get("as", "tuned") == "tuned"]
    cells = list(dict.fromkeys((r.get("as", "tuned"), r["chip"]) for r in rows))
    unexplained = [f"{r['model']}@{r['chip']}" for r in rows if r["unexplained"]]
    parts = [f"{kind} on {chip}: {sum(r['passed'] for r in rows if (r.get('as', 'tuned'), r['chip']) == (kind, chip))}"
             f"/{sum((r.get('as', 'tuned'), r['chip']) == (kind, chip) for r in rows)} pass verify"
             for kind, chip in cells]
    text = f"{len(dict.fromkeys(r['model'] for r in rows))} models; " + "; ".join(parts)
    if unexplained:
        text += f"; unexplained errors: {', '.join(unexplained)}"
    return text + ("" if not must or all(r["passed"] for r in must) else
                   f"; FAILING on {MUST_PASS}: "
                   + ", ".join(r["model"] for r in must if not r["passed"]))


# ---- main ----------------------------------------------------------------------------------

def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", metavar="GLOB", help="recipe names (file stems) to "
                   "build, globs allowed (default: the whole zoo)")
    p.add_argument("--chips", nargs="+", default=list(CHIPS), help="chips (default: the presets)")
    p.add_argument("-j", "--jobs", type=int, default=1, help="recipes built in parallel")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run the cells as Dask tasks: local:N or tcp://HOST:PORT "
                        "(default: $NPUBUILD_SCHEDULER; none: worker processes, -j)")
    p.add_argument("--build-dir", type=Path, default=REPO / "build")
    p.add_argument("--cache", type=Path, default=None, help="content cache (default: npubuild's)")
    p.add_argument("--no-generate", action="store_true",
                   help="skip the model-generation scripts (their outputs must exist)")
    p.add_argument("--json", type=Path, metavar="FILE", help="also write every row as JSON")
    p.add_argument("--as", dest="kinds", choices=("both", "written", "tuned"), default="both",
                   help="build each recipe as a user writes it, as tuned, or both (default)")
    p.add_argument("--from-build", action="store_true",
                   help="build nothing: one row per cell from the report.json and manifests "
                        "already in --build-dir (cells never built are left out; no CPU timing)")
    p.add_argument("--from-json", type=Path, nargs="+", metavar="FILE",
                   help="build nothing: print one table from earlier runs' --json files (a "
                        "later file's row replaces an earlier one for the same model and chip)")
    return p.parse_args(argv)


def recipe_list(args: argparse.Namespace) -> list[Path]:
    """The zoo recipes the arguments select: their as-written copies (written into
    ``<build dir>/as-written/``), then the recipes as tuned, as ``--as`` asks."""
    recipes = zoo_recipes(args.models)
    written = ([as_written(r, args.build_dir / "as-written") for r in recipes]
               if args.kinds != "tuned" else [])
    return [*written, *(recipes if args.kinds != "written" else [])]


def rows_from_build(recipes: list[Path], chips: list[str], build_root: Path) -> list[dict]:
    from npubuild import api
    from npubuild.engine.keys import read_manifest
    from npubuild.recipe import load_recipe

    rows = []
    for recipe in recipes:
        loaded = load_recipe(recipe)
        for chip in chips:
            session = api.session_for(loaded.for_target(chip), build_root=build_root)
            report = read_manifest(session.paths.report)
            if not report:
                continue
            verdict = report.get("verify") or {}
            error = report.get("error") or "; ".join(verdict.get("failures") or [])
            rows.append(row({"recipe": str(recipe), "target": chip, "report": report,
                             "ok": not error and verdict.get("passed") is True,
                             "error": error, "build_seconds": _build_seconds(report)}))
    return rows


def rows_from_json(files: list[Path]) -> list[dict]:
    merged: dict[tuple[str, str], dict] = {}
    for file in files:
        for r in json.loads(file.read_text())["rows"]:
            merged[(r["model"], r.get("as", "tuned"), r["chip"])] = r
    return [merged[k] for k in sorted(merged)]


def main(argv: list[str]) -> int:
    args = parse_args(argv)
    if args.from_json or args.from_build:
        rows = (rows_from_json(args.from_json) if args.from_json else
                rows_from_build(recipe_list(args), args.chips, args.build_dir))
        print(markdown(rows))
        print(f"\n{summary(rows)}")
        if args.json:
            args.json.write_text(json.dumps({"rows": rows}, indent=2, default=str))
        return 0
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if not args.no_generate:
        run_generators()
    recipes = recipe_list(args)
    if not recipes:
        print(f"no zoo recipe matches {args.models}", file=sys.stderr)
        return 2
    jobs = [(str(r), args.chips, str(args.build_dir), str(args.cache) if args.cache else None)
            for r in recipes]
    started = time.perf_counter()
    from npubuild.distributed import resolve_scheduler

    scheduler = resolve_scheduler(args.scheduler)
    if scheduler:
        cells = cells_on_dask(scheduler, jobs)
    else:
        # One fresh worker per recipe: TensorFlow, ONNX Runtime sessions and a crash stay contained.
        with ProcessPoolExecutor(max_workers=max(1, args.jobs), max_tasks_per_child=1) as pool:
            cells = [c for result in pool.map(build_recipe, *zip(*jobs)) for c in result]
    rows = [row(c) for c in cells]
    print(markdown(rows))
    print(f"\n{summary(rows)}; {time.perf_counter() - started:.0f} s")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows, "cells": cells}, indent=2, default=str))
    bad = any(r["unexplained"] for r in rows) or any(
        not r["passed"] for r in rows if r["chip"] == MUST_PASS and r["as"] == "tuned")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
