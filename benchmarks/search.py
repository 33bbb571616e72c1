"""The precision search's cost: each zoo recipe as a user writes it (benchmarks/zoo.py's
``as_written``), its quantize stage built twice in the same run — with the search off
(``quantization.auto: false``: int8 as calibrated, the judge only) and on (the default) — and
the ratio of the two times. A recipe whose int8 already passes verify pays only the judge;
one that fails pays the search (fake-quant scoring) and its confirmation on the integer
reference. Also printed: whether int8 and the search's choice pass verify's thresholds, the
tensors kept out of int8 and the choices scored.

    python3 benchmarks/search.py [--models GLOB ...] [--chip npu-16m] [--json out.json]
                                 [--baseline-tree /path/to/other/checkout]

The stages before quantize come from the cache (built once, not timed); quantize is built
again every time (forced: a cached one would time a restore), each in its own process with
the tree's directory on PYTHONPATH, and timed as the stage's own ``seconds`` (wall) and the
process's CPU seconds while it built. ``--baseline-tree`` builds the same with another
checkout (e.g. main) too, interleaved (baseline plain, plain, baseline search, search), into
its own build folder, and adds its columns: a before/after in one run on a shared machine,
with whether both trees wrote the same quantize artifacts, plain and searched (every file but
the stage's manifest.json, which holds the code's hashes): a change meant to cost less moved
no choice. The summary gives the wall and CPU ratios and the load average.
Goal (issue 23): search / plain <= 3.

``--scheduler local:2`` (or a scheduler address) measures the fan-out instead: the quantize
stage with the search on, built in one process and with the scheduler, interleaved
(``--repeat`` rounds), each timed as the stage's own wall seconds and the precision search's
alone (the Dask cluster is started before the clock runs: an invocation starts it once, its
start-up is its own column); and whether the two wrote byte-identical quantize artifacts.
The machine's load average is printed with the table.

``--compiled`` also compiles both builds (untimed) and prints compile's slowdown, int8's
deployed fps over the searched build's (its NPU estimate plus its CPU parts timed with ONNX
Runtime), beside the search's own estimate of it (``quantization.auto.max_slowdown`` is
judged on the latter).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
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


MEASURE = """
import json, resource, sys
from pathlib import Path
sys.path.insert(0, {benchmarks!r})
import search
sys.path[:] = [{tree!r}] + [p for p in sys.path if p != str(search.REPO)]  # the tree's npubuild
import npubuild
assert npubuild.__file__.startswith({tree!r}), npubuild.__file__
from search import quantize_seconds
before = resource.getrusage(resource.RUSAGE_SELF)
row = quantize_seconds(Path({recipe!r}), {chip!r}, Path({build!r}), {cache}, {scheduler!r},
                       {compiled!r})
after = resource.getrusage(resource.RUSAGE_SELF)
row["cpu"] = round(after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime, 2)
print(json.dumps(row))
"""


def quantize_seconds(recipe: Path, chip: str, build_root: Path, cache: Path | None,
                     scheduler: str | None = None, compiled: bool = False) -> dict:
    """Build up to quantize, quantize again even when current or cached (the earlier stages
    restored from the cache), and read the quantize stage's own time and figures (with
    ``scheduler``: on Dask, the cluster started before the clock runs; with ``compiled``: then
    compile too, untimed, and read its estimate)."""
    from contextlib import ExitStack

    from npubuild import api
    from npubuild.distributed import dask_client, one_cluster
    from npubuild.errors import NpubuildError
    from npubuild.recipe import load_recipe
    from npubuild.stages import quantize as quantize_stage

    searched = {"seconds": 0.0}
    search = quantize_stage.precision_search

    def timed_search(*args, **kwargs):
        begun = time.perf_counter()
        try:
            return search(*args, **kwargs)
        finally:
            searched["seconds"] += time.perf_counter() - begun

    quantize_stage.precision_search = timed_search  # this process only: its one build
    loaded = load_recipe(recipe).for_target(chip)
    session = api.session_for(loaded, build_root=build_root, cache=cache, force=("quantize",),
                              scheduler=scheduler)
    with ExitStack() as stack:
        cluster = time.perf_counter()
        if scheduler:
            stack.enter_context(one_cluster(scheduler))
            stack.enter_context(dask_client(scheduler))
        cluster = time.perf_counter() - cluster
        started = time.perf_counter()
        try:
            report = api.build(session, "quantize")
            error = ""
        except NpubuildError as exc:
            report, error = (session.report(api.stage_list("quantize")) if session.results
                             else {}, str(exc).splitlines()[0])
    stage = (report.get("stages") or {}).get("quantize") or {}
    q = report.get("quantization") or {}
    search = q.get("search") or {}
    estimate = {}
    if compiled and not error:
        try:
            estimate = api.build(api.session_for(loaded, build_root=build_root, cache=cache),
                                 "compile").get("estimate") or {}
        except NpubuildError as exc:
            estimate = {"error": str(exc).splitlines()[0]}
    return {"seconds": stage.get("built_seconds") or stage.get("seconds"),
            "status": stage.get("status"), "wall": round(time.perf_counter() - started, 2),
            "int8_passes": (q.get("int8_verdict") or {}).get("passed"),
            "passes": search.get("passed", (q.get("int8_verdict") or {}).get("passed")),
            "chosen": len(search.get("chosen") or []),
            "kinds": sorted({c["precision"] for c in search.get("chosen") or []}),
            "evaluations": search.get("evaluations"), "error": error,
            "slowdown": (search.get("after") or {}).get("estimated_slowdown"),
            "refused": ((search.get("what_would_reach") or {}).get("needed") or {}).get("slowdown"),
            "search_seconds": round(searched["seconds"], 2), "cluster_seconds": round(cluster, 2),
            "compiled": {k: estimate.get(k) for k in ("fps", "npu_seconds", "cpu_seconds",
                                                      "error") if k in estimate},
            "digest": tree_digest(build_root / loaded.recipe.name / "quantize")}


def tree_digest(root: Path) -> str | None:
    """One hash over every file's name and bytes under ``root`` (None: no such folder) but
    the stage's ``manifest.json``, which holds the code's hashes (two trees differ there)."""
    import hashlib

    if not root.is_dir():
        return None
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.name != "manifest.json"):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def in_process_of(tree: Path, recipe: Path, chip: str, build_root: Path,
                  cache: Path | None, scheduler: str | None = None, compiled: bool = False) -> dict:
    """`quantize_seconds` in a process that imports npubuild from ``tree``."""
    code = MEASURE.format(benchmarks=str(REPO / "benchmarks"), tree=str(tree), recipe=str(recipe),
                          chip=chip, compiled=compiled,
                          build=str(build_root),
                          cache=f"Path({str(cache)!r})" if cache else "None", scheduler=scheduler)
    if scheduler:  # Dask spawns its workers, which re-import the main module: not from -c
        script = build_root.parent / "measure.py"
        script.write_text("if __name__ == '__main__':\n" + "".join(
            f"    {line}\n" for line in code.strip().splitlines()))
        command = [sys.executable, str(script)]
    else:
        command = [sys.executable, "-c", code]
    env = {**os.environ, "PYTHONPATH": str(tree), "TF_CPP_MIN_LOG_LEVEL": "3"}
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    if done.returncode:
        return {"seconds": None, "cpu": None, "passes": None, "int8_passes": None, "chosen": 0,
                "kinds": [], "evaluations": None,
                "error": (done.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(recipe: Path, chip: str, work: Path, cache: Path | None,
            baseline: Path | None = None, compiled: bool = False) -> dict:
    from zoo import as_written

    written = as_written(recipe, work / "recipes")
    trees = {"": REPO, **({"baseline ": baseline} if baseline else {})}
    recipes = {search: variant(written, work / "recipes", search) for search in (False, True)}
    # the chip-independent and split stages once per tree, untimed
    for tag, tree in trees.items():
        in_process_of(tree, recipes[False], chip, work / f"build{tag.strip()}", cache)
    row = {"model": recipe.stem}
    for name, search in (("plain", False), ("search", True)):
        for tag, tree in reversed(trees.items()):  # the baseline first
            row[tag + name] = in_process_of(tree, recipes[search], chip,
                                            work / f"build{tag.strip()}", cache,
                                            compiled=compiled and not tag)
    if baseline:  # the same quantize artifacts from both trees: no choice moved
        row["identical"] = all(row[name].get("digest") is not None and row[name].get("digest")
                               == row["baseline " + name].get("digest")
                               for name in ("plain", "search"))
    for tag in trees:
        plain, searched = row[tag + "plain"], row[tag + "search"]
        row[tag + "ratio"], row[tag + "cpu ratio"] = (
            round(searched[k] / plain[k], 2) if plain.get(k) and searched.get(k) else None
            for k in ("seconds", "cpu"))
    if compiled:
        fps = [row[name].get("compiled", {}).get("fps") for name in ("plain", "search")]
        row["compiled slowdown"] = round(fps[0] / fps[1], 3) if all(fps) else None
    return row


def measure_fan_out(recipe: Path, chip: str, work: Path, cache: Path | None, scheduler: str,
                    repeat: int) -> dict:
    """The searched quantize stage in one process and on ``scheduler``, interleaved; the
    fastest of ``repeat`` rounds each."""
    from zoo import as_written

    written = variant(as_written(recipe, work / "recipes"), work / "recipes", True)
    in_process_of(REPO, written, chip, work / "build", cache)  # earlier stages, untimed
    runs: dict[str, list[dict]] = {"one process": [], "dask": []}
    for _ in range(repeat):
        runs["one process"].append(in_process_of(REPO, written, chip, work / "build", cache))
        runs["dask"].append(in_process_of(REPO, written, chip, work / "build-dask", cache,
                                          scheduler))
    row = {"model": recipe.stem, "scheduler": scheduler}
    for name, measured in runs.items():
        done = [m for m in measured if m.get("seconds")]
        row[name] = min(done, key=lambda m: m["seconds"]) if done else measured[-1]
    one, dask = row["one process"], row["dask"]
    for key in ("seconds", "search_seconds"):
        row[f"{key} ratio"] = (round(dask[key] / one[key], 2)
                               if one.get(key) and dask.get(key) else None)
    row["identical"] = one.get("digest") is not None and one.get("digest") == dask.get("digest")
    row["load"] = round(os.getloadavg()[0], 2)
    return row


def fan_out_markdown(rows: list[dict]) -> str:
    head = ("| model | quantize s, one process | quantize s, Dask | Dask / one | search s, one "
            "process | search s, Dask | Dask / one | cluster start s | quantize bytes identical "
            "| choices scored | tensors out of int8 | load (1 min) |")
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        one, dask = r["one process"], r["dask"]
        lines.append(
            f"| {r['model']} | {_or_dash(one.get('seconds'))} | {_or_dash(dask.get('seconds'))} "
            f"| {_or_dash(r['seconds ratio'])} | {_or_dash(one.get('search_seconds'))} | "
            f"{_or_dash(dask.get('search_seconds'))} | {_or_dash(r['search_seconds ratio'])} | "
            f"{_or_dash(dask.get('cluster_seconds'))} | {_yes(r['identical'])} | "
            f"{_or_dash(one.get('evaluations'))} | {one.get('chosen', 0)} | {r['load']} |"
            + (f" error: {one.get('error') or dask.get('error')}"
               if one.get("error") or dask.get("error") else ""))
    return "\n".join(lines)


def markdown(rows: list[dict]) -> str:
    tags = ["baseline ", ""] if rows and "baseline plain" in rows[0] else [""]
    head = "| model | " + "".join(
        f"{t}plain quantize s (CPU) | {t}with search s (CPU) | {t}ratio (CPU) | "
        for t in tags) + (
        "int8 passes | search passes | tensors out of int8 | est. slowdown | choices scored |"
        + (" compiled slowdown |" if rows and "compiled slowdown" in rows[0] else "")
        + (" quantize artifacts identical |" if rows and "identical" in rows[0] else ""))
    lines = [head, "|" + "---|" * (head.count("|") - 1)]
    for r in rows:
        p, s = r["plain"], r["search"]
        kinds = f" ({'/'.join(s['kinds'])})" if s["kinds"] else ""
        cells = "".join(f"{_seconds(r[t + 'plain'])} | {_seconds(r[t + 'search'])} | "
                        f"{_or_dash(r[t + 'ratio'])} ({_or_dash(r[t + 'cpu ratio'])}) | "
                        for t in tags)
        lines.append(f"| {r['model']} | {cells}"
                     f"{_yes(p['int8_passes'])} | {_yes(s['passes'])} | "
                     f"{_before_after(r, 'chosen')}{kinds} | "
                     f"{_before_after(r, 'slowdown')}"
                     + (f" (refused: {_before_after(r, 'refused')})" if s.get("refused") else "")
                     + " | "
                     f"{s['evaluations'] if s['evaluations'] is not None else '-'} |"
                     + (f" {_or_dash(r['compiled slowdown'])} |" if "compiled slowdown" in r
                        else "")
                     + (f" {_yes(r['identical'])} |" if "identical" in r else ""))
    return "\n".join(lines)


def _before_after(row: dict, key: str) -> str:
    """The searched build's ``key``, after the baseline's where there is one."""
    now = _or_dash(row["search"].get(key))
    base = row.get("baseline search")
    return f"{_or_dash(base.get(key))} → {now}" if base is not None else now


def _or_dash(value) -> str:
    return "-" if value is None else str(value)


def _seconds(m: dict) -> str:
    return f"{m['seconds']} ({m['cpu']})" if m.get("seconds") else "-"


def _yes(value) -> str:
    return {True: "yes", False: "no", None: "-"}[value]


def summary(rows: list[dict]) -> str:
    ratios = [r["ratio"] for r in rows if r["ratio"] is not None]
    over = [r["model"] for r in rows if r["ratio"] is not None and r["ratio"] > GOAL]
    cpu = sorted(r["cpu ratio"] for r in rows if r["cpu ratio"] is not None)
    text = (f"{len(rows)} models; search / plain: median {sorted(ratios)[len(ratios) // 2]:.2f}, "
            f"max {max(ratios):.2f}" if ratios else f"{len(rows)} models; no ratio measured")
    if cpu:  # the CPU seconds' ratio: what a loaded machine's wall clock blurs
        text += f" (CPU: median {cpu[len(cpu) // 2]:.2f}, max {cpu[-1]:.2f})"
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
    p.add_argument("--baseline-tree", type=Path,
                   help="another checkout to measure beside this one, interleaved (e.g. main)")
    p.add_argument("--scheduler", metavar="ADDRESS",
                   help="measure the search on Dask (e.g. local:2) against one process instead")
    p.add_argument("--repeat", type=int, default=1, help="interleaved rounds with --scheduler "
                   "(the fastest of each is shown)")
    p.add_argument("--compiled", action="store_true", help="compile both builds too (untimed) "
                   "and print compile's slowdown (int8 fps / the search's) beside the search's "
                   "estimate")
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    if not args.no_generate:
        run_generators()
    work = args.work or Path(tempfile.mkdtemp(prefix="npubuild-search-"))
    (work / "recipes").mkdir(parents=True, exist_ok=True)
    rows = []
    if args.scheduler:
        for recipe in zoo_recipes(args.models):
            rows.append(measure_fan_out(recipe, args.chip, work, args.cache, args.scheduler,
                                        args.repeat))
            print(fan_out_markdown(rows[-1:]).splitlines()[-1], file=sys.stderr)
        print(fan_out_markdown(rows))
        print(f"\nload average (1, 5, 15 min) at the end: "
              f"{', '.join(f'{v:.2f}' for v in os.getloadavg())}; {os.cpu_count()} cores")
        if args.json:
            args.json.write_text(json.dumps({"rows": rows}, indent=2, default=str))
        return 0
    for recipe in zoo_recipes(args.models):
        rows.append(measure(recipe, args.chip, work, args.cache,
                            args.baseline_tree.resolve() if args.baseline_tree else None,
                            args.compiled))
        print(markdown(rows[-1:]).splitlines()[-1], file=sys.stderr)
    print(markdown(rows))
    print(f"\n{summary(rows)}")
    print(f"load average (1, 5, 15 min) at the end: "
          f"{', '.join(f'{v:.2f}' for v in os.getloadavg())}; {os.cpu_count()} cores")
    if args.json:
        args.json.write_text(json.dumps({"rows": rows}, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
