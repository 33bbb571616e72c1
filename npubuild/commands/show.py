"""`npubuild show R`: the stages (current or stale), their artifacts and the last report."""

from __future__ import annotations

import json

from npubuild.commands import output
from npubuild.commands.output import EXIT_OK

NAME = "show"
HELP = "stages (current or stale), artifacts and the last report"
OPTIONS = {"build_opts": True, "json_opt": True}


def add_arguments(p) -> None:
    """No arguments beyond the recipe and the build options."""


def run(args) -> int:
    from npubuild import api

    info = api.show(output.session_for(args, args.recipe))
    if args.json:
        print(json.dumps(info, indent=2))
        return EXIT_OK
    out = output.console(args, stdout=True)
    out.print(f"{info['recipe']} → {info['build_dir']}", markup=False)
    for name, entry in info["stages"].items():
        files = entry.get("files", {})
        shown = ", ".join(f"{rel} ({output.size(b)})" for rel, b in list(files.items())[:4]
                          if rel != "manifest.json")
        more = f" +{len(files) - 5} more" if len(files) > 5 else ""
        out.print(f"  {name:<9} {entry['state']:<32} {shown}{more}", markup=False)
        if entry.get("stale"):  # those files are an earlier build's, not this recipe's
            out.print(f"  {'':<9} {entry['stale']}", markup=False)
    return EXIT_OK
