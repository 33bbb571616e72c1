"""`npubuild` command line: parse, call the library, print, map errors to exit codes.

Exit codes: 0 ok · 1 a build or a check failed · 2 bad recipe or bad input.
Errors print as one ``error:`` message (file:line:column: field: what, and a hint), never a
traceback; ``-v`` adds the traceback of unexpected errors for bug reports.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
from pathlib import Path

from npubuild import __version__
from npubuild.errors import NpubuildError

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2

STATUS_STYLE = {"built": "green", "restored": "cyan", "cached": "dim", "failed": "bold red",
                "will run": "yellow", "will restore": "cyan"}


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING,
                        format="%(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        return args.func(args) or EXIT_OK
    except NpubuildError as exc:
        if args.verbose and exc.__cause__ is not None:
            traceback.print_exception(exc.__cause__, file=sys.stderr)
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # a bug: one line for users, the traceback with -v
        if args.verbose:
            traceback.print_exc()
        print(f"error: internal error: {type(exc).__name__}: {exc}\n  hint: this is a bug in "
              "npubuild; rerun with -v and report the traceback", file=sys.stderr)
        return EXIT_FAILED
    except KeyboardInterrupt:
        print("error: interrupted; finished stages are kept, the interrupted one left nothing "
              "behind", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="npubuild", description="Build an NPU deployment from a YAML recipe: import → "
        "surgery → fusion → split → quantize → compile → verify, cached and checked at every step.",
        epilog="exit codes: 0 ok, 1 build or check failed, 2 bad recipe or input")
    parser.add_argument("--version", action="version", version=f"npubuild {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="explain more (logs, tracebacks of bugs)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, func, help_text, *, recipe=True, build_opts=False, json_opt=False):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        if recipe:
            p.add_argument("recipe", type=Path, help="recipe YAML file")
        if build_opts:
            p.add_argument("--build-dir", type=Path, default=None, help="build root (default: ./build)")
            p.add_argument("--cache", type=Path, default=None,
                           help="content cache directory (default: $NPUBUILD_CACHE or ./.npubuild/cache)")
        if json_opt:
            p.add_argument("--json", action="store_true", help="print machine-readable JSON")
        p.add_argument("-v", "--verbose", action="store_true", default=argparse.SUPPRESS,
                       help="explain more")
        return p

    from npubuild.stages import STAGES

    p = command("run", cmd_run, "build the recipe up to STAGE (default: every stage)",
                build_opts=True, json_opt=True)
    p.add_argument("stage", nargs="?", choices=list(STAGES), help="last stage to build")
    p.add_argument("--wait", type=float, default=600.0, metavar="SECONDS",
                   help="how long to wait for another run holding the build directory (default 600)")
    p.add_argument("--target", action="append", default=[], metavar="CHIP",
                   help="matrix build: build for this chip too (repeatable); see also `targets:`")
    p.add_argument("-j", "--jobs", type=int, default=2, metavar="N",
                   help="matrix build: chips built in parallel (default 2)")
    p = command("validate", cmd_validate, "check recipes and the files they name; build nothing",
                recipe=False, json_opt=True)
    p.add_argument("recipes", type=Path, nargs="+", metavar="recipe",
                   help="recipe YAML file(s), e.g. the changed ones pre-commit passes")
    p = command("plan", cmd_plan, "say what `run` would do per stage, and why", build_opts=True,
                json_opt=True)
    p.add_argument("stage", nargs="?", choices=list(STAGES), help="last stage to consider")
    command("show", cmd_show, "stages (current or stale), artifacts and the last report",
            build_opts=True, json_opt=True)
    command("clean", cmd_clean, "delete the recipe's build directory (the cache is kept)",
            build_opts=True)
    p = command("schema", cmd_schema, "print a JSON Schema", recipe=False)
    p.add_argument("which", nargs="?", choices=["recipe", "chip"], default="recipe")
    p = command("targets", cmd_targets, "list the built-in target chips, or check a recipe's "
                "model against its chip", recipe=False, json_opt=True, build_opts=True)
    p.add_argument("--check", type=Path, metavar="RECIPE",
                   help="print every node's placement (npu/cpu) on the recipe's chip, with reasons")
    p = command("infer", cmd_infer, "run the deployed pipeline (NPU graphs in the simulator) on "
                "an input", build_opts=True,
                json_opt=True)
    p.add_argument("--input", action="append", required=True, metavar="[NAME=]FILE",
                   help="an image (preprocessed as the recipe says), a .npz of inputs by name, or "
                        "a .npy (NAME=FILE gives it to a named input); repeatable")
    p.add_argument("--output", type=Path, help="write the outputs to this .npz")
    p.add_argument("--float", action="store_true",
                   help="run the float submodels (no quantization, no simulator)")
    p = command("view", cmd_view, "open a stage's ONNX model in Netron (or print its path)",
                build_opts=True)
    p.add_argument("stage", nargs="?", default="fusion",
                   choices=["import", "surgery", "fusion", "split", "quantize"],
                   help="whose model (default: fusion, the whole model after rewrites)")
    p.add_argument("--graph", type=int, metavar="N", help="split/quantize: submodel N (default: the first)")
    p = command("diff", cmd_diff, "compare two recipes (or two git revisions of one): which "
                "stages differ and why, and how the metrics moved", recipe=False,
                build_opts=True, json_opt=True)
    p.add_argument("recipes", type=Path, nargs="+", metavar="RECIPE", help="A.yaml B.yaml, or one "
                   "recipe with --rev")
    p.add_argument("--rev", action="append", default=[], metavar="REV",
                   help="git revision of the recipe: REV (vs the working copy), A..B, or twice")
    p.add_argument("--markdown", action="store_true",
                   help="print a Markdown pull-request comment")
    return parser


# -- commands --------------------------------------------------------------------------------

def cmd_run(args) -> int:
    from npubuild import api

    from npubuild.recipe import load_recipe

    console = _console()
    loaded = load_recipe(args.recipe)
    targets = args.target or loaded.recipe.targets
    if targets:
        return _run_matrix(args, console, loaded, targets)
    session = api.session_for(loaded, build_root=args.build_dir, cache=args.cache,
                              progress=_progress(console), on_event=_stage_printer(console, args.json))
    try:
        report = api.build(session, args.stage, wait_seconds=args.wait,
                           on_wait=lambda msg: console.print(f"[yellow]{msg}[/]"))
    finally:
        if not args.json:
            _print_summary(console, session)
    if args.json:
        print(json.dumps(report, indent=2))
    return EXIT_OK


def _run_matrix(args, console, loaded, targets: list[str]) -> int:
    from npubuild.matrix import build_matrix, table

    for target in targets:
        loaded.for_target(target).chip()  # an unknown chip fails before anything is built
    console.print(f"matrix build of {loaded.recipe.name} on {', '.join(targets)}")
    cells = build_matrix(loaded, targets, args.stage, build_root=args.build_dir,
                         cache=args.cache, jobs=args.jobs)
    rows = table(cells)
    if args.json:
        print(json.dumps({"targets": rows, "cells": cells}, indent=2, default=str))
    else:
        headers = list(rows[0])
        print("| " + " | ".join(headers) + " |")
        print("|" + "|".join("---" for _ in headers) + "|")
        for row in rows:
            print("| " + " | ".join(_fmt(row[h]) for h in headers) + " |")
        for cell in cells:
            if not cell["ok"]:
                console.print(f"[red]{cell['target']}: {cell['error']}[/]")
    failed = [c for c in cells if not c["ok"]]
    return max((c["exit_code"] for c in failed), default=EXIT_OK)


def cmd_validate(args) -> int:
    """One recipe, or many (as pre-commit passes the changed ones): each is checked, every
    error is printed, and the exit code is the worst one."""
    from npubuild.recipe import load_recipe
    from npubuild.stages import importer

    results, worst = [], EXIT_OK
    for path in args.recipes:
        try:
            loaded = load_recipe(path)
            chip = loaded.chip()
            signature = importer.check_signature(loaded)
        except NpubuildError as exc:
            if len(args.recipes) == 1:
                raise
            print(f"error: {exc}", file=sys.stderr)
            worst = max(worst, exc.exit_code)
            continue
        results.append({"recipe": str(path), "name": loaded.recipe.name, "valid": True,
                        "model": str(loaded.model_path), "format": loaded.model_format,
                        "target": chip.name, **signature})
        if not args.json:
            print(f"{path}: valid — model {loaded.model_path.name} ({loaded.model_format}), "
                  f"target {chip.name}, {len(loaded.recipe.surgery)} surgery steps, "
                  f"{len(loaded.recipe.fusion)} fusion rules")
    if args.json:
        print(json.dumps(results[0] if len(args.recipes) == 1 else results, indent=2))
    return worst


def cmd_plan(args) -> int:
    from npubuild import api

    session = api.session_for(args.recipe, build_root=args.build_dir, cache=args.cache)
    results = api.plan(session, args.stage)
    if args.json:
        print(json.dumps({r.stage: {"action": r.status, "reason": r.reason, "key": r.key}
                          for r in results}, indent=2))
        return EXIT_OK
    console = _console()
    for r in results:
        style = STATUS_STYLE.get(r.status, "")
        reason = f" — {r.reason}" if r.reason else ""
        console.print(f"  {r.stage:<9} [{style}]{r.status}[/]{reason}" if style
                      else f"  {r.stage:<9} {r.status}{reason}")
    return EXIT_OK


def cmd_show(args) -> int:
    from npubuild import api

    info = api.show(api.session_for(args.recipe, build_root=args.build_dir, cache=args.cache))
    if args.json:
        print(json.dumps(info, indent=2))
        return EXIT_OK
    console = _console()
    console.print(f"{info['recipe']} → {info['build_dir']}")
    for name, entry in info["stages"].items():
        files = entry.get("files", {})
        shown = ", ".join(f"{rel} ({_size(b)})" for rel, b in list(files.items())[:4]
                          if rel != "manifest.json")
        more = f" +{len(files) - 5} more" if len(files) > 5 else ""
        console.print(f"  {name:<9} {entry['state']:<32} {shown}{more}", highlight=False)
    return EXIT_OK


def cmd_clean(args) -> int:
    from npubuild import api

    root = api.clean(api.session_for(args.recipe, build_root=args.build_dir, cache=args.cache))
    print(f"removed {root} (the cache is kept)")
    return EXIT_OK


def cmd_schema(args) -> int:
    from npubuild.schemas import schema_text

    sys.stdout.write(schema_text(args.which))
    return EXIT_OK


def cmd_targets(args) -> int:
    from npubuild.targets import describe, load_chip, preset_names

    if args.check:
        return _check_targets(args)
    chips = [describe(load_chip(name)) for name in preset_names()]
    if args.json:
        print(json.dumps(chips, indent=2))
        return EXIT_OK
    print(f"{'chip':<12} {'lanes':>5} {'LMEM':>9} {'clock':>9} {'TOPS':>6} {'ops':>4}  description")
    for c in chips:
        print(f"{c['name']:<12} {c['lanes']:>5} {_size(c['lmem_bytes']):>9} {c['clock_mhz']:>5g} MHz "
              f"{c['tops_int8']:>6g} {c['ops']:>4}  {c['description']}")
    return EXIT_OK


def _check_targets(args) -> int:
    from npubuild import api

    session = api.session_for(args.check, build_root=args.build_dir, cache=args.cache)
    nodes = api.placements(session)
    if args.json:
        print(json.dumps([n.as_dict() for n in nodes], indent=2))
        return EXIT_OK
    on_npu = sum(n.device == "npu" for n in nodes)
    print(f"{args.check}: {on_npu} of {len(nodes)} nodes on the NPU ({session.chip.name})")
    for n in nodes:
        reasons = "; ".join(n.reasons)
        print(f"  {n.device}  {n.op:<18} {n.name}" + (f"  — {reasons}" if reasons else ""))
    return EXIT_OK


def cmd_infer(args) -> int:
    import numpy as np

    from npubuild import api

    session = api.session_for(args.recipe, build_root=args.build_dir, cache=args.cache)
    feeds = api.load_inputs(session, args.input)
    outputs = api.infer(session, feeds, deployed=not args.float)
    if args.output:
        from npubuild.atomic import atomic_path

        with atomic_path(args.output) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, **outputs)
    summary = {k: {"shape": list(v.shape), "dtype": str(v.dtype), "min": float(v.min()),
                   "max": float(v.max()), "mean": float(v.mean())} for k, v in outputs.items()}
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for k, v in summary.items():
            print(f"{k}: shape {v['shape']} {v['dtype']}  min {v['min']:.4g}  max {v['max']:.4g}  "
                  f"mean {v['mean']:.4g}")
    return EXIT_OK


def cmd_view(args) -> int:
    import importlib.util

    from npubuild import api

    session = api.session_for(args.recipe, build_root=args.build_dir, cache=args.cache)
    path = api.model_file(session, args.stage, args.graph)
    if importlib.util.find_spec("netron") is None:
        print(path)
        print("Netron is not installed: `pip install netron` (or npubuild[view]) to open it here, "
              "or open the file above in any ONNX viewer", file=sys.stderr)
        return EXIT_OK
    import netron

    host, port = netron.start(str(path))  # serves the file and opens the browser
    print(path)
    print(f"Netron: http://{host}:{port} (Ctrl+C stops it)", file=sys.stderr)
    netron.wait()
    return EXIT_OK


def cmd_diff(args) -> int:
    from contextlib import ExitStack

    from npubuild import api
    from npubuild.diff import diff_recipes, render
    from npubuild.recipe import load_recipe

    with ExitStack() as stack:
        paths, labels = api.diff_inputs(args.recipes, args.rev, stack)
        loaded = [load_recipe(p) for p in paths]
        result = diff_recipes(*loaded, lambda r: api.session_for(
            r, build_root=args.build_dir, cache=args.cache), labels=labels)
    if args.json:
        print(json.dumps(result, indent=2, ensure_ascii=False))
    else:
        sys.stdout.write(render.markdown(result) if args.markdown else render.text(result))
    return EXIT_OK


def _fmt(value) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "-" if value is None else str(value)


# -- output helpers --------------------------------------------------------------------------

def _console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def _progress(console):
    """Wrap long stage loops in a progress bar when stderr is a terminal."""

    def progress(items, total=None, description=""):
        if not console.is_terminal:
            yield from items
            return
        from rich.progress import track

        yield from track(items, total=total, description=description, console=console,
                         transient=True)

    return progress


def _stage_printer(console, quiet: bool):
    """One line per stage that ran; a spinner while a stage runs (on a terminal)."""
    spinner = {}

    def on_event(result) -> None:
        if "status" in spinner:
            spinner.pop("status").stop()
        if quiet:
            return
        if result.status == "running" and console.is_terminal:
            spinner["status"] = console.status(f"{result.stage}: running ({result.reason})")
            spinner["status"].start()
        if result.status not in ("built", "restored", "failed"):
            return
        style = STATUS_STYLE.get(result.status, "yellow")
        seconds = f"{result.seconds:7.2f} s" if result.seconds else " " * 9
        reason = f"  ({result.reason})" if result.reason and result.status != "failed" else ""
        console.print(f"  {result.stage:<9} [{style}]{result.status:<10}[/] {seconds}{reason}")

    return on_event


def _print_summary(console, session) -> None:
    results = session.results.values()
    ran = [r for r in results if r.status in ("built", "restored")]
    cached = [r.stage for r in results if r.status == "cached"]
    if not ran and cached and session.error is None:
        console.print(f"nothing to rebuild: {', '.join(cached)} up to date")
    elif cached:
        console.print(f"  cached: {', '.join(cached)}", style="dim")
    missing = [r.stage for r in results if r.status.startswith("not built: not implemented")]
    if missing:
        console.print(f"not built (not implemented yet): {', '.join(missing)}", style="yellow")
    skipped = [r.stage for r in results if r.status == "skipped"]
    if skipped:
        console.print(f"skipped after the failure: {', '.join(skipped)}", style="yellow")
    if session.error is None:
        console.print(f"artifacts in {session.paths.root}/, report: {session.paths.report}")


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


if __name__ == "__main__":
    sys.exit(main())
