"""`npubuild validate R...`: check recipes and the files they name; build nothing."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from npubuild.commands.output import EXIT_OK, error_object
from npubuild.errors import NpubuildError

NAME = "validate"
HELP = "check recipes and the files they name; build nothing"
OPTIONS = {"recipe": False, "json_opt": True}


def add_arguments(p) -> None:
    p.add_argument("recipes", type=Path, nargs="+", metavar="recipe",
                   help="recipe YAML file(s), e.g. the changed ones pre-commit passes")


def run(args) -> int:
    """One recipe, or many (as pre-commit passes the changed ones): each is checked, every
    error is printed, and the exit code is the worst one."""
    from npubuild.recipe import load_recipe
    from npubuild.stages import importer

    results, worst = [], EXIT_OK
    for path in args.recipes:
        try:
            args.partial = {"recipe": str(path), "valid": False}
            loaded = load_recipe(path)
            chip = loaded.chip()
            signature = importer.check_signature(loaded)
        except NpubuildError as exc:
            if len(args.recipes) == 1:
                raise
            print(f"error: {exc}", file=sys.stderr)
            results.append({**args.partial, "error": error_object(exc, exc.exit_code)})
            worst = max(worst, exc.exit_code)
            continue
        results.append({"recipe": str(path), "name": loaded.recipe.name, "valid": True,
                        "model": str(loaded.model_path), "format": loaded.model_format,
                        "target": chip.name, **signature})
        if not args.json:
            print(f"{path}: valid — model {loaded.model_path.name} ({loaded.model_format}), "
                  f"target {chip.name}, {len(loaded.recipe.surgery)} surgery steps, "
                  f"{len(loaded.recipe.fusion)} fusion rules")
    if args.json:
        print(json.dumps(results[0] if len(args.recipes) == 1 else results, indent=2))
    return worst
