"""Recipe → doit tasks, and running them through doit's API (`TaskLoader2` + `DoitMain`).

One task per implemented stage, named ``<recipe name>:<stage>``. Tasks declare artifacts, not
orderings: a stage's ``file_dep`` is its upstream stages' manifests (the targets of those
tasks) plus the external files it reads, so doit derives the order; its ``uptodate`` check is
the stage's content key (`BuildSession.is_current`). doit's own state lives in an SQLite file
inside ``build/<name>/``, a backend that tolerates concurrent readers.
"""

from __future__ import annotations

import logging
import os
import stat
import sys
from contextlib import contextmanager
from typing import Iterator

from doit.cmd_base import TaskLoader2
from doit.doit_cmd import DoitMain
from doit.exceptions import TaskFailed
from doit.task import dict_to_task

from npubuild.engine.session import BuildSession
from npubuild.errors import BuildError, NpubuildError, UserError, machine_error, unexpected
from npubuild.stages import Stage


def task_name(session: BuildSession, stage: Stage) -> str:
    return f"{session.loaded.recipe.name}:{stage.name}"


def buildable(stages: tuple[Stage, ...]) -> tuple[Stage, ...]:
    """The leading run of implemented stages (a stage after a missing one cannot be built)."""
    out = []
    for stage in stages:
        if not stage.implemented:
            break
        out.append(stage)
    return tuple(out)


def stage_task_dicts(session: BuildSession, stages: tuple[Stage, ...]) -> Iterator[dict]:
    """doit task dictionaries (sub-tasks of the recipe's name) for ``stages``."""
    for stage in buildable(stages):
        yield {
            "name": task_name(session, stage),
            "doc": stage.description,
            "actions": [(_action, (session, stage))],
            "file_dep": [str(session.paths.manifest(u)) for u in stage.needs]
                        + _existing_inputs(session, stage),
            "targets": [str(session.paths.manifest(stage.name))],
            "uptodate": [(_uptodate, (session, stage))],
            "verbosity": 2,  # never capture: stages report through callbacks
        }


def _existing_inputs(session: BuildSession, stage: Stage) -> list[str]:
    """The stage's external files that exist; a missing one fails the stage's own action with
    npubuild's message (doit would stop on a missing file_dep with its own wording)."""
    try:
        files = stage.external_files(session.loaded)
    except NpubuildError:
        return []
    return [str(p) for p in files if p.is_file()]


def _uptodate(session: BuildSession, stage: Stage) -> bool:
    """Current or not; a check that cannot decide says "not current", and the action then
    meets the same problem and reports it through npubuild's errors (doit would print a
    traceback and carry on)."""
    try:
        return session.is_current(stage)
    except Exception:  # noqa: BLE001 — re-raised by the action, where it is reported
        return False


def _action(session: BuildSession, stage: Stage):
    """Run one stage; a failure is kept on the session (doit would print a traceback)."""
    try:
        session.execute(stage)
    except NpubuildError as exc:
        return _fail(session, stage, exc)
    except OSError as exc:  # the machine, not npubuild: a full disk, a read-only build dir
        return _fail(session, stage, machine_error(exc, stage.name))
    except Exception as exc:  # a library error a stage did not translate: that stage failed
        return _fail(session, stage, unexpected(exc, stage.name))
    return True


def _fail(session: BuildSession, stage: Stage, exc: NpubuildError) -> TaskFailed:
    from npubuild.engine.session import StageResult

    session.error = exc
    session._record(StageResult(stage.name, "failed", reason=exc.message))
    return TaskFailed(str(exc))


class SessionLoader(TaskLoader2):
    """Feeds doit the tasks of one build session."""

    def __init__(self, session: BuildSession, tasks: list, num_process: int = 0):
        super().__init__()
        self.session, self.tasks, self.num_process = session, tasks, num_process

    def load_doit_config(self) -> dict:
        return {"dep_file": str(self.session.paths.doit_db), "backend": "sqlite3",
                "reporter": "zero", "verbosity": 2, "num_process": self.num_process}

    def load_tasks(self, cmd, pos_args):
        return self.tasks


def run_with_doit(session: BuildSession, stages: tuple[Stage, ...]) -> int:
    """Build ``stages`` through doit; returns doit's exit code (errors stay on the session)."""
    targets = [task_name(session, s) for s in buildable(stages)]
    if not targets:
        return 0
    # made before doit runs: an error here (a data glob that matches nothing) is npubuild's to
    # report with its recipe location and exit code, not a traceback inside doit's loader
    tasks = [dict_to_task(d) for d in stage_task_dicts(session, stages)]
    session.paths.root.mkdir(parents=True, exist_ok=True)
    check_doit_db(session.paths.doit_db)
    with _doit_tracebacks_to_error(session) as stderr:
        code = DoitMain(SessionLoader(session, tasks), config_filenames=()).run(["run", *targets])
    if code != 0 and session.error is None and stderr.traceback:
        # doit failed in its own bookkeeping (its state file on a full disk): one message
        last = stderr.traceback.strip().splitlines()[-1]
        session.error = BuildError(f"doit could not keep its state in {session.paths.doit_db}: "
                                   f"{last}", hint="free disk space or build elsewhere "
                                   "(--build-dir); run with -v for doit's traceback")
    return code


SQLITE_SIDE_FILES = ("", "-journal", "-wal", "-shm")


def check_doit_db(path) -> None:
    """doit opens its database with sqlite3, which follows symlinks (and so would write into a
    planted link's target): refuse a database, or a journal beside it, that is not a regular
    file; create the database without following a link, so it is one from the start."""
    for name in (path.name + suffix for suffix in SQLITE_SIDE_FILES):
        try:
            mode = os.lstat(path.with_name(name)).st_mode
        except FileNotFoundError:
            continue
        if not stat.S_ISREG(mode):
            kind = "a symlink" if stat.S_ISLNK(mode) else "not a regular file"
            raise UserError(f"{path.with_name(name)} is {kind}: doit's database is never opened "
                            "through one", hint=f"remove it (`npubuild clean` removes the whole "
                                                f"{path.parent})")
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o666))
    except OSError as exc:  # a link planted since the check above
        raise UserError(f"cannot open doit's database {path}: {exc.strerror or exc}") from None


class _TracebackFilter:
    """stderr for doit's run: a traceback doit prints (it does for any error outside a task
    action) is kept for npubuild's own message and the debug log; the rest passes through."""

    def __init__(self, stream):
        self.stream, self.traceback = stream, ""

    def write(self, text: str) -> int:
        if text.startswith("Traceback (most recent call last):"):
            self.traceback += text
            logging.getLogger("npubuild").debug("doit: %s", text)
            return len(text)
        return self.stream.write(text)

    def __getattr__(self, name):
        return getattr(self.stream, name)


@contextmanager
def _doit_tracebacks_to_error(session: BuildSession) -> Iterator[_TracebackFilter]:
    saved = sys.stderr
    sys.stderr = _TracebackFilter(saved)
    try:
        yield sys.stderr
    finally:
        sys.stderr = saved
