"""`npubuild schema [WHICH]`: print a JSON Schema (the recipe's by default)."""

from __future__ import annotations

import sys

from npubuild.commands.output import EXIT_OK

NAME = "schema"
HELP = "print a JSON Schema"
OPTIONS = {"recipe": False}


def add_arguments(p) -> None:
    from npubuild.schemas import NAMES

    p.add_argument("which", nargs="?", choices=NAMES, default="recipe")


def run(args) -> int:
    from npubuild.schemas import schema_text

    sys.stdout.write(schema_text(args.which))
    return EXIT_OK
