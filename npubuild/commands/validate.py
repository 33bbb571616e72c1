"""`npubuild validate R...`: check what `run` would check before any stage runs; build nothing."""

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
    (as every command's --json document carries its failure). Warnings (options the chip
    ignores, a build folder another recipe file owns) go to stderr and each entry's
    ``warnings``; what only import can tell is each entry's ``not_checked``.

    A validate that found every recipe valid, with no warning, is stamped
    (`npubuild.engine.noop`): the next validate of the same recipes, when nothing it read has
    changed, prints the same output without loading them."""
    from npubuild.engine import noop

    if noop.replay_validate(args):
        return EXIT_OK
    with noop.recording(args) as recorded:
        worst, loaded = _validate(args)
        if loaded is not None and not recorded.warnings.count:
            noop.stamp_validate(args, recorded, loaded)
    return worst


def _validate(args) -> tuple[int, list | None]:
    """The exit code, and the loaded recipes when every one was valid with no warning (what
    a stamp may speak for; else None)."""
    results, worst, first, names, loaded = [], EXIT_OK, None, {}, []
    for path in args.recipes:
        try:
            entry, warnings, one = _check(path, names)
        except NpubuildError as exc:
            print(f"error: {exc}", file=sys.stderr)
            results.append({"recipe": str(path), "valid": False,
                             "error": error_object(exc, exc.exit_code)})
            worst, first = max(worst, exc.exit_code), first or results[-1]["error"]
            continue
        results.append(entry)
        loaded.append(one)
        for warning in warnings:
            print(f"warning: {warning}", file=sys.stderr)
        if not args.json:
            print(f"{path}: valid — model {Path(entry['model']).name} ({entry['format']}), "
                  f"target {entry['target']}, {entry['surgery_steps']} surgery steps, "
                  f"{entry['fusion_rules']} fusion rules")
            for note in entry["not_checked"]:
                print(f"  not checked: {note}")
    if args.json:
        doc = {"valid": worst == EXIT_OK, "recipes": results}
        print(json.dumps({**doc, "error": first} if first else doc, indent=2))
    clean = worst == EXIT_OK and not any(entry["warnings"] for entry in results)
    return worst, loaded if clean else None


def _check(path: Path, names: dict[str, Path]) -> tuple[dict, list[NpubuildError], object]:
    """Load and check one recipe (`npubuild.validation`); one `name:` per recipe file among
    those given, and a build folder another recipe file owns is a warning (`run` refuses it)."""
    from npubuild.engine.owner import same_file
    from npubuild.recipe import load_recipe, paths
    from npubuild.validation import validate

    loaded = load_recipe(path)
    name = loaded.recipe.name
    if name in names and not same_file(names[name], path):
        raise loaded.error(f"{names[name]} has the same name; the two would share build/{name}/",
                           "name", hint="give each recipe its own `name:`")
    names.setdefault(name, path)
    found = validate(loaded)
    owner = _owner(name)
    if owner is not None and owner.exists() and not same_file(owner, path):
        found.warnings.append(loaded.error(
            f"build/{name}/ belongs to {owner}, which has the same name: `run` will refuse "
            "this recipe there", "name", hint="give it another `name:`, or build it elsewhere "
                                             "(--build-dir DIR)"))
    entry = {"recipe": str(path), "name": name, "valid": True,
             "model": str(paths.original(loaded.model_path)), "format": loaded.model_format,
             "target": loaded.chip().name, "surgery_steps": len(loaded.recipe.surgery),
             "fusion_rules": len(loaded.recipe.fusion), **found.signature.as_dict(),
             "warnings": [error_object(w, EXIT_OK) for w in found.warnings],
             "not_checked": found.not_checked}
    return entry, found.warnings, loaded


def _owner(name: str) -> Path | None:
    from npubuild.engine.owner import recorded_owner
    from npubuild.engine.paths import BuildPaths

    paths = BuildPaths.for_recipe(name)
    return recorded_owner(paths.root, paths.owner) if paths.root.is_dir() else None
