"""`npubuild run R [STAGE]`: build the recipe (or a matrix of chips) up to a stage."""

from __future__ import annotations

import json

from npubuild.commands import output
from npubuild.commands.output import EXIT_OK
from npubuild.errors import NpubuildError

NAME = "run"
HELP = "build the recipe up to STAGE (default: every stage)"
OPTIONS = {"build_opts": True, "json_opt": True}


def add_arguments(p) -> None:
    from npubuild.stages import STAGES

    p.add_argument("stage", nargs="?", choices=list(STAGES), help="last stage to build")
    p.add_argument("--wait", type=float, default=600.0, metavar="SECONDS",
                   help="how long to wait for another run holding the build directory (default 600)")
    p.add_argument("--target", action="append", default=[], metavar="CHIP",
                   help="matrix build: build for this chip too (repeatable); see also `targets:`")
    p.add_argument("-j", "--jobs", type=int, default=2, metavar="N",
                   help="matrix build: chips built in parallel (default 2)")
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run matrix cells, calibration and verify batches on Dask: tcp://HOST:PORT, or "
                        "local:N for a local cluster of N workers (default: $NPUBUILD_SCHEDULER)")


def run(args) -> int:
    from npubuild import api
    from npubuild.distributed import resolve_scheduler
    from npubuild.recipe import load_recipe

    out = output.console(args)
    loaded = load_recipe(args.recipe)
    targets = args.target or loaded.recipe.targets
    if targets:
        return _run_matrix(args, out, loaded, targets)
    session = output.session_for(args, loaded, scheduler=resolve_scheduler(args.scheduler),
                                 progress=output.progress(out), on_event=output.stage_printer(out))
    try:
        report = api.build(session, args.stage, wait_seconds=args.wait,
                           on_wait=lambda msg: out.print(msg, style="yellow", markup=False))
    except NpubuildError:
        args.partial = output.written_report(session)
        if session.results:  # a stage failed: say what ran (a bad recipe printed no stages)
            output.print_progress_summary(out, session)
            output.print_headline(args, session)
        raise
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    output.print_progress_summary(out, session)
    output.print_headline(args, session)
    return EXIT_OK


def _run_matrix(args, out, loaded, targets: list[str]) -> int:
    from npubuild.distributed import resolve_scheduler
    from npubuild.matrix import build_matrix, table

    for target in targets:
        loaded.for_target(target).chip()  # an unknown chip fails before anything is built
    out.print(f"matrix build of {loaded.recipe.name} on {', '.join(targets)}", markup=False)
    cells = build_matrix(loaded, targets, args.stage, build_root=args.build_dir,
                         cache=args.cache, jobs=args.jobs, remote=args.remote,
                         scheduler=resolve_scheduler(args.scheduler))
    rows = table(cells)
    if args.json:
        print(json.dumps({"targets": rows, "cells": cells}, indent=2, default=str))
    else:
        headers = list(rows[0])
        print("| " + " | ".join(headers) + " |")
        print("|" + "|".join("---" for _ in headers) + "|")
        for row in rows:
            print("| " + " | ".join(output.fmt(row[h]) for h in headers) + " |")
        for cell in cells:
            if not cell["ok"]:
                out.print(f"{cell['target']}: {cell['error']}", style="red", markup=False)
    failed = [c for c in cells if not c["ok"]]
    return max((c["exit_code"] for c in failed), default=EXIT_OK)
