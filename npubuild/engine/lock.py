"""One writer per build directory: an advisory ``flock`` held for a whole run; and what the
build chose by itself, which ``recipe.lock`` records beside the recipe as written."""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Callable, Iterator

from npubuild.errors import BuildLocked, Location, UserError


@contextmanager
def build_lock(path: Path, *, wait_seconds: float = 600.0,
               on_wait: Callable[[str], None] | None = None,
               location: Location | None = None) -> Iterator[None]:
    """Hold the lock; wait up to ``wait_seconds`` for another run to finish, then fail clearly
    (at ``location``: the recipe whose build directory it is)."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        # O_NOFOLLOW: a planted symlink must not make the run overwrite its target with a pid
        fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o644)
    except OSError as exc:
        raise UserError(f"cannot lock the build directory {path.parent}: "
                        f"{'the lock file is a symlink' if exc.errno == errno.ELOOP else exc.strerror or exc}",
                        hint="build somewhere writable (--build-dir DIR)") from None
    try:
        deadline = time.monotonic() + wait_seconds
        told = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                holder = _holder(fd)
                if time.monotonic() >= deadline:
                    waited = f" (waited {wait_seconds:g} s)" if wait_seconds else ""
                    raise BuildLocked(
                        f"another npubuild run{holder} is writing {path.parent}{waited}",
                        location=location,
                        hint="wait for it to finish, or pass --wait SECONDS to wait longer; "
                             f"if no such run exists, the lock is held by a process that has "
                             f"{path.name} open (`fuser {path}` names it)") from None
                if on_wait and not told:
                    on_wait(f"waiting for another npubuild run{holder} on {path.parent}")
                    told = True
                time.sleep(0.2)
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        yield
    finally:
        os.close(fd)  # closing releases the flock


def _holder(fd: int) -> str:
    try:
        pid = os.pread(fd, 32, 0).decode().strip()
    except OSError:
        pid = ""
    return f" (pid {pid})" if pid else ""


def quantization_choices(quantize_dir: Path, report: dict) -> dict:
    """What quantize chose where the recipe left it open, for ``recipe.lock``: the scheme,
    weight granularity and calibration method in use, cross-layer equalisation where it is
    on, and the precision search's choice
    (tensors kept out of int8 and their precision, per-tensor calibration methods). The
    search is a deterministic function of the stage's inputs (its budgets are counts of
    evaluations), so the lock says what a rebuild chooses again; copied into the recipe
    (``quantization.overrides``, ``calibration.method``) it pins that choice."""
    summary = report.get("quantization") or {}
    out = {k: summary[k] for k in ("scheme", "granularity", "method") if k in summary}
    if summary.get("cross_layer_equalization"):  # on, as the recipe or the measurement chose
        out["cross_layer_equalization"] = True
    search_file = quantize_dir / "search.json"
    if search_file.is_file():
        search = json.loads(search_file.read_text())
        out["search"] = {
            "passed": search.get("passed"),
            "overrides": [{"tensors": [c["tensor"]], "precision": c["precision"]}
                          for c in search.get("chosen") or []],
            "calibration": {k: v for k, v in (search.get("calibration") or {}).items()
                            if k in ("method", "per_tensor")}}
    return out
