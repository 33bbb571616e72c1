"""Content hashes: of files, directories, and JSON-able data, with a stat cache for big inputs.

The stat cache keys a file's hash on (size, mtime_ns, ctime_ns, inode). A changed byte always
changes ``ctime``: the kernel sets it on every write *and* on every ``utime`` call, and no user
can set it back, so a flip that restores the old mtime (``touch -d``, ``os.utime``) still misses
the cache and the file is read again.
"""

from __future__ import annotations

import hashlib
import json
import os
import stat as stat_mod
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from npubuild.atomic import write_json
from npubuild.errors import UserError

CHUNK = 1 << 20


def open_regular(path: Path) -> int:
    """An fd for reading ``path``, which must be a regular file: a FIFO or a device (``/dev/zero``)
    would block or never end, so it is refused before the first read."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    if not stat_mod.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise UserError(f"{path} is not a regular file (a FIFO, device or socket cannot be read "
                        "as a model or data file)")
    return fd


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with os.fdopen(open_regular(path), "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_data(data: Any) -> str:
    """Hash of canonical JSON (sorted keys), so equal data always hashes equal."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def sha256_array(value) -> bytes:
    """Digest of an array's content: its dtype, shape and bytes (equal arrays, equal digest)."""
    import numpy as np

    value = np.asarray(value)
    # the shape before ascontiguousarray, which makes a 0-d array 1-d: a scalar and a one-element
    # vector had one digest, and folding read a Slice's axes [0] from a Gather's index 0
    digest = hashlib.sha256(f"{value.dtype.str}{value.shape}".encode())
    digest.update(np.ascontiguousarray(value).view(np.uint8))
    return digest.digest()


def stat_key(st: os.stat_result) -> list[int]:
    """What must be unchanged for a remembered hash to stand (see the module docstring)."""
    return [st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_ino]


class HashCache:
    """Remembers file hashes by `stat_key` so a no-op run does not re-read big files."""

    def __init__(self, path: Path):
        self.path = path
        self.dirty = False
        try:
            self.table: dict[str, list] = json.loads(path.read_text())
            if not isinstance(self.table, dict):
                self.table = {}
        except (OSError, ValueError):
            self.table = {}

    def file(self, path: Path) -> str:
        st = path.stat()
        key = str(path.resolve())
        entry = self.table.get(key)
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == stat_key(st):
            return entry[1]
        digest = sha256_file(path)
        self.table[key] = [stat_key(st), digest]
        self.dirty = True
        return digest

    def derived(self, label: str, paths: Sequence[Path], compute: Callable[[], str]) -> str:
        """A digest of several files (``compute()``), remembered under ``label`` with their
        stat keys, which are taken first: a file changed meanwhile only misses next time."""
        stats = [[str(path), stat_key(path.stat())] for path in paths]
        entry = self.table.get(label)
        if isinstance(entry, list) and len(entry) == 2 and entry[0] == stats:
            return entry[1]
        digest = compute()
        self.table[label] = [stats, digest]
        self.dirty = True
        return digest

    def remember(self, path: Path, digest: str) -> None:
        """Record a hash this run has just computed or checked for ``path`` (as it is now)."""
        self.table[str(path.resolve())] = [stat_key(path.stat()), digest]
        self.dirty = True

    def any(self, path: Path) -> str:
        """A file's hash, or a directory's: the hash of its files' relative paths and hashes."""
        if path.is_dir():
            return sha256_data({p.relative_to(path).as_posix(): self.file(p)
                                for p in sorted(path.rglob("*")) if p.is_file()})
        return self.file(path)

    def save(self) -> None:
        """Write the table; a build directory that cannot take it only loses the speed-up."""
        if self.dirty:
            try:
                write_json(self.path, self.table)
            except OSError:
                pass
            self.dirty = False
