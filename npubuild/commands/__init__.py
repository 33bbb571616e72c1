"""The commands of `npubuild`, one small module each (DVC's `dvc/commands/` layout).

Each module declares ``NAME``, ``HELP``, ``OPTIONS`` (which shared options it takes: a recipe
argument, the build options, ``--json``), ``add_arguments(parser)`` for its own, and
``run(args) -> exit code``. `npubuild.cli` builds the parser from ``COMMANDS`` in this order
(the order of `npubuild --help`); the library does the work, a command parses and prints.
"""

from __future__ import annotations

import importlib
from types import ModuleType

COMMANDS = ("run", "validate", "plan", "show", "clean", "schema", "targets", "infer", "cache",
            "view", "diff", "toolchain", "exp", "completion")


def command_modules() -> list[ModuleType]:
    """The command modules in `npubuild --help` order (light imports only: the CLI starts fast)."""
    return [importlib.import_module(f"npubuild.commands.{name}") for name in COMMANDS]
