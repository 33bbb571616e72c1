"""Fail when a test file under tests/ is not collected by the README's test command.

pytest skips folders it was told to (its default `norecursedirs` includes `build`), and a module
that skips itself at import hides every test in it: both happened here. Every `test_*.py` file
must contribute at least one collected test in CI, where every optional tool is installed.
"""

import pathlib
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[1]


def collected_files() -> set[str]:
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly"],
                         cwd=ROOT, capture_output=True, text=True, check=False).stdout
    return {line.split("::", 1)[0] for line in out.splitlines() if "::" in line}


def test_files() -> set[str]:
    return {str(p.relative_to(ROOT)) for p in (ROOT / "tests").rglob("test_*.py")}


if __name__ == "__main__":
    files, collected = test_files(), collected_files()
    missing = sorted(files - collected)
    print(f"test files: {len(files)}, collected: {len(files & collected)}")
    if missing:
        sys.exit("not collected:\n  " + "\n  ".join(missing))
