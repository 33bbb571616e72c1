"""No-op build overhead: `npubuild run recipes/yolov8.yaml import` when everything is current,
against plain `doit` running an equivalent one-task dodo file (a python-action with a file_dep
on the model and an up-to-date check), both measured in this run. Prints a table.

    python3 benchmarks/noop.py [--runs 10]
"""

from __future__ import annotations

import argparse
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


def timed(cmd: list[str], cwd: Path, runs: int) -> list[float]:
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(cmd, cwd=cwd, check=True, capture_output=True)
        times.append(time.perf_counter() - start)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    args = parser.parse_args()
    sys.path.insert(0, str(REPO))
    from npubuild.recipe.paths import resolve

    model = resolve("pkg:nudenet/320n.onnx", REPO)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        npubuild = [sys.executable, "-m", "npubuild", "run", str(REPO / "recipes/yolov8.yaml"),
                    "import", "--build-dir", str(tmp / "build"), "--cache", str(tmp / "cache")]
        subprocess.run(npubuild, cwd=tmp, check=True, capture_output=True)  # the real build
        (tmp / "dodo").mkdir()
        (tmp / "dodo/dodo.py").write_text(DODO.format(model=str(model)))
        doit = [sys.executable, "-m", "doit"]
        subprocess.run(doit, cwd=tmp / "dodo", check=True, capture_output=True)
        rows = [("npubuild run recipes/yolov8.yaml import", timed(npubuild, tmp, args.runs)),
                ("doit (one-task dodo.py)", timed(doit, tmp / "dodo", args.runs))]
    base = statistics.median(rows[1][1])
    print(f"no-op runs, {args.runs} each (wall time, seconds)\n")
    print(f"| {'command':<42} | median | min   | max   | vs doit |")
    print(f"|{'-' * 44}|--------|-------|-------|---------|")
    for name, times in rows:
        med = statistics.median(times)
        print(f"| {name:<42} | {med:6.3f} | {min(times):5.3f} | {max(times):5.3f} | {med / base:6.2f}x |")


if __name__ == "__main__":
    main()
