"""No-op build overhead: `npubuild run recipes/yolov8.yaml STAGE` when everything is current
and `npubuild validate recipes/yolov8.yaml`, against plain `doit` running an equivalent one-task
dodo file (a python-action with a file_dep on the model and an up-to-date check), all measured
in this run, interleaved (one run of each in turn), in CPU time (user + system of the child
process: steady on a shared machine) and wall time. Prints a table of medians.

The run is measured replayed (nothing changed since the last run), after the recipe was saved
unchanged (new mtime and ctime, the same bytes: it replays too, as doit finds a touched file_dep
current by its hash) and after the recipe was *edited* (a new comment line before each run: the
stamp misses, the ordinary up-to-date check finds every stage current). validate is measured
replayed and after an edit (checked again).

    python3 benchmarks/noop.py [--runs 10] [--stage import] [--baseline-tree /path/to/checkout]

``--stage`` is the last stage built (default ``import``; ``verify``: the whole pipeline, each
tree builds it once first, about half a minute). ``--baseline-tree`` runs the npubuild
commands of another checkout too (its directory on PYTHONPATH), interleaved with this one's: a
before/after comparison in one run, each row's ratio to its baseline in "vs baseline".
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
DOIT = "doit (one-task dodo.py)"

DODO = textwrap.dedent("""
    import hashlib
    from pathlib import Path
    MODEL = {model!r}
    DOIT_CONFIG = {{"dep_file": ".doit.sqlite", "backend": "sqlite3", "verbosity": 0}}
    def build():
        Path("out.txt").write_text(hashlib.sha256(Path(MODEL).read_bytes()).hexdigest())
    def task_import():
        return {{"actions": [build], "file_dep": [MODEL], "targets": ["out.txt"]}}
""")


def clocked(cmd: list[str], cwd: Path, env: dict) -> tuple[float, float]:
    """(CPU seconds of the child, wall seconds) of one run."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime), wall


def environment(tmp: Path, **extra: str) -> dict:
    """Byte code cached (in a folder of this run), as an installed package has it: with
    PYTHONDONTWRITEBYTECODE every run would compile npubuild's sources again."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    return {**env, "PYTHONPYCACHEPREFIX": str(tmp / "pycache"), **extra}


def commands(tree: Path, tmp: Path, tag: str, stage: str) -> list[tuple]:
    """(name, command, folder, environment, what to do to the recipe before each run, or
    None) per row; the builds are made here, before anything is timed."""
    env = environment(tmp, PYTHONPATH=str(tree))
    recipe = REPO / "recipes/yolov8.yaml"
    suffix = f" ({tag})" if tag else ""

    def copy(kind: str) -> Path:  # pkg: paths: a copy reads the same model and data
        path = tmp / f"{kind}-{tag or 'this'}" / "yolov8.yaml"
        path.parent.mkdir()
        path.write_bytes(recipe.read_bytes())
        return path

    def run(path: Path, build: str) -> list[str]:
        return [sys.executable, "-m", "npubuild", "run", str(path), stage, "--build-dir",
                str(tmp / f"{build}-{tag}"), "--cache", str(tmp / f"cache-{tag}")]

    saved, edited, validated = copy("saved"), copy("edited"), copy("validated")
    replayed = run(recipe, "build")
    after_save, after_edit = run(saved, "build-saved"), run(edited, "build-edited")
    for cmd in (replayed, after_save, after_edit):  # the real build, then cache restores
        subprocess.run(cmd, cwd=tmp, env=env, check=True, capture_output=True)
    edits = iter(range(1, 1 << 30))

    def save() -> None:  # mtime and ctime change, the bytes stay
        saved.write_bytes(saved.read_bytes())

    def edit(path: Path):
        def rewrite() -> None:  # new content each time (a comment: the recipe stays valid)
            path.write_bytes(recipe.read_bytes() + b"# edit %d\n" % next(edits))
        return rewrite

    validate = [sys.executable, "-m", "npubuild", "validate"]
    return [(f"npubuild run yolov8.yaml {stage}{suffix}", replayed, tmp, env, None),
            (f"npubuild run {stage}, recipe saved unchanged{suffix}", after_save, tmp, env,
             save),
            (f"npubuild run {stage}, recipe edited{suffix}", after_edit, tmp, env,
             edit(edited)),
            (f"npubuild validate yolov8.yaml{suffix}", validate + [str(recipe)], tmp, env, None),
            (f"npubuild validate, recipe edited{suffix}", validate + [str(validated)], tmp, env,
             edit(validated))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--stage", default="import",
                        help="the last stage built (default import; verify: all of them)")
    parser.add_argument("--baseline-tree", type=Path,
                        help="another checkout to measure beside this one (e.g. main)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from npubuild.recipe.paths import resolve

    model = resolve("pkg:nudenet/320n.onnx", REPO)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rows = commands(REPO, tmp, "", args.stage)
        if args.baseline_tree:
            rows += commands(args.baseline_tree.resolve(), tmp, "baseline", args.stage)
        (tmp / "dodo").mkdir()
        (tmp / "dodo/dodo.py").write_text(DODO.format(model=str(model)))
        doit = [sys.executable, "-m", "doit"]
        subprocess.run(doit, cwd=tmp / "dodo", check=True, capture_output=True,
                       env=environment(tmp))
        rows.append((DOIT, doit, tmp / "dodo", environment(tmp), None))
        for _, cmd, cwd, env, _ in rows:  # byte code written and stamps made before timing
            subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
        times: dict[str, list[tuple[float, float]]] = {row[0]: [] for row in rows}
        for _ in range(args.runs):
            for name, cmd, cwd, env, before in rows:
                if before is not None:
                    before()
                times[name].append(clocked(cmd, cwd, env))
    print(table(times, args.runs, baseline=bool(args.baseline_tree)))
    print("\nload average at the end: " + " ".join(f"{x:.2f}" for x in os.getloadavg()))


def table(times: dict[str, list[tuple[float, float]]], runs: int, baseline: bool) -> str:
    """Medians, each against doit's and (with a baseline tree) against its baseline row."""
    cpu = {name: statistics.median(c for c, _ in measured) for name, measured in times.items()}
    wall = {name: statistics.median(w for _, w in measured) for name, measured in times.items()}
    extra, rule = (" vs baseline: CPU, wall |", f"{'-' * 24}|") if baseline else ("", "")
    width = max(map(len, times))
    lines = [f"no-op runs, {runs} each, interleaved (seconds; medians)", "",
             f"| {'command':<{width}} | CPU    | vs doit | wall   | vs doit |{extra}",
             f"|{'-' * (width + 2)}|--------|---------|--------|---------|{rule}"]
    for name in times:
        row = (f"| {name:<{width}} | {cpu[name]:6.3f} | {cpu[name] / cpu[DOIT]:6.2f}x | "
               f"{wall[name]:6.3f} | {wall[name] / wall[DOIT]:6.2f}x |")
        if baseline:
            base = f"{name} (baseline)"
            ratio = (f"{cpu[name] / cpu[base]:.2f}x, {wall[name] / wall[base]:.2f}x"
                     if base in cpu else "")
            row += f" {ratio:<22} |"
        lines.append(row)
    return "\n".join(lines)


if __name__ == "__main__":
    main()
