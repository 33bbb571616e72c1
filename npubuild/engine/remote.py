"""The remote cache: a second, shared level behind the local content cache, on fsspec.

``<url>/<key[:2]>/<key>/<file>`` mirrors a local entry; its ``manifest.json`` is written
last, so an entry exists on the remote exactly when its manifest does. Entries are
write-once and content-addressed (a key names the same bytes on every machine, since builds
are reproducible), so many machines may push at once: the worst case is two identical
uploads. Everything pulled is checked against the manifest's hashes before the local cache
takes it, so a half-written or tampered remote entry is a miss, never a wrong artifact.

The remote is an optimisation like the local cache: the first network or permission error
is one warning, and the build goes on without the remote. Credentials and endpoints come
from the usual fsspec/boto environment (``AWS_*``, ``FSSPEC_S3_*``), never from a recipe.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from npubuild.engine.cache import CacheCorrupt, parse_manifest
from npubuild.engine.paths import CACHE_ENV, MANIFEST

REMOTE_ENV = "NPUBUILD_REMOTE"
KEY_PATTERN = re.compile(r"^[0-9a-f]{64}$")
# One quick attempt per request: an unreachable remote must cost seconds, not minutes of
# botocore's retries with back-off, before the build goes on without it.
S3_OPTIONS = {"config_kwargs": {"connect_timeout": 3, "read_timeout": 30,
                                "retries": {"max_attempts": 2, "mode": "standard"}}}

log = logging.getLogger("npubuild")


def is_url(text: str | os.PathLike | None) -> bool:
    """Whether a ``--cache`` value names an fsspec remote (``s3://…``) rather than a folder."""
    return isinstance(text, str) and "://" in text


def resolve_remote_url(override: str | None = None, setting: str | None = None) -> str | None:
    """``--remote`` (or a URL given to ``--cache``) wins, then ``$NPUBUILD_REMOTE``, then a URL
    in ``$NPUBUILD_CACHE``, then the project's ``remote`` setting (or a URL as its ``cache``)."""
    cache_env = os.environ.get(CACHE_ENV)
    return (override or os.environ.get(REMOTE_ENV)
            or (cache_env if is_url(cache_env) else None) or setting or None)


@dataclass
class RemoteCache:
    """One fsspec remote; ``available`` turns False at the first error (one warning)."""

    url: str
    available: bool = True
    fs: Any = field(init=False, repr=False, default=None)
    root: str = field(init=False, default="")

    def __post_init__(self) -> None:
        import fsspec

        protocol = fsspec.core.split_protocol(self.url)[0] or "file"
        options = S3_OPTIONS if protocol in ("s3", "s3a") else {}
        try:
            self.fs, self.root = fsspec.core.url_to_fs(self.url, **options)
        except (ImportError, ValueError) as exc:
            self._disable(exc, "cannot open")
        self.root = self.root.rstrip("/")

    # -- paths --------------------------------------------------------------------------
    def entry(self, key: str) -> str:
        return f"{self.root}/{key[:2]}/{key}"

    def _file(self, key: str, rel: str) -> str:
        return f"{self.entry(key)}/{rel}"

    # -- queries ------------------------------------------------------------------------
    def manifest(self, key: str) -> dict | None:
        """The remote entry's manifest, or None when absent, unreadable or not this key's."""
        return _parse_manifest(self._manifest_bytes(key), key)

    def _manifest_bytes(self, key: str) -> bytes | None:
        if not self.available or not KEY_PATTERN.match(key):
            return None
        try:
            return self.fs.cat_file(self._file(key, MANIFEST))
        except FileNotFoundError:
            return None
        except Exception as exc:  # noqa: BLE001 - any transport error means "no remote"
            self._disable(exc, "cannot read")
            return None

    def keys(self) -> list[str]:
        """Every key with a manifest on the remote, sorted (for ``cache status``)."""
        if not self.available:
            return []
        try:
            found = self.fs.glob(f"{self.root}/*/*/{MANIFEST}")
        except Exception as exc:  # noqa: BLE001
            self._disable(exc, "cannot list")
            return []
        return sorted(PurePosixPath(p).parent.name for p in found
                      if KEY_PATTERN.match(PurePosixPath(p).parent.name))

    # -- transfer -----------------------------------------------------------------------
    def pull(self, key: str, local) -> bool:
        """Copy the remote entry ``key`` into the local cache, checking every file's hash.

        Returns whether the local cache now has the entry. A file that does not match its
        hash makes the whole entry a miss (it is not deleted: it is write-once and may be
        another writer's upload in progress)."""
        raw = self._manifest_bytes(key)
        manifest = _parse_manifest(raw, key)
        if manifest is None:
            return False
        local.root.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=".pull-", dir=local.root))
        try:
            for rel, info in sorted(manifest["files"].items()):
                target = staging.joinpath(*PurePosixPath(rel).parts)  # names checked above
                data = self.fs.cat_file(self._file(key, rel))
                if hashlib.sha256(data).hexdigest() != info["sha256"]:
                    log.warning("remote cache: %s of entry %s does not match its hash; "
                                "building instead", rel, key[:12])
                    return False
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(data)
            (staging / MANIFEST).write_bytes(raw)  # the same bytes on every machine
            local.store(staging, key)
            return local.manifest(key) is not None
        except FileNotFoundError:
            return False
        except Exception as exc:  # noqa: BLE001
            self._disable(exc, "cannot pull from")
            return False
        finally:
            shutil.rmtree(staging, ignore_errors=True)

    def push(self, key: str, local) -> bool:
        """Upload the local entry ``key`` unless the remote has it (manifest last).

        Returns whether the remote has the entry afterwards."""
        if not self.available:
            return False
        manifest = local.manifest(key)
        if manifest is None:
            return False
        if self.manifest(key) is not None:
            return True
        entry = local.entry(key)
        try:
            for rel, info in sorted(manifest["files"].items()):
                data = (entry / rel).read_bytes()
                if hashlib.sha256(data).hexdigest() != info["sha256"]:
                    log.warning("local cache entry %s: %s does not match its hash; "
                                "not pushed", key[:12], rel)
                    return False
                self._upload(self._file(key, rel), data)
            self._upload(self._file(key, MANIFEST), (entry / MANIFEST).read_bytes())
            return True
        except Exception as exc:  # noqa: BLE001
            self._disable(exc, "cannot push to")
            return False

    def _upload(self, path: str, data: bytes) -> None:
        self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)  # a no-op on object stores
        self.fs.pipe_file(path, data)

    def _disable(self, exc: BaseException, doing: str) -> None:
        if self.available:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.warning("remote cache %s: %s it (%s); building without the remote",
                        self.url, doing, reason)
        self.available = False


def _parse_manifest(raw: bytes | None, key: str) -> dict | None:
    """The checked manifest (as the local cache checks it), or None: a miss."""
    if raw is None:
        return None
    try:
        return parse_manifest(raw, key)
    except CacheCorrupt:
        return None
