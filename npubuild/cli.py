"""`npubuild` command line: parse, call the library, print, map errors to exit codes.

Exit codes: 0 ok · 1 a build or a check failed · 2 bad recipe or bad input.
Errors print as one ``error:`` message (file:line:column: field: what, and a hint), never a
traceback; ``-v`` adds the traceback of unexpected errors for bug reports.

Results go to stdout, progress and logs to stderr (``-q`` silences them). Off a terminal, or
with ``NO_COLOR`` set, nothing is wrapped or styled. ``--json`` prints exactly one JSON
document on stdout, with an ``error`` object when the command fails.
"""

from __future__ import annotations

import argparse
import errno
import json
import logging
import os
import sys
import traceback
from pathlib import Path

from npubuild import __version__
from npubuild.errors import NpubuildError, UserError, machine_error

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a command killed by SIGPIPE

STATUS_STYLE = {"built": "green", "restored": "cyan", "cached": "dim", "failed": "bold red",
                "will run": "yellow", "will restore": "cyan"}


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        return _report_error(exc, argparse.Namespace(json="--json" in argv, verbose=0))
    logging.basicConfig(level=_log_level(args), format="%(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    try:
        code = args.func(args) or EXIT_OK
        sys.stdout.flush()  # a closed pipe shows here, inside the handler, not at exit
        return code
    except BrokenPipeError:  # `npubuild plan --json R | head`: the reader has enough
        _drop_stdout()
        return EXIT_BROKEN_PIPE
    except NpubuildError as exc:
        return _report_error(exc, args)
    except Exception as exc:  # a bug: one line for users, the traceback with -v
        return _report_error(exc, args)
    except KeyboardInterrupt:
        print("error: interrupted; finished stages are kept, the interrupted one left nothing "
              "behind", file=sys.stderr)
        return 130


def _log_level(args) -> int:
    if getattr(args, "quiet", False):
        return logging.ERROR
    return {0: logging.WARNING, 1: logging.INFO}.get(args.verbose, logging.DEBUG)


# A full disk or quota, a read-only or vanished file system: told as such, never as a bug
MACHINE_ERRNOS = (errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EIO)


def _report_error(exc: Exception, args) -> int:
    """One ``error:`` message on stderr; with --json also the one JSON document on stdout (what
    the command had so far, in ``args.partial``, plus an ``error`` object)."""
    if isinstance(exc, OSError) and exc.errno in MACHINE_ERRNOS:  # the machine, not a bug
        exc = machine_error(exc)
    known = isinstance(exc, NpubuildError)
    if args.verbose and (exc.__cause__ is not None or not known):
        traceback.print_exception(exc.__cause__ or exc, file=sys.stderr)
    text = str(exc) if known else (f"internal error: {type(exc).__name__}: {exc}\n  hint: this is "
                                   "a bug in npubuild; rerun with -v and report the traceback")
    code = exc.exit_code if known else EXIT_FAILED
    if getattr(args, "json", False):
        doc = {**(getattr(args, "partial", None) or {}), "error": error_object(exc, code)}
        try:
            print(json.dumps(doc, indent=2, default=str))
            sys.stdout.flush()
        except BrokenPipeError:
            _drop_stdout()
    print(f"error: {text}", file=sys.stderr)
    return code


def error_object(exc: Exception, exit_code: int) -> dict:
    """The ``error`` member of a --json document."""
    if not isinstance(exc, NpubuildError):
        return {"kind": "internal", "exit_code": exit_code,
                "message": f"{type(exc).__name__}: {exc}"}
    out = {"kind": "user" if exc.exit_code == EXIT_BAD_INPUT else "build",
           "exit_code": exit_code, "message": exc.message}
    if exc.location is not None:
        out["location"] = {"file": exc.location.file, "line": exc.location.line,
                           "column": exc.location.column}
    for name in ("field", "hint", "stage"):
        if getattr(exc, name, None):
            out[name] = getattr(exc, name)
    return out


def _drop_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


class UsageError(UserError):
    """A command line argparse cannot parse (exit 2, like any bad input)."""


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so --json can still answer with a document."""

    def error(self, message):
        raise UsageError(message, hint=f"see `{self.prog} --help`")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(
        prog="npubuild", description="Build an NPU deployment from a YAML recipe: import → "
        "surgery → fusion → split → quantize → compile → verify, cached and checked at every step.",
        epilog="exit codes: 0 ok, 1 build or check failed, 2 bad recipe or input")
    parser.add_argument("--version", action="version", version=f"npubuild {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0,
                        help="explain more (logs; tracebacks of bugs); -vv for debug logs")
    parser.add_argument("-q", "--quiet", action="store_true",
                        help="no progress or log lines on stderr (errors still)")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name, func, help_text, *, recipe=True, build_opts=False, json_opt=False):
        p = sub.add_parser(name, help=help_text, description=help_text)
        p.set_defaults(func=func)
        if recipe:
            p.add_argument("recipe", type=Path, help="recipe YAML file")
        if build_opts:
            p.add_argument("--build-dir", type=Path, default=None, help="build root (default: ./build)")
            p.add_argument("--cache", default=None, metavar="DIR|URL",
                           help="content cache directory (default: $NPUBUILD_CACHE or ./.npubuild/cache); "
                                "a URL (s3://bucket/prefix, gs://…, file://…) is a shared remote "
                                "level behind the default local cache")
            p.add_argument("--remote", default=None, metavar="URL",
                           help="shared remote cache on fsspec (default: $NPUBUILD_REMOTE); "
                                "credentials come from the usual AWS_*/fsspec environment")
        if json_opt:
            p.add_argument("--json", action="store_true", help="print machine-readable JSON")
        p.add_argument("-v", "--verbose", action="count", default=argparse.SUPPRESS,
                       help="explain more")
        p.add_argument("-q", "--quiet", action="store_true", default=argparse.SUPPRESS,
                       help="no progress or log lines")
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
    p.add_argument("--scheduler", default=None, metavar="ADDRESS",
                   help="run matrix cells, calibration and verify batches on Dask: tcp://HOST:PORT, or "
                        "local:N for a local cluster of N workers (default: $NPUBUILD_SCHEDULER)")
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
    from npubuild.schemas import NAMES as SCHEMA_NAMES

    p.add_argument("which", nargs="?", choices=SCHEMA_NAMES, default="recipe")
    p = command("targets", cmd_targets, "list the built-in target chips (`targets`), or check a "
                "recipe's model against its chip (`targets check R`)", recipe=False,
                json_opt=True, build_opts=True)
    p.add_argument("action", nargs="?", choices=["list", "check"], default="list",
                   help="list (default) or check")
    p.add_argument("check_recipe", nargs="?", type=Path, metavar="RECIPE",
                   help="for check: print every node's placement (npu/cpu) on the recipe's chip, "
                        "with reasons")
    p.add_argument("--check", type=Path, metavar="RECIPE", help=argparse.SUPPRESS)  # old spelling
    p = command("infer", cmd_infer, "run the deployed pipeline (NPU graphs in the simulator) on "
                "an input", build_opts=True,
                json_opt=True)
    p.add_argument("--input", action="append", required=True, metavar="[NAME=]FILE",
                   help="an image (preprocessed as the recipe says), a .npz of inputs by name, or "
                        "a .npy (NAME=FILE gives it to a named input); repeatable")
    p.add_argument("--output", type=Path, help="write the outputs to this .npz")
    p.add_argument("--float", action="store_true",
                   help="run the float submodels (no quantization, no simulator)")
    p = command("cache", cmd_cache, "the content caches: check every entry (verify), remove "
                "orphans and corrupt entries (gc), and per recipe: where its stages are (status), "
                "upload them to the remote (push), download them (pull)",
                recipe=False, build_opts=True, json_opt=True)
    p.add_argument("action", choices=["verify", "gc", "status", "push", "pull"],
                   help="verify: re-hash every entry; gc: remove what verify finds bad and the "
                        ".tmp-* that killed runs left; status/push/pull RECIPE: its stages between "
                        "the build, the local cache and the remote (--remote)")
    p.add_argument("recipe", type=Path, nargs="?", help="recipe YAML file (status, push, pull)")
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

def _session(args, recipe, **options):
    """A build session with the command's --build-dir, --cache and --remote."""
    from npubuild import api

    return api.session_for(recipe, build_root=args.build_dir, cache=args.cache,
                           remote=args.remote, **options)


def cmd_run(args) -> int:
    from npubuild import api
    from npubuild.recipe import load_recipe

    console = _console(args)
    loaded = load_recipe(args.recipe)
    targets = args.target or loaded.recipe.targets
    if targets:
        return _run_matrix(args, console, loaded, targets)
    from npubuild.distributed import resolve_scheduler

    session = _session(args, loaded, scheduler=resolve_scheduler(args.scheduler),
                       progress=_progress(console), on_event=_stage_printer(console))
    try:
        report = api.build(session, args.stage, wait_seconds=args.wait,
                           on_wait=lambda msg: console.print(msg, style="yellow", markup=False))
    except NpubuildError:
        args.partial = _written_report(session)
        if session.results:  # a stage failed: say what ran (a bad recipe printed no stages)
            _print_progress_summary(console, session)
            _print_headline(args, session)
        raise
    if args.json:
        print(json.dumps(report, indent=2))
        return EXIT_OK
    _print_progress_summary(console, session)
    _print_headline(args, session)
    return EXIT_OK


def _written_report(session) -> dict:
    """report.json as the failed run left it (empty when it was not written)."""
    from npubuild.build.keys import read_manifest

    return read_manifest(session.paths.report) or {}


def _print_headline(args, session) -> None:
    """The run's result on stdout: verdict, worst cosine, NPU coverage, fps, GMEM, the page."""
    from npubuild.report.summary import headline_lines

    if args.json:
        return
    for line in headline_lines(session.paths.root):
        print(line)
    if session.paths.report_html.is_file():
        print(f"report: {session.paths.report_html}")


def _cache_sync(args) -> int:
    from npubuild.build import sync

    if args.recipe is None:
        raise UserError(f"npubuild cache {args.action} needs a recipe",
                        hint=f"npubuild cache {args.action} recipes/yolov8.yaml --remote s3://bucket/prefix")
    session = _session(args, args.recipe)
    result = getattr(sync, args.action)(session)
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


def _run_matrix(args, console, loaded, targets: list[str]) -> int:
    from npubuild.distributed import resolve_scheduler
    from npubuild.matrix import build_matrix, table

    for target in targets:
        loaded.for_target(target).chip()  # an unknown chip fails before anything is built
    console.print(f"matrix build of {loaded.recipe.name} on {', '.join(targets)}", markup=False)
    cells = build_matrix(loaded, targets, args.stage, build_root=args.build_dir,
                         cache=args.cache, jobs=args.jobs, remote=args.remote,
                         scheduler=resolve_scheduler(args.scheduler))
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
                console.print(f"{cell['target']}: {cell['error']}", style="red", markup=False)
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
            args.partial = {"recipe": str(path), "valid": False}
            loaded = load_recipe(path)
            chip = loaded.chip()
            signature = importer.check_signature(loaded)
        except NpubuildError as exc:
            if len(args.recipes) == 1:
                raise
            print(f"error: {exc}", file=sys.stderr)
            results.append({**args.partial, "error": error_object(exc, exc.exit_code)})
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

    session = _session(args, args.recipe)
    results = api.plan(session, args.stage)
    if args.json:
        print(json.dumps({r.stage: {"action": r.status, "reason": r.reason, "key": r.key}
                          for r in results}, indent=2))
        return EXIT_OK
    out = _console(args, stdout=True)
    for r in results:
        reason = f" — {r.reason}" if r.reason else ""
        out.print(_line(f"  {r.stage:<9} ", (r.status, STATUS_STYLE.get(r.status, "")), reason))
    return EXIT_OK


def cmd_show(args) -> int:
    from npubuild import api

    info = api.show(_session(args, args.recipe))
    if args.json:
        print(json.dumps(info, indent=2))
        return EXIT_OK
    console = _console(args, stdout=True)
    console.print(f"{info['recipe']} → {info['build_dir']}", markup=False)
    for name, entry in info["stages"].items():
        files = entry.get("files", {})
        shown = ", ".join(f"{rel} ({_size(b)})" for rel, b in list(files.items())[:4]
                          if rel != "manifest.json")
        more = f" +{len(files) - 5} more" if len(files) > 5 else ""
        console.print(f"  {name:<9} {entry['state']:<32} {shown}{more}", markup=False)
    return EXIT_OK


def cmd_clean(args) -> int:
    from npubuild import api

    root = api.clean(_session(args, args.recipe))
    print(f"removed {root} (the cache is kept)")
    return EXIT_OK


def cmd_schema(args) -> int:
    from npubuild.schemas import schema_text

    sys.stdout.write(schema_text(args.which))
    return EXIT_OK


def cmd_targets(args) -> int:
    from npubuild.targets import describe, load_chip, preset_names

    if args.action == "check" or args.check:
        recipe = args.check_recipe or args.check
        if recipe is None:
            raise UserError("`targets check` needs a recipe", hint="npubuild targets check R.yaml")
        return _check_targets(args, recipe)
    if args.check_recipe:
        raise UserError(f"unexpected {args.check_recipe}: `targets` lists chips",
                        hint="to check a recipe: npubuild targets check R.yaml")
    chips = [describe(load_chip(name)) for name in preset_names()]
    if args.json:
        print(json.dumps(chips, indent=2))
        return EXIT_OK
    print(f"{'chip':<12} {'lanes':>5} {'LMEM':>9} {'clock':>9} {'TOPS':>6} {'ops':>4}  description")
    for c in chips:
        print(f"{c['name']:<12} {c['lanes']:>5} {_size(c['lmem_bytes']):>9} {c['clock_mhz']:>5g} MHz "
              f"{c['tops_int8']:>6g} {c['ops']:>4}  {c['description']}")
    return EXIT_OK


def _check_targets(args, recipe: Path) -> int:
    from npubuild import api

    session = _session(args, recipe)
    nodes = api.placements(session)
    if args.json:
        print(json.dumps([n.as_dict() for n in nodes], indent=2))
        return EXIT_OK
    on_npu = sum(n.device == "npu" for n in nodes)
    print(f"{recipe}: {on_npu} of {len(nodes)} nodes on the NPU ({session.chip.name})")
    for n in nodes:
        reasons = "; ".join(n.reasons)
        print(f"  {n.device}  {n.op:<18} {n.name}" + (f"  — {reasons}" if reasons else ""))
    return EXIT_OK


def cmd_infer(args) -> int:
    import numpy as np

    from npubuild import api

    session = _session(args, args.recipe)
    feeds = api.load_inputs(session, args.input)
    outputs = api.infer(session, feeds, deployed=not args.float)
    if args.output:
        from npubuild.atomic import atomic_path

        with atomic_path(args.output) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, **outputs)
    summary = api.array_summary(outputs)
    if args.json:
        print(json.dumps(summary, indent=2))
    else:
        for k, v in summary.items():
            print(f"{k}: shape {v['shape']} {v['dtype']}  min {v['min']:.4g}  max {v['max']:.4g}  "
                  f"mean {v['mean']:.4g}")
    return EXIT_OK


def cmd_cache(args) -> int:
    if args.action in ("status", "push", "pull"):
        return _cache_sync(args)
    from npubuild import api

    checks = api.cache_check(args.cache) if args.action == "verify" else api.cache_gc(args.cache)
    bad = [c for c in checks if c.problem]
    good = [c for c in checks if not c.problem]
    if args.json:
        print(json.dumps({"action": args.action, "entries": len(good) + len(bad) - sum(c.orphan for c in bad),
                          "bytes": sum(c.bytes for c in checks),
                          "problems": [{"path": str(c.path), "key": c.key, "bytes": c.bytes,
                                        "problem": c.problem, "orphan": c.orphan} for c in bad]},
                         indent=2))
    else:
        verb = "removed" if args.action == "gc" else "bad"
        for c in bad:
            print(f"  {verb}: {c.path} ({_size(c.bytes)}): {c.problem}")
        if args.action == "verify":
            print(f"{len(good)} good entries ({_size(sum(c.bytes for c in good))}), {len(bad)} bad "
                  f"({_size(sum(c.bytes for c in bad))})" + ("; `npubuild cache gc` removes them"
                                                             if bad else ""))
        else:
            print(f"removed {sum(not c.orphan for c in bad)} corrupt entries and "
                  f"{sum(c.orphan for c in bad)} orphans ({_size(sum(c.bytes for c in bad))}); "
                  f"kept {len(good)} entries ({_size(sum(c.bytes for c in good))})")
    return EXIT_FAILED if args.action == "verify" and bad else EXIT_OK


def cmd_view(args) -> int:
    import importlib.util

    from npubuild import api

    session = _session(args, args.recipe)
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
        result = diff_recipes(*loaded, lambda r: _session(args, r), labels=labels)
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

def _console(args, *, stdout: bool = False):
    """A rich console on stderr (progress, logs; silent with -q) or stdout (results). Off a
    terminal or with NO_COLOR set it writes plain text: no styles, no control codes; it never
    wraps lines (a file name stays whole when output goes to a file)."""
    from rich.console import Console

    stream = sys.stdout if stdout else sys.stderr
    plain = not stream.isatty() or bool(os.environ.get("NO_COLOR"))
    return Console(file=stream, highlight=False, soft_wrap=True, emoji=False,
                   color_system=None if plain else "auto", no_color=plain,
                   quiet=not stdout and getattr(args, "quiet", False))


def _line(*parts):
    """A line of plain strings and (text, style) pairs, safe from rich markup ([brackets])."""
    from rich.text import Text

    return Text.assemble(*parts)


def _progress(console):
    """Progress bars on a terminal, counted in what a stage loops over (samples, steps)."""

    def progress(items, total=None, description=""):
        if not console.is_terminal or console.quiet:
            yield from items
            return
        from rich.progress import track

        yield from track(items, total=total, description=description, console=console,
                         transient=True)

    return progress


def _stage_printer(console):
    """One line when a stage starts (a spinner on a terminal) and one when it is done; a stage
    whose own check fails (verify) is shown failed, never built."""
    spinner = {}

    def on_event(result) -> None:
        if "status" in spinner:
            spinner.pop("status").stop()
        if result.status == "running":
            if console.is_terminal and not console.quiet:
                spinner["status"] = console.status(f"{result.stage}: running ({result.reason})")
                spinner["status"].start()
            else:
                console.print(f"  {result.stage:<9} started    ({result.reason})", markup=False)
            return
        if result.status not in ("built", "restored", "failed"):
            return
        status = result.status if result.passed else "failed"
        seconds = f"{result.seconds:7.2f} s" if result.seconds else " " * 9
        reason = f"  ({result.reason})" if result.reason and status != "failed" else ""
        console.print(_line(f"  {result.stage:<9} ", (f"{status:<10}", STATUS_STYLE[status]),
                            f" {seconds}{reason}"))

    return on_event


def _print_progress_summary(console, session) -> None:
    """What this run did not build (cached, skipped, not implemented), on stderr."""
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


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


if __name__ == "__main__":
    sys.exit(main())
