"""`npubuild diff A B` (or `diff R`: HEAD vs the working copy; `--rev A..B`): which stages differ
and why, how the figures moved per chip pair, and (`--fail-on`) an exit code a CI job gates on."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from npubuild.commands.output import EXIT_FAILED, EXIT_OK

NAME = "diff"
HELP = ("compare two recipes (or two git revisions of one): which stages differ and why, and how "
        "the metrics moved")
OPTIONS = {"recipe": False, "build_opts": True, "json_opt": True}


def add_arguments(p) -> None:
    from npubuild.diff import FAIL_ON

    p.add_argument("recipes", type=Path, nargs="+", metavar="RECIPE", help="A.yaml B.yaml, or one "
                   "recipe (HEAD vs the working copy, or --rev)")
    p.add_argument("--rev", action="append", default=[], metavar="REV",
                   help="git revision of the recipe: REV (vs the working copy; default HEAD), "
                        "A..B, or twice")
    p.add_argument("--markdown", action="store_true",
                   help="print a Markdown pull-request comment")
    p.add_argument("--fail-on", choices=FAIL_ON, default=None,
                   help="exit 1 when b regresses against a threshold a met, or verify goes "
                        "pass -> fail (regression), or when b fails verify or has no verdict "
                        "(fail); default: exit 0 whatever the figures")
    p.add_argument("--base-build-dir", type=Path, default=None, metavar="DIR",
                   help="where version a was built (default: --build-dir): its measured fps "
                        "are read from there")


def run(args) -> int:
    from contextlib import ExitStack

    from npubuild import api
    from npubuild.diff import diff_recipes, gate, render
    from npubuild.recipe import load_recipe

    def session_for(recipe, side: str):
        base = args.base_build_dir if side == "a" and args.base_build_dir else args.build_dir
        return api.session_for(recipe, build_root=base, cache=args.cache, remote=args.remote)

    with ExitStack() as stack:
        paths, labels = api.diff_inputs(args.recipes, args.rev, stack)
        loaded = [load_recipe(p) for p in paths]
        result = diff_recipes(*loaded, session_for, labels=labels)
    reasons = gate(result, args.fail_on)
    result["gate"] = {"fail_on": args.fail_on, "failed": bool(reasons), "reasons": reasons}
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        sys.stdout.write(render.markdown(result) if args.markdown else render.text(result))
    for reason in reasons:
        print(f"error: --fail-on {args.fail_on}: {reason}", file=sys.stderr)
    return EXIT_FAILED if reasons else EXIT_OK
