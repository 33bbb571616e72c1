"""`npubuild plan R [STAGE]`: what `run` would do per stage, and why."""

from __future__ import annotations

import json

from npubuild.commands import output
from npubuild.commands.output import EXIT_OK, STATUS_STYLE

NAME = "plan"
HELP = "say what `run` would do per stage, and why"
OPTIONS = {"build_opts": True, "json_opt": True}


def add_arguments(p) -> None:
    from npubuild.stages import STAGES

    p.add_argument("stage", nargs="?", choices=list(STAGES), help="last stage to consider")


def run(args) -> int:
    from npubuild import api

    results = api.plan(output.session_for(args, args.recipe), args.stage)
    if args.json:
        print(json.dumps({r.stage: {"action": r.status, "reason": r.reason, "key": r.key}
                          for r in results}, indent=2))
        return EXIT_OK
    out = output.console(args, stdout=True)
    for r in results:
        reason = f" — {output.why(r.status, r.reason)}" if r.reason else ""
        out.print(output.line(f"  {r.stage:<9} ", (r.status, STATUS_STYLE.get(r.status, "")), reason))
    return EXIT_OK
