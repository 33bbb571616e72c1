"""What commands share: exit codes, the build session of a command's options, and output
(a rich console that is plain off a terminal, progress bars, stage lines, sizes)."""

from __future__ import annotations

import os
import sys

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT = 0, 1, 2

STATUS_STYLE = {"built": "green", "restored": "cyan", "current": "dim", "failed": "bold red",
                "will run": "yellow", "will restore": "cyan"}


def session_for(args, recipe, **options):
    """A build session with the command's --build-dir, --cache and --remote."""
    from npubuild import api

    return api.session_for(recipe, build_root=args.build_dir, cache=args.cache,
                           remote=args.remote, **options)


def print_headline(args, result) -> None:
    """The run's result (`npubuild.facade.Result`) on stdout: verdict, worst cosine, NPU
    coverage, fps, GMEM, the page."""
    from npubuild.report.summary import headline_lines

    if args.json or not result.stages:  # a bad recipe built nothing: no headline
        return
    for line in headline_lines(result.build_dir):
        print(line)
    if result.report_html is not None:
        print(f"report: {result.report_html}")


def fmt(value) -> str:
    """A table cell: floats below 1,000 to 6 significant digits, larger numbers whole with
    separators, None as '-', other values as YAML would write them ([1, 3, 8, 8])."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)) and abs(value) >= 1000:
        return f"{value:,.0f}"
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, (list, dict)):
        import json

        return json.dumps(value, separators=(", ", ": "))
    return "-" if value is None else str(value)


def print_table(rows: list[dict]) -> None:
    """Rows of equal keys as a Markdown table on stdout (a terminal and a PR comment read it)."""
    if not rows:
        return
    headers = list(rows[0])
    print("| " + " | ".join(headers) + " |")
    print("|" + "|".join("---" for _ in headers) + "|")
    for r in rows:
        print("| " + " | ".join(fmt(r[h]).replace("|", "\\|") for h in headers) + " |")


def console(args, *, stdout: bool = False):
    """A rich console on stderr (progress, logs; silent with -q) or stdout (results). Off a
    terminal or with NO_COLOR set it writes plain text: no styles, no control codes; it never
    wraps lines (a file name stays whole when output goes to a file)."""
    from rich.console import Console

    stream = sys.stdout if stdout else sys.stderr
    plain = not stream.isatty() or bool(os.environ.get("NO_COLOR"))
    return Console(file=stream, highlight=False, soft_wrap=True, emoji=False,
                   color_system=None if plain else "auto", no_color=plain,
                   quiet=not stdout and getattr(args, "quiet", False))


def line(*parts):
    """A line of plain strings and (text, style) pairs, safe from rich markup ([brackets])."""
    from rich.text import Text

    return Text.assemble(*parts)


def progress(out, state: dict | None = None):
    """Progress bars on a terminal with a counter (12/44), labelled with the stage that runs
    them (``quantize: calibrating``); off a terminal, with -v, one log line per tenth of a
    long loop (``quantize: calibrating 30/300``)."""
    import logging

    log = logging.getLogger("npubuild")
    state = state if state is not None else {}

    def bar(items, total=None, description=""):
        stage = state.get("stage")
        label = (f"{stage}: {description}" if stage and not description.startswith(stage)
                 else description)
        if not out.is_terminal or out.quiet:
            step = max((total or 0) // 10, 1)
            for i, item in enumerate(items, 1):
                yield item
                if total and total >= 20 and (i % step == 0 or i == total):
                    log.info("%s %d/%d", label, i, total)
                elif total is None and i % 10 == 0:  # an open-ended count (the precision search)
                    log.info("%s %d", label, i)
            return
        from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TextColumn,
                                   TimeElapsedColumn)

        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                   TimeElapsedColumn())
        with Progress(*columns, console=out, transient=True) as shown:
            yield from shown.track(items, total=total, description=label)

    return bar


def why(status: str, reason: str) -> str:
    """`npubuild.report.summary.stage_reason`: one wording for every command and the report."""
    from npubuild.report.summary import stage_reason

    return stage_reason(status, reason)


def stage_printer(out, state: dict | None = None):
    """One line when a stage starts (a spinner on a terminal) and one when it is done; a stage
    whose own check fails (verify) is shown failed, never built. With -v each finished stage
    also logs what it decided (`npubuild.report.summary.stage_summary`) and its key; ``state``
    shares the running stage with `progress`, which labels its bars with it."""
    import logging

    from npubuild.report.summary import stage_summary

    spinner, state = {}, state if state is not None else {}
    log = logging.getLogger("npubuild")

    def on_event(result) -> None:
        if "status" in spinner:
            spinner.pop("status").stop()
        if result.status == "running":
            state["stage"] = result.stage
            if out.is_terminal and not out.quiet:
                spinner["status"] = out.status(f"{result.stage}: running "
                                               f"({why('running', result.reason)})")
                spinner["status"].start()
            else:
                out.print(f"  {result.stage:<9} started    ({why('running', result.reason)})",
                          markup=False)
            return
        state.pop("stage", None)
        if result.status not in ("built", "restored", "failed", "current"):
            return
        if result.status == "current":
            log.info("%s: current (key %s), nothing to do", result.stage, (result.key or "")[:12])
            return
        status = result.status if result.passed else "failed"
        seconds = f"{result.seconds:7.2f} s" if result.seconds else " " * 9
        reason = (f"  ({why(result.status, result.reason)})"
                  if result.reason and status != "failed" else "")
        out.print(line(f"  {result.stage:<9} ", (f"{status:<10}", STATUS_STYLE[status]),
                       f" {seconds}{reason}"))
        summary = stage_summary(result.stage, result.report)
        log.info("%s: %s in %.2f s (key %s)%s", result.stage, status, result.seconds,
                 (result.key or "")[:12], f": {summary}" if summary else "")

    return on_event


def print_progress_summary(out, result) -> None:
    """What this run (`npubuild.facade.Result`) did not build (current, skipped, not
    implemented), on stderr."""
    results = result.stages.values()
    ran = [r for r in results if r.status in ("built", "restored")]
    current = [r.stage for r in results if r.status == "current"]
    if not ran and current and result.error is None:
        out.print(f"nothing to rebuild: {', '.join(current)} current")
    elif current:
        out.print(f"  current: {', '.join(current)}", style="dim")
    missing = [r.stage for r in results if r.status.startswith("not built: not implemented")]
    if missing:
        out.print(f"not built (not implemented yet): {', '.join(missing)}", style="yellow")
    skipped = [r.stage for r in results if r.status == "skipped"]
    if skipped:
        out.print(f"skipped after the failure: {', '.join(skipped)}", style="yellow")


def size(n: float) -> str:
    """Bytes as B, KiB, MiB or GiB."""
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return str(n)


def error_object(exc: Exception, exit_code: int) -> dict:
    """The ``error`` member of a --json document."""
    from npubuild.errors import NpubuildError

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
