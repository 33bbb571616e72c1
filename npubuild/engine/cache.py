"""The content-addressed stage cache (DVC's run-cache idea), trusted only as far as it is checked.

``<cache>/<key[:2]>/<key>/`` holds a stage's artifact files and its manifest. Entries are
written to a ``.tmp-*`` directory and renamed into place, so a reader never sees half of one.
Nothing in an entry is believed unchecked: its manifest must name its own key, only the files
the manifest lists are restored, each is opened without following symlinks (so nothing outside
the entry is ever read) and must match its hash while it is copied. `verify` and `gc` apply the
same checks to the whole cache (``npubuild cache verify|gc``).
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import socket
import stat as stat_mod
import time
import uuid
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Iterator

from npubuild.engine.hashing import CHUNK
from npubuild.engine.paths import MANIFEST
from npubuild.errors import UserError

TMP_PREFIX = ".tmp-"
ORPHAN_AGE_SECONDS = 3600.0  # a .tmp-* of another machine's run is an orphan after this long
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW
MAX_MANIFEST_BYTES = 64 << 20
MAX_NAME_BYTES = 512  # a manifest's file name, whole (each component: 255, as file systems allow)


class CacheCorrupt(Exception):
    """A cache entry that fails a check: unreadable manifest, wrong key, or a file off its hash."""


class EntryMissing(CacheCorrupt):
    """A file an entry needs is not there (for a remote entry's manifest: no entry at all)."""


def safe_relpath(rel: object) -> PurePosixPath:
    """A manifest's file name as a path that stays inside the entry (no ``..``, not absolute)
    and that every file system and object store can hold (no NUL, short components)."""
    if not isinstance(rel, str) or not rel:
        raise CacheCorrupt(f"bad file name {str(rel)[:80]!r} in the manifest")
    path = PurePosixPath(rel)
    if path.is_absolute() or any(part in ("", ".", "..") for part in rel.split("/")):
        raise CacheCorrupt(f"file name {rel[:80]!r} in the manifest leaves the entry")
    if (len(rel.encode("utf-8", "surrogatepass")) > MAX_NAME_BYTES or "\0" in rel
            or any(len(part.encode("utf-8", "surrogatepass")) > 255 for part in path.parts)):
        raise CacheCorrupt(f"file name {rel[:80]!r}… in the manifest is too long or has a NUL")
    return path


def parse_manifest(raw: bytes, key: str) -> dict:
    """A cache entry's manifest from its bytes, checked: a JSON object for this very key, whose
    files have safe names and hashes (the local cache and the remote one read it alike)."""
    try:
        manifest = json.loads(raw)
    except ValueError:
        raise CacheCorrupt("the manifest is not JSON") from None
    if not isinstance(manifest, dict) or not isinstance(manifest.get("files"), dict):
        raise CacheCorrupt("the manifest has no file list")
    if manifest.get("key") != key:
        raise CacheCorrupt("the manifest belongs to another key")
    for rel, info in manifest["files"].items():
        safe_relpath(rel)
        if not isinstance(info, dict) or not isinstance(info.get("sha256"), str):
            raise CacheCorrupt(f"no hash for {rel[:80]!r} in the manifest")
    return manifest


def open_inside(root: Path, parts: tuple[str, ...]) -> int:
    """Open ``root/parts...`` as a regular file, refusing a symlink or special file at every
    step below ``root`` (``O_NOFOLLOW`` per component; the root itself is the user's setting
    and may be a symlink)."""
    try:
        fd = os.open(root, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise CacheCorrupt(f"{root}: {exc.strerror or exc}") from None
    try:
        return safe_open(fd, parts)
    finally:
        os.close(fd)


def safe_open(dir_fd: int, parts: tuple[str, ...]) -> int:
    """Open ``parts`` below the open folder ``dir_fd`` as a regular file, never through a
    symlink and never blocking (a FIFO or a device is refused before the first read); raises
    EntryMissing when a component is absent, CacheCorrupt for anything else."""
    fd = dir_fd
    try:
        for part in parts[:-1]:
            nxt = os.open(part, _DIR_FLAGS, dir_fd=fd)
            if fd != dir_fd:
                os.close(fd)
            fd = nxt
        leaf = os.open(parts[-1], os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=fd)
    except OSError as exc:
        kind = EntryMissing if exc.errno == errno.ENOENT else CacheCorrupt
        raise kind(f"{'/'.join(parts)[:200]}: {exc.strerror or exc}") from None
    finally:
        if fd != dir_fd:
            os.close(fd)
    if not stat_mod.S_ISREG(os.fstat(leaf).st_mode):
        os.close(leaf)
        raise CacheCorrupt(f"{'/'.join(parts)[:200]} is not a regular file")
    return leaf


def copy_checked(src_fd: int, dest: Path, sha256: str | None) -> str:
    """Copy an open file to ``dest`` (created with the umask's mode), hashing on the way."""
    digest = hashlib.sha256()
    dest.parent.mkdir(parents=True, exist_ok=True)
    with os.fdopen(src_fd, "rb") as src, open(dest, "wb") as out:
        while chunk := src.read(CHUNK):
            digest.update(chunk)
            out.write(chunk)
    if sha256 is not None and digest.hexdigest() != sha256:
        raise CacheCorrupt(f"{dest.name} does not match its hash")
    return digest.hexdigest()


def remove(path: Path) -> None:
    """Delete a file, symlink or directory tree without following symlinks out of it."""
    try:
        if path.is_symlink() or not path.is_dir():
            path.unlink()
        else:
            shutil.rmtree(path)
    except FileNotFoundError:
        pass


def tree_bytes(path: Path) -> int:
    """Bytes under ``path`` (symlinks counted as links, never followed)."""
    try:
        if path.is_symlink() or not path.is_dir():
            return path.lstat().st_size
    except OSError:
        return 0
    total = 0
    for dirpath, _, names in os.walk(path):
        for name in names:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                pass
    return total


@dataclass
class EntryCheck:
    """One cache entry (or orphan) as `Cache.check_all` found it."""

    path: Path
    key: str | None
    bytes: int
    problem: str | None = None  # None: a good entry
    orphan: bool = False


class ForeignFolder(OSError):
    """The cache folder holds things npubuild never wrote: it is not written into, nor cleaned."""


class Cache:
    def __init__(self, root: Path):
        self.root = Path(root)
        self._claimed = False

    # -- the marker: only a folder npubuild made a cache is ever written to or cleaned ---------
    def foreign(self) -> str | None:
        """Why the root is not an npubuild cache, or None when it is: it has npubuild's
        ``CACHEDIR.TAG``, or (a cache from before the tag) holds nothing but the cache's own
        layout, or is empty or absent."""
        if _has_marker(self.root):
            return None
        try:
            items = sorted(os.scandir(self.root), key=lambda e: e.name)
        except FileNotFoundError:
            return None
        except OSError as exc:
            return exc.strerror or str(exc)
        for item in items:
            if item.name.startswith((TMP_PREFIX, LEGACY_PULL_PREFIX)):
                continue
            if not _is_shard(Path(item.path)):
                return f"it holds {item.name!r}, which npubuild never writes"
            try:
                names = os.listdir(item.path)
            except OSError as exc:
                return f"{item.name}: {exc.strerror or exc}"
            stray = next((n for n in sorted(names) if not n.startswith(TMP_PREFIX)
                          and not (is_key(n) and n.startswith(item.name))), None)
            if stray is not None:
                return f"it holds {item.name}/{stray[:80]!r}, which npubuild never writes"
        return None

    def claim(self) -> None:
        """Before the first write: make the root with its marker, or write the marker into an
        existing folder that `foreign` accepts; ForeignFolder (an OSError: the cache is then
        not used, with one warning) for any other folder."""
        if self._claimed:
            return
        if not _has_marker(self.root):
            self.root.mkdir(parents=True, exist_ok=True)
            reason = self.foreign()
            if reason is not None:
                raise ForeignFolder(f"{self.root} is not an npubuild cache ({reason}; no "
                                    f"{MARKER} from npubuild)")
            _write_marker(self.root)
        self._claimed = True

    def staging(self) -> Path:
        """A new private folder at the root to assemble an entry in (a pull), named so that
        gc, and the next run on this host once this process is gone, remove it if left."""
        self.claim()
        path = self.root / f"{TMP_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        path.mkdir()
        return path

    def adopt(self, staging: Path, key: str) -> None:
        """Publish an assembled folder (`staging`) as the entry for ``key`` (one rename)."""
        final = self.entry(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        self._publish(staging, final, key)

    def remove_dead_orphans(self) -> None:
        """Remove what this host's killed runs left at the root (their pid is gone); what other
        hosts left waits for `npubuild cache gc`. Only in a folder tagged as npubuild's cache."""
        if not _has_marker(self.root):
            return
        try:
            names = os.listdir(self.root)
        except OSError:
            return
        for name in names:
            path = self.root / name
            fields = name[len(TMP_PREFIX):].rsplit("-", 2)
            if (name.startswith(TMP_PREFIX) and len(fields) == 3 and fields[1].isdigit()
                    and fields[0] == socket.gethostname() and not _pid_alive(int(fields[1]))):
                try:
                    remove(path)
                except OSError:
                    pass

    def entry(self, key: str) -> Path:
        return self.root / key[:2] / key

    def _parts(self, key: str, *rest: str) -> tuple[str, ...]:
        return (key[:2], key, *rest)

    def read_manifest(self, key: str) -> dict:
        """The entry's manifest, checked: a JSON object for this very key, with safe file names."""
        fd = open_inside(self.root, self._parts(key, MANIFEST))
        with os.fdopen(fd, "rb") as fh:
            return parse_manifest(fh.read(MAX_MANIFEST_BYTES + 1), key)

    def manifest(self, key: str) -> dict | None:
        """The checked manifest, or None when there is no usable entry for ``key``."""
        try:
            return self.read_manifest(key)
        except (CacheCorrupt, OSError):
            return None

    def store(self, stage_dir: Path, key: str) -> None:
        """Copy a finished stage directory's manifest and listed files into the cache.

        A present, valid entry is kept (the first writer wins); anything else under the key — a
        plain file, a symlink, an entry with a bad manifest — is replaced. Raises OSError when
        the cache cannot be written (the caller warns and builds on without it)."""
        if self.manifest(key) is not None:
            return
        self.claim()
        manifest = json.loads((stage_dir / MANIFEST).read_text())
        final = self.entry(key)
        final.parent.mkdir(parents=True, exist_ok=True)
        tmp = final.parent / f"{TMP_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            tmp.mkdir()
            for rel in [*manifest["files"], MANIFEST]:
                target = tmp / rel
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(stage_dir / rel, target)
            self._publish(tmp, final, key)
        finally:
            remove(tmp)

    def _publish(self, tmp: Path, final: Path, key: str) -> None:
        try:
            os.rename(tmp, final)
            return
        except OSError as exc:
            if exc.errno not in (errno.ENOTEMPTY, errno.EEXIST, errno.ENOTDIR, errno.EISDIR):
                raise
        if self.manifest(key) is not None:  # another run stored the same key first
            return
        remove(final)  # a broken entry, a plain file or a symlink in the entry's place
        os.rename(tmp, final)

    def restore(self, key: str, dest: Path) -> dict:
        """Copy the entry's listed files into ``dest`` (which must not exist), each checked
        against its hash while it is copied; raises CacheCorrupt naming what failed."""
        try:
            manifest = self.read_manifest(key)
        except OSError as exc:
            raise CacheCorrupt(f"unreadable: {exc.strerror or exc}") from None
        dest.mkdir(parents=True)
        for rel, info in manifest["files"].items():
            parts = safe_relpath(rel).parts
            copy_checked(open_inside(self.root, self._parts(key, *parts)), dest.joinpath(*parts),
                         info["sha256"])
        copy_checked(open_inside(self.root, self._parts(key, MANIFEST)), dest / MANIFEST, None)
        return manifest

    def check(self, key: str) -> str | None:
        """Why the entry for ``key`` is bad (every file re-hashed), or None when it is good."""
        try:
            manifest = self.read_manifest(key)
            listed = {MANIFEST, *manifest["files"]}
            for rel, info in manifest["files"].items():
                fd = open_inside(self.root, self._parts(key, *safe_relpath(rel).parts))
                with os.fdopen(fd, "rb") as fh:
                    digest = hashlib.file_digest(fh, "sha256").hexdigest()
                if digest != info["sha256"]:
                    return f"{rel} does not match its hash"
            extra = [p for p in self._files(self.entry(key)) if p not in listed]
            return f"files not in the manifest: {', '.join(sorted(extra)[:3])}" if extra else None
        except CacheCorrupt as exc:
            return str(exc)
        except OSError as exc:
            return exc.strerror or str(exc)

    @staticmethod
    def _files(entry: Path) -> list[str]:
        out = []
        for dirpath, dirs, names in os.walk(entry):  # os.walk does not follow symlinked dirs
            rel = Path(dirpath).relative_to(entry)
            out += [(rel / n).as_posix() for n in names + [d for d in dirs
                                                            if os.path.islink(os.path.join(dirpath, d))]]
        return out

    def evict(self, key: str) -> None:
        """Remove a bad entry (never from a folder that is not npubuild's cache)."""
        if self.foreign() is None:
            remove(self.entry(key))

    def check_all(self, *, now: float | None = None) -> Iterator[EntryCheck]:
        """Every entry, checked, and every orphan (``.tmp-*`` of dead runs, stray files)."""
        now = time.time() if now is None else now
        if not self.root.is_dir():
            return
        reason = self.foreign()
        if reason is not None:
            raise UserError(f"{self.root} is not an npubuild cache: {reason}, and it has no "
                            f"{MARKER} written by npubuild; nothing was checked or removed",
                            hint="point --cache at an npubuild cache folder (the default is "
                                 ".npubuild/cache); npubuild writes its marker when it makes one")
        for shard in sorted(self.root.iterdir()):
            if shard.name.startswith(TMP_PREFIX) and _is_orphan_tmp(shard, now):
                yield EntryCheck(shard, None, tree_bytes(shard), "left by a killed run", True)
            elif shard.name.startswith(LEGACY_PULL_PREFIX) and _is_orphan_tmp(shard, now):
                yield EntryCheck(shard, None, tree_bytes(shard), "left by a killed pull", True)
            if not _is_shard(shard):
                continue  # not the cache's layout: never touched (the root may hold other things)
            for entry in sorted(shard.iterdir()):
                if entry.name.startswith(TMP_PREFIX):
                    if _is_orphan_tmp(entry, now):
                        yield EntryCheck(entry, None, tree_bytes(entry), "left by a killed run", True)
                elif is_key(entry.name) and entry.name.startswith(shard.name):
                    yield EntryCheck(entry, entry.name, tree_bytes(entry), self.check(entry.name))


HEX = frozenset("0123456789abcdef")
MARKER = "CACHEDIR.TAG"
# The Cache Directory Tagging Specification's tag (backup tools skip the folder), naming its maker
MARKER_TEXT = ("Signature: 8a477f597d28d172789f06886806bc55\n"
               "# This file is a cache directory tag created by npubuild.\n"
               "# For information about cache directory tags see https://bford.info/cachedir/\n")
LEGACY_PULL_PREFIX = ".pull-"  # remote pulls' staging before it moved under TMP_PREFIX


def is_key(name: str) -> bool:
    return len(name) == 64 and set(name) <= HEX


def _has_marker(root: Path) -> bool:
    """Whether ``root`` holds npubuild's CACHEDIR.TAG (a regular file, never a symlink)."""
    try:
        fd = open_inside(root, (MARKER,))
    except CacheCorrupt:
        return False
    with os.fdopen(fd, "rb") as fh:
        head = fh.read(1024)
    return head.startswith(MARKER_TEXT.encode()[:43]) and b"created by npubuild" in head


def _write_marker(root: Path) -> None:
    try:
        fd = os.open(root / MARKER, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666)
    except FileExistsError:  # another run wrote it first (or a foreign file: foreign() said no)
        return
    with os.fdopen(fd, "w") as fh:
        fh.write(MARKER_TEXT)


def _is_shard(path: Path) -> bool:
    return len(path.name) == 2 and set(path.name) <= HEX and path.is_dir() and not path.is_symlink()


def _is_orphan_tmp(path: Path, now: float) -> bool:
    """A ``.tmp-<host>-<pid>-*`` whose run is gone: on this host, a dead pid; elsewhere, age."""
    fields = path.name[len(TMP_PREFIX):].rsplit("-", 2)
    try:
        age = now - path.lstat().st_mtime
    except OSError:
        return False
    if len(fields) == 3 and fields[0] == socket.gethostname() and fields[1].isdigit():
        return not _pid_alive(int(fields[1])) or age > ORPHAN_AGE_SECONDS
    return age > ORPHAN_AGE_SECONDS


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
