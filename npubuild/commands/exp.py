"""`npubuild exp show R`: the variants of a recipe built with ``-S`` (and ``--target``), one
row each — parameters, state, verdict, worst cosine, fps, GMEM — as `dvc exp show` does."""

from __future__ import annotations

import json

from npubuild.commands import output
from npubuild.commands.output import EXIT_OK

NAME = "exp"
HELP = ("experiments: `exp show R` tabulates the variants built with `run R -S FIELD=VALUE` "
        "(parameters, state, verdict, worst cosine, fps, GMEM)")
OPTIONS = {"recipe": False, "build_opts": True, "json_opt": True}


def add_arguments(p) -> None:
    from pathlib import Path

    p.add_argument("action", choices=["show"], help="show: one row per built variant")
    p.add_argument("recipe", type=Path, help="recipe YAML file")


def run(args) -> int:
    from npubuild import experiments
    from npubuild.recipe import load_recipe

    loaded = load_recipe(args.recipe)
    rows = experiments.show(loaded, args.build_dir, lambda r: output.session_for(args, r))
    if args.json:
        print(json.dumps({"variants": rows}, indent=2))
    elif rows:
        output.print_table(rows)
    else:
        print(f"no variant of {loaded.recipe.name} is built under {args.build_dir or 'build'}/: "
              f"`npubuild run {args.recipe} -S FIELD=VALUE` builds one")
    return EXIT_OK
