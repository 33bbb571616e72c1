"""`npubuild cache verify|gc` checks and cleans the content caches; `cache status|push|pull R`
moves a recipe's stages between the build, the local cache and the remote."""

from __future__ import annotations

import json
from pathlib import Path

from npubuild.commands import output
from npubuild.commands.output import EXIT_FAILED, EXIT_OK
from npubuild.errors import UserError

NAME = "cache"
HELP = ("the content caches: check every entry (verify), remove orphans and corrupt entries (gc), "
        "and per recipe: where its stages are (status), upload them to the remote (push), "
        "download them (pull)")
OPTIONS = {"recipe": False, "build_opts": True, "json_opt": True}


def add_arguments(p) -> None:
    p.add_argument("action", choices=["verify", "gc", "status", "push", "pull"],
                   help="verify: re-hash every entry; gc: remove what verify finds bad and the "
                        ".tmp-* that killed runs left; status/push/pull RECIPE: its stages between "
                        "the build, the local cache and the remote (--remote)")
    p.add_argument("recipe", type=Path, nargs="?", help="recipe YAML file (status, push, pull)")


def run(args) -> int:
    if args.action in ("status", "push", "pull"):
        return _sync(args)
    from npubuild import api

    checks = api.cache_check(args.cache) if args.action == "verify" else api.cache_gc(args.cache)
    bad = [c for c in checks if c.problem]
    good = [c for c in checks if not c.problem]
    size = output.size
    if args.json:
        print(json.dumps({"action": args.action, "entries": len(good) + len(bad) - sum(c.orphan for c in bad),
                          "bytes": sum(c.bytes for c in checks),
                          "problems": [{"path": str(c.path), "key": c.key, "bytes": c.bytes,
                                        "problem": c.problem, "orphan": c.orphan} for c in bad]},
                         indent=2))
    else:
        verb = "removed" if args.action == "gc" else "bad"
        for c in bad:
            print(f"  {verb}: {c.path} ({size(c.bytes)}): {c.problem}")
        if args.action == "verify":
            print(f"{len(good)} good entries ({size(sum(c.bytes for c in good))}), {len(bad)} bad "
                  f"({size(sum(c.bytes for c in bad))})" + ("; `npubuild cache gc` removes them"
                                                            if bad else ""))
        else:
            print(f"removed {sum(not c.orphan for c in bad)} corrupt entries and "
                  f"{sum(c.orphan for c in bad)} orphans ({size(sum(c.bytes for c in bad))}); "
                  f"kept {len(good)} entries ({size(sum(c.bytes for c in good))})")
    return EXIT_FAILED if args.action == "verify" and bad else EXIT_OK


def _sync(args) -> int:
    from npubuild.engine import sync

    if args.recipe is None:
        raise UserError(f"npubuild cache {args.action} needs a recipe",
                        hint=f"npubuild cache {args.action} recipes/yolov8.yaml --remote s3://bucket/prefix")
    result = getattr(sync, args.action)(output.session_for(args, args.recipe))
    if args.json:
        print(json.dumps(result, indent=2))
    elif args.action == "status":
        print("| stage | key | build | local | remote |\n|---|---|---|---|---|")
        for row in result:
            marks = ["yes" if row[k] else "no" for k in ("build", "local", "remote")]
            print(f"| {row['stage']} | {(row['key'] or '-')[:12]} | " + " | ".join(marks) + " |")
    else:
        for outcome, stages in result.items():
            print(f"{outcome}: {', '.join(stages) if stages else '-'}")
    failed = args.action != "status" and result.get("failed")
    return EXIT_FAILED if failed else EXIT_OK
