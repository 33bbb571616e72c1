"""The content-addressed stage cache (DVC's run-cache idea).

``<cache>/<key[:2]>/<key>/`` holds a stage's artifact files and its manifest. Entries are
written to a temporary directory and renamed into place, so a reader never sees half of one;
on restore every file is checked against the manifest's hash, and a corrupt entry is evicted.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from pathlib import Path

from npubuild.build.hashing import sha256_file
from npubuild.build.paths import MANIFEST


class CacheCorrupt(Exception):
    """A cache entry's file does not match its recorded hash."""


class Cache:
    def __init__(self, root: Path):
        self.root = Path(root)

    def entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def manifest(self, key: str) -> dict | None:
        try:
            return json.loads((self.entry(key) / MANIFEST).read_text())
        except (OSError, ValueError):
            return None

    def store(self, stage_dir: Path, key: str) -> None:
        """Copy a finished stage directory into the cache (no-op when the key is present)."""
        final = self.entry(key)
        if (final / MANIFEST).is_file():
            return
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f".tmp-{key[:12]}-{uuid.uuid4().hex[:8]}"
        try:
            shutil.copytree(stage_dir, tmp)
            try:
                os.rename(tmp, final)
            except OSError:  # another run stored the same key first; theirs is as good
                pass
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def restore(self, key: str, dest: Path) -> dict:
        """Copy an entry into ``dest`` (which must not exist), verifying every file's hash."""
        manifest = self.manifest(key)
        if manifest is None:
            raise CacheCorrupt(f"cache entry {key[:12]} has no readable manifest")
        src = self.entry(key)
        shutil.copytree(src, dest)
        for rel, info in manifest["files"].items():
            path = dest / rel
            if not path.is_file() or sha256_file(path) != info["sha256"]:
                raise CacheCorrupt(f"cache entry {key[:12]}: {rel} does not match its hash")
        return manifest

    def evict(self, key: str) -> None:
        shutil.rmtree(self.entry(key), ignore_errors=True)
