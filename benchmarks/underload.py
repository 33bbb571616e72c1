"""The quantize stage alone and beside a competitor, for two or more source trees in one run.

A build shares its machine: the zoo runs two recipes at once (``benchmarks/zoo.py -j 2``),
a user builds beside an IDE, CI beside other jobs. Threads that wait by spinning, or pools
wider than the process's share of the cores, cost far more wall time there than the extra
load explains (issue 23: basic-pitch's quantize 72.5 s alone, 1,156 s in the zoo at load
8-11). This benchmark builds each zoo recipe as written (``zoo.as_written``) up to split,
once per tree, then forces its quantize again and again, interleaved: every tree alone, then
every tree beside the competitor, for ``--rounds`` rounds. Each figure is the child's wall
time and CPU time (user + system, ``os.wait4``), with the 1-minute load when it started.

The competitor is one busy loop per core (``--beside burn``, a fixed demand), or the same
quantize of the same tree in a second build directory, again and again (``--beside twin``,
the zoo's ``-j 2``). Trees are ``label=path``; ``KEY=VALUE`` after a comma sets an environment
variable for that variant (``main1=/work/wt/base,NPUBUILD_THREADS=1``):

    python3 benchmarks/underload.py --trees main=/work/wt/base this=. \\
        --models light-squeezenet basic-pitch --rounds 2 --scratch /tmp/underload

The quantize stage's files' hashes are printed per tree and model: threads must not change bytes.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO / "benchmarks"))

BURN = "while True: pass"


def parse_tree(spec: str) -> tuple[str, Path, dict[str, str]]:
    """``label=path[,KEY=VALUE...]`` -> (label, path, environment)."""
    label, _, rest = spec.partition("=")
    path, *settings = rest.split(",")
    return label, Path(path).resolve(), dict(s.split("=", 1) for s in settings)


def npubuild(tree: Path, env: dict[str, str], recipe: Path, build: Path, cache: Path,
             force: bool) -> list[str]:
    args = [sys.executable, "-m", "npubuild", "run", "-q", str(recipe), "quantize",
            "--build-dir", str(build), "--cache", str(cache)]
    return args + (["--force", "quantize"] if force else [])


def child_env(tree: Path, env: dict[str, str]) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(tree), **env}


def timed(args: list[str], env: dict[str, str]) -> tuple[float, float, int]:
    """(wall seconds, CPU seconds, exit code) of one child process, run in its tree (``-m``
    puts the working directory first on sys.path, before PYTHONPATH)."""
    started = time.perf_counter()
    proc = subprocess.Popen(args, env=env, cwd=env["PYTHONPATH"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - started
    proc.returncode = os.waitstatus_to_exitcode(status)
    if proc.returncode:
        print(proc.stderr.read().decode(errors="replace")[-2000:], file=sys.stderr)
    proc.stderr.close()
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode


class Competitor:
    """What runs beside the measured build while it runs: busy loops or a twin build."""

    def __init__(self, kind: str, twin: list[str] | None = None, env: dict | None = None):
        self.kind, self.twin, self.env, self.procs = kind, twin, env, []

    def __enter__(self):
        if self.kind == "burn":
            self.procs = [subprocess.Popen([sys.executable, "-c", BURN])
                          for _ in range(os.cpu_count() or 1)]
        else:  # a shell loop: the twin starts again whenever it ends
            loop = f"while true; do {' '.join(self.twin)} >/dev/null 2>&1; done"
            self.procs = [subprocess.Popen(["bash", "-c", loop], env=self.env,
                                           cwd=self.env["PYTHONPATH"], start_new_session=True)]
        time.sleep(1.0)  # the competitor running before the measured build starts
        return self

    def __exit__(self, *exc):
        for proc in self.procs:
            if self.kind == "twin":
                os.killpg(proc.pid, 15)  # its own session: the loop and its build
            else:
                proc.terminate()
            proc.wait()


def quantized_hash(build: Path, recipe: Path) -> str:
    """One hash over the quantize stage's files (graphs, parameters, manifest)."""
    stage = build / recipe.stem / "quantize"
    digest = hashlib.sha256()
    for path in sorted(p for p in stage.rglob("*") if p.is_file()):
        digest.update(path.relative_to(stage).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()[:12]


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--trees", nargs="+", required=True, metavar="LABEL=PATH[,K=V]")
    p.add_argument("--models", nargs="+", required=True, help="zoo recipe names")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--beside", choices=("burn", "twin"), default="burn")
    p.add_argument("--scratch", type=Path, required=True, help="recipes, builds and caches")
    args = p.parse_args(argv)
    import zoo

    trees = [parse_tree(t) for t in args.trees]
    recipes = {m: zoo.as_written(REPO / "recipes" / "zoo" / f"{m}.yaml", args.scratch / "recipes")
               for m in args.models}
    dirs = {label: (args.scratch / label / "build", args.scratch / label / "cache")
            for label, _, _ in trees}
    for (label, tree, env), model in ((t, m) for t in trees for m in args.models):
        build, cache = dirs[label]  # the stages before quantize, once (not measured)
        _, _, code = timed(npubuild(tree, env, recipes[model], build, cache, False),
                           child_env(tree, env))
        if code:
            print(f"# {label} {model}: the build failed ({code})", file=sys.stderr)
    rows = []
    for round_ in range(args.rounds):
        for beside in ("alone", args.beside):
            for model in args.models:
                for label, tree, env in trees:
                    build, cache = dirs[label]
                    cmd = npubuild(tree, env, recipes[model], build, cache, True)
                    twin_dir = args.scratch / label / "twin"
                    if beside == "twin" and not (twin_dir / "build").exists():
                        shutil.copytree(build, twin_dir / "build")
                    twin = npubuild(tree, env, recipes[model], twin_dir / "build",
                                    twin_dir / "cache", True)
                    load = os.getloadavg()[0]
                    if beside == "alone":
                        wall, cpu, code = timed(cmd, child_env(tree, env))
                    else:
                        with Competitor(beside, twin, child_env(tree, env)):
                            wall, cpu, code = timed(cmd, child_env(tree, env))
                    rows.append((model, beside, label, round_, load, wall, cpu, code))
                    print(f"# {model} {beside} {label} round {round_}: load {load:.1f}, "
                          f"{wall:.1f} s wall, {cpu:.1f} s CPU", file=sys.stderr, flush=True)
    print_table(rows, args.rounds)
    for label, _, _ in trees:
        for model in args.models:
            print(f"{label:>8} {model}: quantize stage's files {quantized_hash(dirs[label][0], recipes[model])}")
    return int(any(r[-1] for r in rows))


def print_table(rows: list[tuple], rounds: int) -> None:
    print(f"\n{'model':<18} {'beside':<6} {'tree':<8} {'load (each run)':<22} "
          f"{'wall s (median)':>15} {'CPU s (median)':>15}  each run wall/CPU")
    keys = list(dict.fromkeys(r[:3] for r in rows))
    for key in keys:
        mine = [r for r in rows if r[:3] == key]
        loads = " ".join(f"{r[4]:.1f}" for r in mine)
        each = " ".join(f"{r[5]:.1f}/{r[6]:.1f}" for r in mine)
        print(f"{key[0]:<18} {key[1]:<6} {key[2]:<8} {loads:<22} "
              f"{statistics.median(r[5] for r in mine):>15.1f} "
              f"{statistics.median(r[6] for r in mine):>15.1f}  {each}")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
