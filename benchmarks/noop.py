"""No-op build overhead: `npubuild run recipes/yolov8.yaml import` when everything is current
and `npubuild validate recipes/yolov8.yaml` (replayed, as when nothing changed since the last
validate; and *edited*: a copy of the recipe touched before each run, so it is checked again),
against plain `doit` running an equivalent
one-task dodo file (a python-action with a file_dep on the model and an up-to-date check), all
measured in this run, interleaved (one run of each in turn), in CPU time (user + system of the
child process: steady on a shared machine) and wall time. Prints a table.

    python3 benchmarks/noop.py [--runs 10] [--baseline-tree /path/to/other/checkout]

``--baseline-tree`` runs the two npubuild commands of another checkout too (its directory on
PYTHONPATH), interleaved with this one's: a before/after comparison in one run.
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


def commands(tree: Path, tmp: Path, tag: str) -> list[tuple[str, list[str], Path, dict]]:
    env = environment(tmp, PYTHONPATH=str(tree))
    recipe = str(REPO / "recipes/yolov8.yaml")
    run = [sys.executable, "-m", "npubuild", "run", recipe, "import", "--build-dir",
           str(tmp / f"build-{tag}"), "--cache", str(tmp / f"cache-{tag}")]
    subprocess.run(run, cwd=tmp, env=env, check=True, capture_output=True)  # the real build
    validate = [sys.executable, "-m", "npubuild", "validate", recipe]
    edited = tmp / f"edited-{tag or 'this'}" / "yolov8.yaml"
    edited.parent.mkdir()
    edited.write_bytes(Path(recipe).read_bytes())
    validate_edited = [sys.executable, "-m", "npubuild", "validate", str(edited)]
    return [(f"npubuild run yolov8.yaml import{tag and f' ({tag})'}", run, tmp, env),
            (f"npubuild validate yolov8.yaml{tag and f' ({tag})'}", validate, tmp, env),
            (f"npubuild validate, edited{tag and f' ({tag})'}", validate_edited, tmp, env)]


def touch_edited(cmd: list[str]) -> None:
    """An edit: the recipe's mtime and ctime change, so validate checks it again."""
    if "validate" in cmd and Path(cmd[-1]).parent.name.startswith("edited-"):
        os.utime(cmd[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--baseline-tree", type=Path,
                        help="another checkout to measure beside this one (e.g. main)")
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from npubuild.recipe.paths import resolve

    model = resolve("pkg:nudenet/320n.onnx", REPO)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        rows = commands(REPO, tmp, "")
        if args.baseline_tree:
            rows += commands(args.baseline_tree.resolve(), tmp, "baseline")
        (tmp / "dodo").mkdir()
        (tmp / "dodo/dodo.py").write_text(DODO.format(model=str(model)))
        doit = [sys.executable, "-m", "doit"]
        subprocess.run(doit, cwd=tmp / "dodo", check=True, capture_output=True,
                       env=environment(tmp))
        rows.append(("doit (one-task dodo.py)", doit, tmp / "dodo", environment(tmp)))
        for _, cmd, cwd, env in rows:  # byte code written once, before anything is timed
            subprocess.run(cmd, cwd=cwd, env=env, check=True, capture_output=True)
        times: dict[str, list[tuple[float, float]]] = {name: [] for name, *_ in rows}
        for _ in range(args.runs):
            for name, cmd, cwd, env in rows:
                touch_edited(cmd)
                times[name].append(clocked(cmd, cwd, env))
    base = statistics.median(cpu for cpu, _ in times["doit (one-task dodo.py)"])
    base_wall = statistics.median(wall for _, wall in times["doit (one-task dodo.py)"])
    print(f"no-op runs, {args.runs} each, interleaved (seconds; medians)\n")
    print(f"| {'command':<46} | CPU    | vs doit | wall   | vs doit |")
    print(f"|{'-' * 48}|--------|---------|--------|---------|")
    for name, measured in times.items():
        cpu = statistics.median(c for c, _ in measured)
        wall = statistics.median(w for _, w in measured)
        print(f"| {name:<46} | {cpu:6.3f} | {cpu / base:6.2f}x | {wall:6.3f} | "
              f"{wall / base_wall:6.2f}x |")


if __name__ == "__main__":
    main()
