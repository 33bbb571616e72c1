"""A stage's artifacts by content key, for workers that share no directory with the build.

A Dask worker gets a `StageArtifacts` (the key plus where the caches are) instead of a path
into someone's build directory, and materialises the stage from the local cache or, failing
that, the remote one; every file is checked against its hash on the way.
"""

from __future__ import annotations

import atexit
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from npubuild.engine.cache import Cache
from npubuild.errors import BuildError

_MATERIALISED: dict[tuple, Path] = {}


@dataclass(frozen=True)
class StageArtifacts:
    """Where to find one stage's artifacts: its key, the local cache, the remote (if any) and
    the public keys whose signatures on it are believed (a worker reads, never signs)."""

    stage: str
    key: str
    cache_root: str
    remote_url: str | None = field(default=None, repr=False)  # may hold credentials
    trusted_keys: tuple[str, ...] = ()

    def materialise(self) -> Path:
        """A private copy of the stage's artifacts on this machine (one per process and key)."""
        memo = (self.key, self.cache_root, self.remote_url)
        if memo in _MATERIALISED:
            return _MATERIALISED[memo]
        cache = Cache(Path(self.cache_root))
        if cache.manifest(self.key) is None and self.remote_url:
            from npubuild.engine.remote import RemoteCache, trusted_only

            RemoteCache(self.remote_url, trust=trusted_only(self.trusted_keys)).pull(self.key, cache)
        if cache.manifest(self.key) is None:
            raise BuildError(f"{self.stage} artifacts {self.key[:12]} are in neither the local "
                             f"cache {self.cache_root} nor a remote cache",
                             hint="workers on other machines need a shared cache: --remote URL")
        root = Path(tempfile.mkdtemp(prefix=f"npubuild-{self.stage}-"))
        atexit.register(shutil.rmtree, root, ignore_errors=True)
        cache.restore(self.key, root / self.stage)
        _MATERIALISED[memo] = root / self.stage
        return root / self.stage
