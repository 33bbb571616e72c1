"""The precision search's cost: each zoo recipe as a user writes it (benchmarks/zoo.py's
``as_written``), its quantize stage built twice in the same run — with the search off
(``quantization.auto: false``: int8 as calibrated, the judge only) and on (the default) — and
the ratio of the two times. A recipe whose int8 already passes verify pays only the judge;
one that fails pays the search (fake-quant scoring) and its confirmation on the integer
reference. Also printed: whether int8 and the search's choice pass verify's thresholds, the
tensors kept out of int8 and the choices scored.

    python3 benchmarks/search.py [--models GLOB ...] [--chip npu-16m] [--json out.json]

The stages before quantize come from the cache (built once, not timed); each quantize is
timed as the stage's own ``seconds`` in report.json. Goal (issue 23): search / plain <= 3.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

GOAL = 3.0


def variant(written: Path, out_dir: Path, search: bool) -> Path:
    """The as-written recipe with the search on or off, under its own name."""
    import yaml

    data = yaml.safe_load(written.read_text())
    if not search:
        data["quantization"]["auto"] = False
    data["name"] = f"{data['name']}.{'search' if search else 'plain'}"
    out = out_dir / f"{written.stem}.{'search' if search else 'plain'}.yaml"
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def quantize_seconds(recipe: Path, chip: str, build_root: Path, cache: Path | None) -> dict:
    """Build up to quantize (the earlier stages restored from the cache) and read the
    quantize stage's own time and figures."""
    from npubuild import api
    from npubuild.errors import NpubuildError
    from npubuild.recipe import load_recipe

    loaded = load_recipe(recipe).for_target(chip)
    session = api.session_for(loaded, build_root=build_root, cache=cache)
    started = time.perf_counter()
    try:
        report = api.build(session, "quantize")
        error = ""
    except NpubuildError as exc:
        report, error = (session.report(api.stage_list("quantize")) if session.results else {},
                         str(exc).splitlines()[0])
    stage = (report.get("stages") or {}).get("quantize") or {}
    q = report.get("quantization") or {}
    search = q.get("search") or {}
    return {"seconds": stage.get("built_seconds") or stage.get("seconds"),
            "status": stage.get("status"), "wall": round(time.perf_counter() - started, 2),
            "int8_passes": (q.get("int8_verdict") or {}).get("passed"),
            "passes": search.get("passed", (q.get("int8_verdict") or {}).get("passed")),
            "chosen": len(search.get("chosen") or []),
            "kinds": sorted({c["precision"] for c in search.get("chosen") or []}),
            "evaluations": search.get("evaluations"), "error": error}


def measure(recipe: Path, chip: str, work: Path, cache: Path | None) -> dict:
    from zoo import as_written

    written = as_written(recipe, work / "recipes")
    build_root = work / "build"
    # the chip-independent and split stages once, untimed
    quantize_seconds(variant(written, work / "recipes", False), chip, build_root, cache)
    row = {"model": recipe.stem}
    for name, search in (("plain", False), ("search", True)):
        row[name] = quantize_seconds(variant(written, work / "recipes", search), chip,
                                     build_root, cache)
    plain, searched = row["plain"]["seconds"], row["search"]["seconds"]
    row["ratio"] = round(searched / plain, 2) if plain and searched else None
    return row


def markdown(rows: list[dict]) -> str:
    head = ("| model | plain quantize s | with search s | ratio | int8 passes | search passes | "
            "tensors out of int8 | choices scored |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        p, s = r["plain"], r["search"]
        kinds = f" ({'/'.join(s['kinds'])})" if s["kinds"] else ""
        lines.append(f"| {r['model']} | {p['seconds'] or '-'} | {s['seconds'] or '-'} | "
                     f"{r['ratio'] if r['ratio'] is not None else '-'} | "
                     f"{_yes(p['int8_passes'])} | {_yes(s['passes'])} | {s['chosen']}{kinds} | "
                     f"{s['evaluations'] if s['evaluations'] is not None else '-'} |")
    return "\n".join(lines)


def _yes(value) -> str:
    return {True: "yes", False: "no", None: "-"}[value]


def summary(rows: list[dict]) -> str:
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    over = [r["model"] for r in rows if r["ratio"] is not None and r["ratio"] > GOAL]
    text = (f"{len(rows)} models; search / plain: median {sorted(ratios)[len(ratios) // 2]:.2f}, "
            f"max {max(ratios):.2f}" if ratios else f"{len(rows)} models; no ratio measured")
    return text + (f"; over {GOAL:g}x: {', '.join(over)}" if over else f"; all within {GOAL:g}x")


def main(argv: list[str]) -> int:
    from zoo import run_generators, zoo_recipes

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", metavar="GLOB")
    p.add_argument("--chip", default="npu-16m")
    p.add_argument("--work", type=Path, default=None, help="recipes and builds (default: a "
                   "temporary directory)")
    p.add_argument("--cache", type=Path, default=None)
    p.add_argument("--no-generate", action="store_true")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if not args.no_generate:
        run_generators()
    work = args.work or Path(tempfile.mkdtemp(prefix="npubuild-search-"))
    (work / "recipes").mkdir(parents=True, exist_ok=True)
    rows = []
    for recipe in zoo_recipes(args.models):
        rows.append(measure(recipe, args.chip, work, args.cache))
        print(markdown(rows[-1:]).splitlines()[-1], file=sys.stderr)
    print(markdown(rows))
    print(f"\n{summary(rows)}")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
