"""`npubuild run R [STAGE]`: build the recipe up to a stage, or a variant of it (``-S``), or a
matrix of variants (``-S`` with several values of a key, ``--target``, ``targets:``)."""

from __future__ import annotations

import json
import sys

from npubuild.commands import output
from npubuild.commands.output import EXIT_OK

NAME = "run"
HELP = "build the recipe up to STAGE (default: every stage)"
OPTIONS = {"build_opts": True, "json_opt": True}


def add_arguments(p) -> None:
    from npubuild.stages import STAGES

    p.add_argument("stage", nargs="?", choices=list(STAGES), help="last stage to build")
    p.add_argument("--force", action="append", nargs="?", const="all", default=[],
                   metavar="STAGE", help="run STAGE again even when it is current or in the cache, "
                   "measuring again (the CPU parts' time in compile); --force alone: every stage "
                   "(as `dvc repro -f`); repeatable")
    p.add_argument("--wait", type=float, default=600.0, metavar="SECONDS",
                   help="how long to wait for another run holding the build directory (default 600)")
    p.add_argument("-S", "--set", action="append", default=[], metavar="FIELD=VALUE",
                   help="an experiment: build the recipe with FIELD (a dotted path, e.g. "
                        "quantization.calibration.method) set to VALUE (YAML), validated as the "
                        "recipe is, into build/<name>@exp-<hash>/; repeat for more fields; the "
                        "same FIELD twice makes a matrix (`npubuild exp show R` lists them)")
    p.add_argument("--target", action="append", default=[], metavar="CHIP",
                   help="matrix build: build for this chip too (repeatable; -S target=CHIP "
                        "twice says the same); see also `targets:`")
    p.add_argument("-j", "--jobs", type=int, default=2, metavar="N",
                   help="matrix build: variants built in parallel (default 2)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run matrix cells, calibration and verify batches on Dask: tcp://HOST:PORT, or "
                        "local:N for a local cluster of N workers (default: $NPUBUILD_SCHEDULER)")


def run(args) -> int:
    from npubuild.engine import noop

    if noop.replay(args):  # nothing changed since the last no-op run of this very command
        return EXIT_OK
    with noop.recording(args) as recorded:
        return _run(args, recorded)


def _run(args, recorded) -> int:
    from npubuild import facade
    from npubuild.distributed import resolve_scheduler
    from npubuild.engine.paths import BuildPaths
    from npubuild.matrix import chip_variants, combine
    from npubuild.recipe.overrides import variants as set_variants
    from npubuild.stages import upto

    out = output.console(args)
    recipe = facade.load(args.recipe)
    variants = combine(chip_variants(args.target or recipe.loaded.recipe.targets),
                       set_variants(args.set))
    if len(variants) > 1:
        return _run_matrix(args, out, recipe.loaded, variants)
    if variants:
        recipe = facade.Recipe(recipe.loaded.variant(variants[0]))
        out.print(f"experiment {recipe.name}: " + ", ".join(
            f"{k}={json.dumps(v)}" for k, v in recipe.overrides.items()), markup=False)
    running: dict = {}  # the stage that runs now: progress bars say whose loop they count
    result = recipe.build(args.stage, wait_seconds=args.wait,
                          on_wait=lambda msg: out.print(msg, style="yellow", markup=False),
                          build_dir=args.build_dir, cache=args.cache, remote=args.remote,
                          scheduler=resolve_scheduler(args.scheduler), force=tuple(args.force),
                          progress=output.progress(out, running),
                          on_event=output.stage_printer(out, running))
    if result.error is not None:
        args.partial = result.report
        output.print_progress_summary(out, result)
        output.print_headline(args, result)
        raise result.error
    if args.json:
        print(json.dumps(result.report, indent=2))
    else:
        output.print_progress_summary(out, result)
        output.print_headline(args, result)
    sys.stdout.flush()
    recorded.stamp(recipe.loaded, BuildPaths(result.build_dir), result.stages, upto(args.stage))
    return EXIT_OK


def _run_matrix(args, out, loaded, variants: list[dict]) -> int:
    from npubuild.distributed import one_cluster, resolve_scheduler
    from npubuild.experiments import parameter_keys, row
    from npubuild.matrix import build_matrix

    for variant in variants:  # a bad value or an unknown chip fails before anything is built
        loaded.variant(variant, apart=True)
    out.print(f"matrix build of {loaded.recipe.name}: {len(variants)} variants", markup=False)
    scheduler = resolve_scheduler(args.scheduler)
    with one_cluster(scheduler):  # the shared stages and the cells: one cluster
        cells = build_matrix(loaded, variants, args.stage, build_root=args.build_dir,
                             cache=args.cache, jobs=args.jobs, remote=args.remote,
                             scheduler=scheduler)
    keys = parameter_keys(cells)
    data = loaded.recipe.model_dump(mode="json")
    rows = [row(c["name"], c["overrides"], c.get("report") or {}, data, keys,
                "built" if c["ok"] else "failed", loaded.variant(c["overrides"], apart=True).recipe
                .verify.model_dump(mode="json")) for c in cells]
    if args.json:
        print(json.dumps({"variants": rows, "cells": cells}, indent=2, default=str))
    else:
        output.print_table(rows)
        for cell in cells:
            if not cell["ok"]:
                out.print(f"{cell['name']}: {cell['error']}", style="red", markup=False)
    failed = [c for c in cells if not c["ok"]]
    return max((c["exit_code"] for c in failed), default=EXIT_OK)
