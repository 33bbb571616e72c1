"""SIGKILL a build at chosen points of every stage, of the cache's store and restore, of the
atomic swap and of an atomic file write, with one cache shared by every run; after each kill a
plain `npubuild run` must resume (exit 0) to artifacts byte-identical to a clean build's.
Prints a table; exits 1 on a failed resume or a differing artifact.

A kill point is reached through a hook the killed run installs (it prints a marker and
sleeps there), so each kill lands exactly where it is meant to, not at a random instant.

    python3 benchmarks/kills.py [--kills 20] [--recipe R]
"""

from __future__ import annotations

import argparse
import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
RUN_STATE = {"report.json", "report.html", ".doit.sqlite", ".lock", ".hashes.json"}
STAGES = ("import", "surgery", "fusion", "split", "quantize", "compile", "verify")
MARKER = "KILL-POINT"

HOOK = textwrap.dedent(f"""
    import sys, time
    from pathlib import Path
    point, stage, argv = sys.argv[1], sys.argv[2], sys.argv[3:]

    def hit():
        print({MARKER!r}, flush=True)
        time.sleep(600)

    if point == "stage":  # the stage function has written its outputs into the scratch dir
        import importlib
        from npubuild.stages import STAGES
        module, _, attr = STAGES[stage].entry.partition(":")
        module = importlib.import_module(module)
        real = getattr(module, attr)
        setattr(module, attr, lambda ctx: (real(ctx), hit()))
    elif point == "store":  # the entry's files are copied into .tmp-*, not yet renamed
        from npubuild.engine import cache
        cache.Cache._publish = lambda self, tmp, final, key: hit()
    elif point == "restore":  # the first file of an entry is copied into the scratch dir
        from npubuild.engine import cache
        real_copy = cache.copy_checked
        def copy(*args):
            real_copy(*args)
            hit()
        cache.copy_checked = copy
    elif point == "swap":  # between the two renames: the old stage dir moved away
        from npubuild.engine import session as engine
        def swap(self, stage_, scratch):
            final = self.paths.stage_dir(stage_.name)
            final.rename(self.paths.scratch / "old")
            hit()
        engine.BuildSession._swap_in = swap
    elif point == "atomic":  # an atomic write's temporary file is written, not renamed
        import npubuild.atomic as atomic
        atomic.os.fsync = lambda fd: hit()
    from npubuild.cli import main
    sys.exit(main(argv))
""")


@dataclass
class Kill:
    point: str
    stage: str
    prepare: str  # what is removed first so the point is reached: "stage" | "entry+stage" | "flip"


def plan(kills: int) -> list[Kill]:
    """Every stage killed mid-run, then store, restore, swap and atomic writes over stages."""
    base = [Kill("stage", s, "entry+stage") for s in STAGES]
    cycle = [Kill("store", s, "entry+stage") for s in ("import", "split", "quantize", "verify")]
    cycle += [Kill("restore", s, "stage") for s in ("surgery", "fusion", "compile", "verify")]
    cycle += [Kill("swap", s, "flip") for s in ("import", "quantize", "compile")]
    cycle += [Kill("atomic", s, "stage") for s in ("split", "verify")]
    out = base + cycle
    while len(out) < kills:
        out += cycle
    return out[:kills]


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in RUN_STATE}


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "npubuild", *args], cwd=cwd, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": str(REPO)})


def prepare(kill: Kill, build: Path, cache: Path, keys: dict[str, str]) -> None:
    stage_dir = build / kill.stage
    if kill.prepare == "flip":
        victim = next(p for p in sorted(stage_dir.rglob("*"))
                      if p.is_file() and p.name != "manifest.json")
        data = bytearray(victim.read_bytes())
        data[len(data) // 2] ^= 1
        victim.write_bytes(bytes(data))
        return
    shutil.rmtree(stage_dir, ignore_errors=True)
    if kill.prepare == "entry+stage":
        key = keys[kill.stage]
        shutil.rmtree(cache / key[:2] / key, ignore_errors=True)


def kill_at(kill: Kill, argv: list[str], cwd: Path, timeout: float = 600) -> str:
    """Run with the hook; SIGKILL at the marker. Returns "killed" or why it was not."""
    proc = subprocess.Popen([sys.executable, "-c", HOOK, kill.point, kill.stage, *argv], cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([proc.stdout], [], [], 1.0)
            if ready:
                line = proc.stdout.readline()
                if line.strip() == MARKER:
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
                    return "killed"
                if not line and proc.poll() is not None:
                    return f"exited {proc.returncode} before the kill point: {proc.stderr.read()[-300:]}"
        return "timed out before the kill point"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def run_kills(kills: int, workdir: Path, recipe: Path, log=print) -> dict:
    """Reference build, then ``kills`` kill/resume rounds on one build dir and shared cache."""
    shutil.copy(recipe, workdir / recipe.name)
    ref = cli("run", recipe.name, "--build-dir", "ref", "--cache", "ref-cache", cwd=workdir)
    assert ref.returncode == 0, ref.stderr
    name_dir = next((workdir / "ref").iterdir())
    reference = tree(name_dir)
    report = json.loads((name_dir / "report.json").read_text())
    keys = {s: v["key"] for s, v in report["stages"].items()}
    run_args = ["run", recipe.name, "--build-dir", "b", "--cache", "shared"]
    assert cli(*run_args, cwd=workdir).returncode == 0
    build, cache = workdir / "b" / name_dir.name, workdir / "shared"
    tally = {"kills": 0, "not_reached": [], "failed_resumes": [], "differing": [], "rows": []}
    for kill in plan(kills):
        prepare(kill, build, cache, keys)
        outcome = kill_at(kill, run_args, workdir)
        tally["kills"] += outcome == "killed"
        if outcome != "killed":
            tally["not_reached"].append((kill, outcome))
        resumed = cli(*run_args, cwd=workdir)
        if resumed.returncode != 0:
            tally["failed_resumes"].append((kill, resumed.stderr[-400:]))
        now = tree(build)
        differ = sorted(k for k in set(now) | set(reference) if now.get(k) != reference.get(k))
        if differ:
            tally["differing"].append((kill, differ))
        tally["rows"].append((kill, outcome, resumed.returncode, len(differ)))
        log(f"  {kill.point:<8} {kill.stage:<9} {outcome:<8} resume exit {resumed.returncode}, "
            f"{len(differ)} files differ")
    verify = cli("cache", "verify", "--cache", "shared", "--json", cwd=workdir)
    tally["cache_problems"] = json.loads(verify.stdout)["problems"]
    cli("cache", "gc", "--cache", "shared", cwd=workdir)
    tally["cache_after_gc"] = cli("cache", "verify", "--cache", "shared", cwd=workdir).returncode
    tally["files"] = len(reference)
    return tally


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kills", type=int, default=20)
    parser.add_argument("--recipe", type=Path, default=None,
                        help="default: the tiny test recipe (tests/data/tiny.onnx)")
    args = parser.parse_args()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        recipe = args.recipe
        if recipe is None:
            sys.path.insert(0, str(REPO))
            from tests.conftest import TINY_RECIPE

            recipe = Path(tmp) / "tiny.yaml"
            recipe.write_text(TINY_RECIPE)
        work = Path(tmp) / "work"
        work.mkdir()
        tally = run_kills(args.kills, work, recipe.resolve())
    orphans = sum(p["orphan"] for p in tally["cache_problems"])
    corrupt = len(tally["cache_problems"]) - orphans
    print("| SIGKILLs | kill points not reached | failed resumes | artifacts differing from a "
          "clean build | cache: orphans / corrupt entries before gc | verify after gc | time |")
    print("|---|---|---|---|---|---|---|")
    print(f"| {tally['kills']} | {len(tally['not_reached'])} | {len(tally['failed_resumes'])} | "
          f"{sum(len(d) for _, d in tally['differing'])} of {tally['files']} files × rounds | "
          f"{orphans} / {corrupt} | exit {tally['cache_after_gc']} | "
          f"{time.perf_counter() - started:.0f} s |")
    for kill, why in tally["not_reached"] + tally["failed_resumes"] + tally["differing"]:
        print(f"  {kill.point} {kill.stage}: {why}")
    bad = tally["failed_resumes"] or tally["differing"] or tally["not_reached"] or corrupt
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
