"""`npubuild targets` lists the chips; `npubuild targets check R` places every node of a
recipe's model on its chip, with the reasons."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from npubuild.commands import output
from npubuild.commands.output import EXIT_OK
from npubuild.errors import UserError

NAME = "targets"
HELP = ("list the built-in target chips (`targets`), or check a recipe's model against its chip "
        "(`targets check R`)")
OPTIONS = {"recipe": False, "build_opts": True, "json_opt": True}


def add_arguments(p) -> None:
    p.add_argument("action", nargs="?", choices=["list", "check"], default="list",
                   help="list (default) or check")
    p.add_argument("check_recipe", nargs="?", type=Path, metavar="RECIPE",
                   help="for check: print every node's placement (npu/cpu) on the recipe's chip, "
                        "with reasons")
    p.add_argument("--check", type=Path, metavar="RECIPE", help=argparse.SUPPRESS)  # old spelling


def run(args) -> int:
    from npubuild.targets import describe, load_chip, preset_names

    if args.action == "check" or args.check:
        recipe = args.check_recipe or args.check
        if recipe is None:
            raise UserError("`targets check` needs a recipe", hint="npubuild targets check R.yaml")
        return _check(args, recipe)
    if args.check_recipe:
        raise UserError(f"unexpected {args.check_recipe}: `targets` lists chips",
                        hint="to check a recipe: npubuild targets check R.yaml")
    chips = [describe(load_chip(name)) for name in preset_names()]
    if args.json:
        print(json.dumps({"chips": chips}, indent=2))
        return EXIT_OK
    print(f"{'chip':<14} {'backend':<10} {'vendor':<9} {'toolchain':<16} {'installed':<9} "
          f"{'lanes':>5} {'LMEM':>9} {'clock':>9} {'TOPS':>6} {'ops':>4}  description")
    for c in chips:
        print(f"{c['name']:<14} {c['backend']:<10} {c['vendor']:<9} {c['toolchain']:<16} "
              f"{'yes' if c['installed'] else 'no':<9} {c['lanes']:>5} "
              f"{output.size(c['lmem_bytes']):>9} {c['clock_mhz']:>5g} MHz {c['tops_int8']:>6g} "
              f"{c['ops']:>4}  {c['description']}")
    missing = sorted({c["install"] for c in chips if not c["installed"]})
    if missing:
        print("\nto install a missing toolchain: " + "; ".join(missing))
    return EXIT_OK


def _check(args, recipe: Path) -> int:
    from npubuild import api

    session = output.session_for(args, recipe)
    nodes = api.placements(session)
    if args.json:
        print(json.dumps({"recipe": str(recipe), "chip": session.chip.name,
                          "nodes": [n.as_dict() for n in nodes]}, indent=2))
        return EXIT_OK
    on_npu = sum(n.device == "npu" for n in nodes)
    print(f"{recipe}: {on_npu} of {len(nodes)} nodes on the NPU ({session.chip.name})")
    for n in nodes:
        reasons = "; ".join(n.reasons)
        print(f"  {n.device}  {n.op:<18} {n.name}" + (f"  — {reasons}" if reasons else ""))
    return EXIT_OK
