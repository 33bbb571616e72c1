"""`npubuild toolchain list` shows the vendor toolchains and where their environments are;
`npubuild toolchain install NAME` makes one (from the package registries only)."""

from __future__ import annotations

import json

from npubuild.commands import output
from npubuild.commands.output import EXIT_OK

NAME = "toolchain"
HELP = ("list the vendor toolchains (`toolchain list`) or install one in its own environment "
        "(`toolchain install rknn|tpu-mlir|vela`)")
OPTIONS = {"recipe": False, "json_opt": True}


def add_arguments(p) -> None:
    p.add_argument("action", nargs="?", choices=["list", "install"], default="list")
    p.add_argument("names", nargs="*", metavar="NAME", help="toolchains to install")
    p.add_argument("--force", action="store_true", help="make the environment again from scratch")


def run(args) -> int:
    from npubuild import toolchains
    from npubuild.errors import UserError
    from npubuild.toolchains import env

    if args.action == "install":
        if not args.names:
            raise UserError("`toolchain install` needs a toolchain name",
                            hint="npubuild toolchain install " + "|".join(toolchains.TOOLCHAINS.names()))
        for name in args.names:
            chain = toolchains.get(name)
            made = env.install_env(chain, force=args.force, say=_say)
            print(f"{chain.name}: {made.python.parent.parent}")
        return EXIT_OK
    if args.names:
        raise UserError(f"unexpected {' '.join(args.names)}: `toolchain list` takes no names")
    rows = [env.describe(toolchains.TOOLCHAINS[name]) for name in toolchains.TOOLCHAINS.names()]
    if args.json:
        print(json.dumps(rows, indent=2))
        return EXIT_OK
    print(f"{'toolchain':<10} {'package':<22} {'python':<8} {'installed':<10} {'size':>9}  where")
    for r in rows:
        size = output.size(r["size_bytes"]) if r["size_bytes"] else (
            "(user's)" if r["user_given"] else f"~{r['expected_size']}" if not r["installed"] else "?")
        print(f"{r['name']:<10} {r['package']:<22} {r['python']:<8} "
              f"{'yes' if r['installed'] else 'no':<10} {size:>9}  {r['where']}"
              + ("" if r["installed"] else f"  (install: {r['install']})"))
    return EXIT_OK


def _say(message: str, *values) -> None:
    """Install progress on stderr (results go to stdout)."""
    import sys

    print(message % values, file=sys.stderr, flush=True)
