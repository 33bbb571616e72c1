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
from npubuild.commands import command_modules
from npubuild.commands.output import EXIT_FAILED, EXIT_OK, error_object
from npubuild.errors import NpubuildError, UserError, machine_error

EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a command killed by SIGPIPE


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        args = build_parser(_command_named(argv)).parse_args(argv)
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


def _drop_stdout() -> None:
    """Point stdout at /dev/null so the interpreter's final flush does not fail again."""
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())


class UsageError(UserError):
    """A command line argparse cannot parse (exit 2, like any bad input)."""


class Parser(argparse.ArgumentParser):
    """argparse that raises instead of exiting, so --json can still answer with a document."""

    def error(self, message):
        raise UsageError(message + _suggestion(message), hint=f"see `{self.prog} --help`")


def _suggestion(message: str) -> str:
    """argparse's "invalid choice: 'rnu' (choose from 'run', ...)" gets "; did you mean 'run'?"
    (commands, stages, schema names, actions: every choice the command line takes)."""
    import re

    from npubuild.errors import did_you_mean

    found = re.search(r"invalid choice: '([^']*)' \(choose from (.*)\)$", message)
    if not found or "did you mean" in message:
        return ""
    return did_you_mean(found[1], re.findall(r"'([^']*)'", found[2]))


def _command_named(argv: list[str]) -> str | None:
    """The command a command line names: its first word that is not an option (the global
    options take no value), if it is one of `npubuild.commands.COMMANDS`."""
    from npubuild.commands import COMMANDS

    word = next((arg for arg in argv if not arg.startswith("-")), None)
    return word if word in COMMANDS else None


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser: global options, then one subcommand per module of `npubuild.commands`.
    Given the ``command`` a command line names, only that subcommand gets its arguments (the
    others are listed, with their help, and never parse this line): adding every command's
    options costs each run, a no-op included, about 10 ms. Without it, every subcommand gets
    them (completion scripts read them all)."""
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
    for module in command_modules():
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        p.set_defaults(func=module.run)
        if command in (None, module.NAME):
            _add_shared_options(p, **module.OPTIONS)
            module.add_arguments(p)
    return parser


def _add_shared_options(p, *, recipe=True, build_opts=False, json_opt=False) -> None:
    """The options many commands take: a recipe, where to build and cache, --json, -v/-q."""
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


if __name__ == "__main__":
    sys.exit(main())
