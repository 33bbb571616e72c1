"""`npubuild clean R`: delete the recipe's build directory (the cache is kept)."""

from __future__ import annotations

from npubuild.commands import output
from npubuild.commands.output import EXIT_OK

NAME = "clean"
HELP = "delete the recipe's build directory (the cache is kept)"
OPTIONS = {"build_opts": True}


def add_arguments(p) -> None:
    """No arguments beyond the recipe and the build options."""


def run(args) -> int:
    from npubuild import api

    root = api.clean(output.session_for(args, args.recipe))
    print(f"removed {root} (the cache is kept)")
    return EXIT_OK
