"""Content hashes: of files, directories, and JSON-able data, with a stat cache for big inputs."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from npubuild.atomic import write_json

CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def sha256_data(data: Any) -> str:
    """Hash of canonical JSON (sorted keys), so equal data always hashes equal."""
    text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(text.encode()).hexdigest()


class HashCache:
    """Remembers file hashes by (size, mtime) so a no-op run does not re-read big models."""

    def __init__(self, path: Path):
        self.path = path
        self.dirty = False
        try:
            self.table: dict[str, list] = json.loads(path.read_text())
        except (OSError, ValueError):
            self.table = {}

    def file(self, path: Path) -> str:
        stat = path.stat()
        key = str(path.resolve())
        entry = self.table.get(key)
        if entry and entry[0] == stat.st_size and entry[1] == stat.st_mtime_ns:
            return entry[2]
        digest = sha256_file(path)
        self.table[key] = [stat.st_size, stat.st_mtime_ns, digest]
        self.dirty = True
        return digest

    def any(self, path: Path) -> str:
        """A file's hash, or a directory's: the hash of its files' relative paths and hashes."""
        if path.is_dir():
            return sha256_data({str(p.relative_to(path)): self.file(p)
                                for p in sorted(path.rglob("*")) if p.is_file()})
        return self.file(path)

    def save(self) -> None:
        if self.dirty:
            write_json(self.path, self.table)
            self.dirty = False
