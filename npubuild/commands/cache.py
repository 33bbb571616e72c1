"""`npubuild cache verify|gc` checks and cleans the content caches; `cache status|push|pull R`
moves a recipe's stages between the build, the local cache and the remote; `cache keygen FILE`
makes the key pair that signs the remote's entries."""

from __future__ import annotations

import json
from pathlib import Path

from npubuild.commands import output
from npubuild.commands.output import EXIT_FAILED, EXIT_OK
from npubuild.errors import UserError

NAME = "cache"
HELP = ("the content caches: check every entry (verify), remove orphans and corrupt entries (gc), "
        "per recipe: where its stages are (status), upload them to the remote (push), "
        "download them (pull); make the remote's signing key pair (keygen)")
OPTIONS = {"recipe": False, "build_opts": True, "json_opt": True}


def add_arguments(p) -> None:
    p.add_argument("action", choices=["verify", "gc", "status", "push", "pull", "keygen"],
                   help="verify: re-hash every entry; gc: remove what verify finds bad and the "
                        ".tmp-* that killed runs left; status/push/pull RECIPE: its stages between "
                        "the build, the local cache and the remote (--remote); keygen FILE: a new "
                        "ed25519 key pair, FILE (private, for the writer) and FILE.pub")
    p.add_argument("recipe", type=Path, nargs="?", metavar="RECIPE|FILE",
                   help="recipe YAML file (status, push, pull), or the private key file to write "
                        "(keygen)")


def run(args) -> int:
    if args.action in ("status", "push", "pull"):
        return _sync(args)
    if args.action == "keygen":
        return _keygen(args)
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
        doc = {"stages": result} if args.action == "status" else result
        print(json.dumps({"action": args.action, **doc}, indent=2))
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


def _keygen(args) -> int:
    from npubuild.engine.signing import SIGNING_KEY_ENV, generate_key_pair

    if args.recipe is None:
        raise UserError("npubuild cache keygen needs the file to write the private key to",
                        hint="npubuild cache keygen ci-cache.key (the public key goes to "
                             "ci-cache.key.pub)")
    public = generate_key_pair(args.recipe)
    pub_file = args.recipe.with_name(args.recipe.name + ".pub")
    if args.json:
        print(json.dumps({"private_key": str(args.recipe), "public_key_file": str(pub_file),
                          "public_key": public}, indent=2))
        return EXIT_OK
    print(f"private key: {args.recipe} (secret: the writer's {SIGNING_KEY_ENV}, e.g. a CI secret)")
    print(f"public key:  {pub_file}")
    print("readers trust it with, in npubuild.toml (or [tool.npubuild] in pyproject.toml):")
    print(f'trusted_keys = ["{public}"]')
    return EXIT_OK
