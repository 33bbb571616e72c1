"""The remote cache: a second, shared level behind the local content cache, on fsspec.

``<url>/<key[:2]>/<key>/<file>`` mirrors a local entry, plus ``manifest.sig``, its writer's
signature (`npubuild.engine.signing`). The signature is uploaded before the manifest and the
manifest last, so an entry exists on the remote exactly when its manifest does. Entries are
content-addressed (a key names the same bytes on every machine, since builds are
reproducible), so many machines may push at once: the worst case is two identical uploads.

Nothing on the remote is believed unchecked. A reader takes an entry only when its signature
verifies against a key it trusts; the manifest then gives every file's hash and size, each
object's size is compared before the download, and the download is streamed to disk while it is
hashed (never held in memory; a longer object is cut off at its declared size). An entry that
fails any check is a miss with one warning, and the next push from this process replaces it.
Only the one entry is refused: a bad entry never disables the remote.

The remote is an optimisation like the local cache: the first network or permission error, or a
remote silent for longer than the deadline (`npubuild.engine.transport`), is one warning, and
the build goes on without the remote. Credentials and endpoints come from the usual fsspec/boto
environment (``AWS_*``, ``FSSPEC_S3_*``); a URL given with a user and password in it works, but
is shown with them masked.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO

from npubuild.engine.cache import (Cache, CacheCorrupt, EntryMissing, MAX_MANIFEST_BYTES,
                                   open_inside, parse_manifest, remove, safe_relpath)
from npubuild.engine.hashing import CHUNK
from npubuild.engine.paths import CACHE_ENV, MANIFEST
from npubuild.engine.signing import KEYGEN_HINT, MAX_SIGNATURE_BYTES, SIGNATURE, Trust
from npubuild.engine.transport import (MIN_RATE, FsspecTransport, LocalTransport, Unreachable,
                                       call_with_deadline, redact, scrub, timeout_seconds)

REMOTE_ENV = "NPUBUILD_REMOTE"
KEY_PATTERN = re.compile(r"^[0-9a-f]{64}$")
LOCAL_PROTOCOLS = ("file", "local")

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


def s3_options(timeout: float) -> dict:
    """One quick attempt per request, within the deadline: an unreachable remote must cost
    seconds, not minutes of botocore's and s3fs's retries with back-off."""
    return {"config_kwargs": {"connect_timeout": min(3.0, timeout), "read_timeout": timeout,
                              "retries": {"max_attempts": 1, "mode": "standard"}}}


@dataclass
class RemoteCache:
    """One remote; ``available`` turns False at its first failure (one warning)."""

    url: str = field(repr=False)  # may hold credentials: shown only through `shown`
    trust: Trust = field(default_factory=Trust)
    timeout: float = field(default_factory=timeout_seconds)
    available: bool = True
    bad: set[str] = field(default_factory=set)  # keys whose remote entry failed a check
    transport: Any = field(init=False, repr=False, default=None)
    _told: set[str] = field(init=False, repr=False, default_factory=set)

    def __post_init__(self) -> None:
        import fsspec

        protocol = fsspec.core.split_protocol(self.url)[0] or "file"
        try:
            if protocol in LOCAL_PROTOCOLS:
                root = fsspec.core.url_to_fs(self.url)[1]
                self.transport = LocalTransport(root.rstrip("/") or "/")
                return
            options = s3_options(self.timeout) if protocol in ("s3", "s3a") else {}
            fs, root = fsspec.core.url_to_fs(self.url, **options)
            if protocol in ("s3", "s3a"):
                fs.retries = 2  # s3fs's own retry loop (5 by default, with back-off)
            self.transport = FsspecTransport(fs, root.rstrip("/"))
        except Exception as exc:  # noqa: BLE001 - an unknown protocol, a missing package
            self._disable(exc, "cannot open")

    @property
    def shown(self) -> str:
        """The URL as it may be printed (no user or password)."""
        return redact(self.url)

    def entry(self, key: str) -> str:
        """Where the entry lives, for messages and tests (the root as the transport sees it)."""
        return "/".join((self.transport.root, key[:2], key)) if self.transport else ""

    # -- reading ------------------------------------------------------------------------
    def manifest(self, key: str) -> dict | None:
        """The entry's manifest when the entry is there, signed by a trusted key and well
        formed; None otherwise (a bad entry is warned about once)."""
        found = self._verified(key)
        return found[0] if found else None

    def _verified(self, key: str) -> tuple[dict, bytes] | None:
        if not self._readable() or not KEY_PATTERN.match(key) or key in self.bad:
            return None
        try:
            raw = self._read_small(key, MANIFEST, MAX_MANIFEST_BYTES)
        except EntryMissing:
            return None  # no entry: a plain miss
        except (CacheCorrupt, Unreachable) as exc:
            return self._failed(key, exc, "cannot read")
        try:
            try:
                signature = self._read_small(key, SIGNATURE, MAX_SIGNATURE_BYTES)
            except EntryMissing:
                signature = None
            self.trust.check(key, raw, signature)
            manifest = parse_manifest(raw, key)
            for rel, info in manifest["files"].items():
                if not isinstance(info.get("bytes"), int) or info["bytes"] < 0:
                    raise CacheCorrupt(f"no size for {rel[:80]!r} in the manifest")
            return manifest, raw
        except (CacheCorrupt, Unreachable) as exc:
            return self._failed(key, exc, "cannot read")

    def keys(self) -> list[str]:
        """Every key with a manifest on the remote, sorted (for ``cache status``)."""
        if not self._readable():
            return []
        try:
            return self._call(self.transport.keys, seconds=self.timeout * 6)
        except Unreachable as exc:
            self._disable(exc, "cannot list")
            return []

    def pull(self, key: str, local: Cache) -> bool:
        """Copy the remote entry ``key`` into the local cache, every file checked on the way.

        Returns whether the local cache now has the entry. A file off its size or hash makes
        the whole entry a miss (warned once; this process's next push of the key replaces it)."""
        found = self._verified(key)
        if found is None:
            return False
        manifest, raw = found
        try:
            staging = local.staging()
        except OSError:
            return False  # the local cache cannot be written: the session says so once
        try:
            for rel, info in sorted(manifest["files"].items()):
                self._download(key, rel, info, staging)
            (staging / MANIFEST).write_bytes(raw)  # the same bytes on every machine
            local.adopt(staging, key)
            return local.manifest(key) is not None
        except (CacheCorrupt, Unreachable) as exc:
            self._failed(key, exc, "cannot pull from")
            return False
        except OSError as exc:  # the local side (a full disk): this entry only
            self._tell(f"local:{key}", "remote cache entry %s not stored in the local cache "
                       "%s: %s", key[:12], local.root, exc.strerror or exc)
            return False
        finally:
            remove(staging)

    def _download(self, key: str, rel: str, info: dict, staging: Path) -> None:
        """One listed file into ``staging``, size-checked first, streamed while hashed."""
        parts = self._parts(key, *safe_relpath(rel).parts)
        reader, size = self._call(self.transport.open, parts)
        try:
            if size != info["bytes"]:
                raise CacheCorrupt(f"{rel} is {size:,} bytes where the manifest says "
                                   f"{info['bytes']:,}")
            target = staging.joinpath(*parts[2:])
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "xb") as out:
                digest = self._stream(reader, size, rel, out.write)
            if digest != info["sha256"]:
                raise CacheCorrupt(f"{rel} does not match its hash")
        finally:
            self._close(reader)

    def _stream(self, reader: BinaryIO, size: int, rel: str, sink) -> str:
        """Read ``size`` bytes chunk by chunk under the deadline into ``sink``; never more."""
        digest, got = hashlib.sha256(), 0
        while chunk := self._call(reader.read, min(CHUNK, size - got + 1), seconds=None):
            got += len(chunk)
            if got > size:
                raise CacheCorrupt(f"{rel} is longer than its declared {size:,} bytes")
            digest.update(chunk)
            sink(chunk)
        if got != size:
            raise CacheCorrupt(f"{rel} ended after {got:,} of {size:,} bytes")
        return digest.hexdigest()

    def _read_small(self, key: str, rel: str, limit: int) -> bytes:
        reader, size = self._call(self.transport.open, self._parts(key, rel))
        try:
            if size > limit:
                raise CacheCorrupt(f"{rel} is {size:,} bytes, more than the {limit:,} allowed")
            chunks: list[bytes] = []
            self._stream(reader, size, rel, chunks.append)
            return b"".join(chunks)
        finally:
            self._close(reader)

    # -- writing ------------------------------------------------------------------------
    def push(self, key: str, local: Cache, *, thorough: bool = False) -> bool:
        """Upload the local entry ``key``, signed, unless the remote already holds it intact
        (its signature trusted and every file of its size; with ``thorough``, also re-hashed).

        A remote entry that fails those checks is replaced. Returns whether the remote holds a
        good entry afterwards."""
        if not self._writable():
            return False
        manifest = local.manifest(key)
        if manifest is None:
            return False
        if key not in self.bad and self._holds(key, thorough):
            return True
        if not self.available:
            return False
        try:
            with os.fdopen(open_inside(local.root, (key[:2], key, MANIFEST)), "rb") as fh:
                raw = fh.read(MAX_MANIFEST_BYTES + 1)
            for rel, info in sorted(manifest["files"].items()):
                self._upload(key, rel, info, local)
            self._put(self._parts(key, SIGNATURE), [self.trust.sign(key, raw)], 0)
            self._put(self._parts(key, MANIFEST), [raw], len(raw))
        except Unreachable as exc:
            self._disable(exc, "cannot push to")
            return False
        except (CacheCorrupt, OSError) as exc:
            self._tell(f"push:{key}", "remote cache entry %s not pushed: %s", key[:12],
                       exc.strerror if isinstance(exc, OSError) and exc.strerror else exc)
            return False
        self.bad.discard(key)
        return True

    def _holds(self, key: str, thorough: bool) -> bool:
        found = self._verified(key)
        if found is None or not self.available:
            return False
        try:
            for rel, info in sorted(found[0]["files"].items()):
                parts = self._parts(key, *safe_relpath(rel).parts)
                reader, size = self._call(self.transport.open, parts)
                try:
                    if size != info["bytes"]:
                        raise CacheCorrupt(f"{rel} is {size:,} bytes, not {info['bytes']:,}")
                    if thorough and self._stream(reader, size, rel, _discard) != info["sha256"]:
                        raise CacheCorrupt(f"{rel} does not match its hash")
                finally:
                    self._close(reader)
        except (CacheCorrupt, Unreachable) as exc:
            self._failed(key, exc, "cannot read")
            return False
        return True

    def _upload(self, key: str, rel: str, info: dict, local: Cache) -> None:
        """One local file, its hash checked before a byte leaves (the remote then never
        holds a file that disagrees with the manifest this machine signs)."""
        parts = safe_relpath(rel).parts
        with os.fdopen(open_inside(local.root, (key[:2], key, *parts)), "rb") as fh:
            if hashlib.file_digest(fh, "sha256").hexdigest() != info["sha256"]:
                raise CacheCorrupt(f"the local cache's {rel} does not match its hash")
            fh.seek(0)
            self._put(self._parts(key, *parts), iter(lambda: fh.read(CHUNK), b""),
                      info["bytes"])

    def _put(self, parts: tuple[str, ...], chunks, size: int) -> None:
        self._call(self.transport.put, parts, chunks, seconds=self.timeout + size / MIN_RATE)

    # -- plumbing -----------------------------------------------------------------------
    @staticmethod
    def _parts(key: str, *rest: str) -> tuple[str, ...]:
        return (key[:2], key, *rest)

    def _call(self, fn, *args, seconds: float | None = None):
        """``fn(*args)`` under the deadline (default: the timeout plus a chunk's transfer);
        any failure that is not about one entry is Unreachable."""
        try:
            return call_with_deadline(fn, seconds or self.timeout + CHUNK / MIN_RATE, *args)
        except (CacheCorrupt, Unreachable):
            raise
        except FileNotFoundError as exc:
            raise EntryMissing(str(exc)[:200]) from None
        except Exception as exc:  # noqa: BLE001 - a transport error of any library
            raise Unreachable(str(exc).strip().splitlines()[0][:300] if str(exc).strip()
                              else type(exc).__name__) from None

    def _close(self, reader: BinaryIO) -> None:
        try:
            self._call(reader.close)
        except (CacheCorrupt, Unreachable):
            pass

    def _readable(self) -> bool:
        if self.available and not self.trust.trusted:
            self.available = False
            log.warning("remote cache %s is not used: no key is configured, so nothing on it "
                        "can be trusted or signed (set the trusted_keys setting or "
                        "$NPUBUILD_TRUSTED_KEYS to read, $NPUBUILD_SIGNING_KEY to write; %s)",
                        self.shown, KEYGEN_HINT)
        return self.available

    def _writable(self) -> bool:
        if self._readable() and self.trust.signer is None:
            self._tell("nosigner", "remote cache %s: not pushing, no signing key "
                       "($NPUBUILD_SIGNING_KEY)", self.shown, level=logging.INFO)
            return False
        return self.available

    def _failed(self, key: str, exc: Exception, doing: str) -> None:
        """A check failed: Unreachable disables the remote; anything else rejects one entry."""
        if isinstance(exc, Unreachable):
            self._disable(exc, doing)
            return None
        self.bad.add(key)
        self._tell(f"bad:{key}", "remote cache %s: entry %s rejected (%s); building instead, "
                   "and a push from this machine replaces it", self.shown, key[:12],
                   scrub(str(exc), self.url))
        return None

    def _tell(self, once: str, text: str, *args, level: int = logging.WARNING) -> None:
        if once not in self._told:
            self._told.add(once)
            log.log(level, text, *args)

    def _disable(self, exc: BaseException, doing: str) -> None:
        if self.available:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            log.warning("remote cache %s: %s it (%s); building without the remote",
                        self.shown, doing, scrub(reason, self.url))
        self.available = False


def _discard(chunk: bytes) -> None:
    """A sink for bytes that are only hashed."""


def trusted_only(texts: tuple[str, ...]) -> Trust:
    """A reader's trust from public key texts (what a Dask worker is handed: no private key)."""
    from npubuild.engine.signing import parse_public

    return Trust(None, frozenset(parse_public(t) for t in texts))

