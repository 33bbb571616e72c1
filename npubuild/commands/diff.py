"""`npubuild diff A B` (or `diff R --rev REV`): which stages differ and why, and how the
metrics moved."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from npubuild.commands import output
from npubuild.commands.output import EXIT_OK

NAME = "diff"
HELP = ("compare two recipes (or two git revisions of one): which stages differ and why, and how "
        "the metrics moved")
OPTIONS = {"recipe": False, "build_opts": True, "json_opt": True}


def add_arguments(p) -> None:
    p.add_argument("recipes", type=Path, nargs="+", metavar="RECIPE", help="A.yaml B.yaml, or one "
                   "recipe with --rev")
    p.add_argument("--rev", action="append", default=[], metavar="REV",
                   help="git revision of the recipe: REV (vs the working copy), A..B, or twice")
    p.add_argument("--markdown", action="store_true",
                   help="print a Markdown pull-request comment")


def run(args) -> int:
    from contextlib import ExitStack

    from npubuild import api
    from npubuild.diff import diff_recipes, render
    from npubuild.recipe import load_recipe

    with ExitStack() as stack:
        paths, labels = api.diff_inputs(args.recipes, args.rev, stack)
        loaded = [load_recipe(p) for p in paths]
        result = diff_recipes(*loaded, lambda r: output.session_for(args, r), labels=labels)
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        sys.stdout.write(render.markdown(result) if args.markdown else render.text(result))
    return EXIT_OK
