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
    """Every recipe given (pre-commit passes the changed ones) is checked and every error is
    printed; the exit code is the worst. ``--json`` prints one object always:
    ``{"valid": bool, "recipes": [one entry per recipe]}``, plus the first failure as ``error``
    (as every command's --json document carries its failure)."""
    results, worst, first = [], EXIT_OK, None
    for path in args.recipes:
        try:
            results.append(_check(path))
        except NpubuildError as exc:
            print(f"error: {exc}", file=sys.stderr)
            results.append({"recipe": str(path), "valid": False,
                             "error": error_object(exc, exc.exit_code)})
            worst, first = max(worst, exc.exit_code), first or results[-1]["error"]
            continue
        if not args.json:
            r = results[-1]
            print(f"{path}: valid — model {Path(r['model']).name} ({r['format']}), target "
                  f"{r['target']}, {r['surgery_steps']} surgery steps, {r['fusion_rules']} "
                  "fusion rules")
    if args.json:
        doc = {"valid": worst == EXIT_OK, "recipes": results}
        print(json.dumps({**doc, "error": first} if first else doc, indent=2))
    return worst


def _check(path: Path) -> dict:
    from npubuild.recipe import load_recipe
    from npubuild.stages import importer

    loaded = load_recipe(path)
    chip = loaded.chip()
    signature = importer.check_signature(loaded)
    return {"recipe": str(path), "name": loaded.recipe.name, "valid": True,
            "model": str(loaded.model_path), "format": loaded.model_format, "target": chip.name,
            "surgery_steps": len(loaded.recipe.surgery), "fusion_rules": len(loaded.recipe.fusion),
            **signature.as_dict()}
