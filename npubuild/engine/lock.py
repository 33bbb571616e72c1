"""One writer per build directory: an advisory ``flock`` held for a whole run."""

from __future__ import annotations

import errno
import fcntl
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
