"""How the remote cache moves bytes, and what it never does while moving them.

Two transports behind one small interface (`open` a file for reading with its size known
before the first byte, `put` a file from chunks, list the `keys`):

- `LocalTransport` for ``file://`` remotes: every path component below the remote's root is
  opened with ``O_NOFOLLOW`` (a symlink is refused, never followed), only regular files are read
  (a FIFO or ``/dev/zero`` is refused before the first read) and files are written to a
  temporary name and renamed into place, so a planted symlink is replaced, never written through;
- `FsspecTransport` for everything else (``s3://``, ``gs://``…), which has no symlinks: the
  size comes from the object's metadata before any download.

Each call runs under a deadline (`call_with_deadline`): a remote that stops answering costs
seconds, never a hung build. Errors are sorted into three kinds the remote cache treats
differently: `EntryMissing` (an absent file: a miss), `CacheCorrupt` (this entry is bad:
a miss, one warning) and `Unreachable` (the remote itself failed: the remote is left alone
for the rest of the run).
"""

from __future__ import annotations

import errno
import os
import re
import socket
import stat as stat_mod
import threading
import uuid
from typing import Any, BinaryIO, Callable, Iterable
from urllib.parse import unquote

from npubuild.engine.cache import TMP_PREFIX, CacheCorrupt, EntryMissing, is_key, safe_open
from npubuild.engine.paths import MANIFEST

REMOTE_TIMEOUT_ENV = "NPUBUILD_REMOTE_TIMEOUT"
DEFAULT_TIMEOUT = 10.0  # seconds a remote may stay silent before it is given up for the run
MIN_RATE = 1 << 20  # bytes per second a transfer may not fall below (added to the deadline)
READ_BLOCK = 4 << 20  # what fsspec reads ahead: memory stays bounded whatever an object's size
# Write errors that belong to one entry (a name too long, a directory in a file's place), not
# to the remote as a whole (no space, no permission, a dead mount)
ENTRY_ERRNOS = frozenset({errno.EISDIR, errno.ENOTDIR, errno.ELOOP, errno.ENAMETOOLONG,
                          errno.EEXIST, errno.ENOTEMPTY, errno.EINVAL})
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW


class Unreachable(Exception):
    """The remote itself failed (network, permission, timeout); the message holds no secret."""


def timeout_seconds(environ=os.environ) -> float:
    """The remote's deadline: ``$NPUBUILD_REMOTE_TIMEOUT`` seconds, else 10."""
    try:
        value = float(environ.get(REMOTE_TIMEOUT_ENV, DEFAULT_TIMEOUT))
    except ValueError:
        return DEFAULT_TIMEOUT
    return value if value > 0 else DEFAULT_TIMEOUT


def call_with_deadline(fn: Callable[..., Any], seconds: float, *args: Any) -> Any:
    """``fn(*args)``, or Unreachable after ``seconds``: the call goes on in a daemon thread that
    nothing waits for (a frozen socket or mount cannot be interrupted, only abandoned; a daemon
    thread does not keep the process alive at exit)."""
    box: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            box["value"] = fn(*args)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller's thread
            box["error"] = exc
        finally:
            done.set()

    threading.Thread(target=target, name="npubuild-remote", daemon=True).start()
    if not done.wait(seconds):
        raise Unreachable(f"no answer within {seconds:.0f} s")
    if "error" in box:
        raise box["error"]
    return box["value"]


# -- secrets never shown --------------------------------------------------------------------
_USERINFO = re.compile(r"(?<=://)[^/@]*@")


def redact(url: str) -> str:
    """The URL as it may be shown: a ``user:password@`` part becomes ``***@``."""
    return _USERINFO.sub("***@", url)


def scrub(text: str, url: str) -> str:
    """``text`` (an exception's message) with the URL's user and password taken out."""
    found = _USERINFO.search(url)
    if not found:
        return text
    secrets = {part for piece in found.group(0)[:-1].split(":", 1) for part in (piece, unquote(piece))
               if len(part) >= 3}
    for secret in sorted(secrets, key=len, reverse=True):
        text = text.replace(secret, "***")
    return text


# -- file:// ---------------------------------------------------------------------------------
class LocalTransport:
    """A remote in a local (or mounted) folder, read and written without following symlinks."""

    def __init__(self, root: str):
        self.root = root

    def _root_fd(self, *, create: bool = False) -> int:
        """The root folder (the user's own setting: it may be a symlink); absent, nothing is
        on the remote yet (EntryMissing) until the first write makes it."""
        try:
            if create:
                os.makedirs(self.root, exist_ok=True)
            return os.open(self.root, os.O_RDONLY | os.O_DIRECTORY)
        except FileNotFoundError:
            raise EntryMissing(f"{self.root} does not exist") from None
        except OSError as exc:
            raise Unreachable(f"{self.root}: {exc.strerror or exc}") from None

    def open(self, parts: tuple[str, ...]) -> tuple[BinaryIO, int]:
        """A regular file below the root, and its size; never through a symlink."""
        root = self._root_fd()
        try:
            fd = safe_open(root, parts)
        finally:
            os.close(root)
        return os.fdopen(fd, "rb"), os.fstat(fd).st_size

    def put(self, parts: tuple[str, ...], chunks: Iterable[bytes]) -> None:
        """Write ``chunks`` to a temporary name in the target's folder, then rename it into
        place (a symlink or file planted there is replaced, never written through)."""
        fd = self._root_fd(create=True)
        try:
            for part in parts[:-1]:
                fd, parent = _enter(fd, part), fd
                os.close(parent)
            tmp = f"{TMP_PREFIX}{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
            out = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o666,
                          dir_fd=fd)
            try:
                with os.fdopen(out, "wb") as fh:
                    for chunk in chunks:
                        fh.write(chunk)
                os.rename(tmp, parts[-1], src_dir_fd=fd, dst_dir_fd=fd)
            except BaseException:
                _unlink_quietly(tmp, fd)
                raise
        except OSError as exc:
            raise _write_error(exc, parts) from None
        finally:
            os.close(fd)

    def keys(self) -> list[str]:
        """Keys whose folder holds a regular ``manifest.json`` (symlinks never followed)."""
        found = []
        try:
            shards = sorted(os.scandir(self.root), key=lambda e: e.name)
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise Unreachable(f"{self.root}: {exc.strerror or exc}") from None
        for shard in shards:
            if len(shard.name) != 2 or not shard.is_dir(follow_symlinks=False):
                continue
            try:
                entries = list(os.scandir(shard.path))
            except OSError:
                continue
            for entry in entries:
                manifest = os.path.join(entry.path, MANIFEST)
                if (is_key(entry.name) and entry.is_dir(follow_symlinks=False)
                        and os.path.lexists(manifest)
                        and stat_mod.S_ISREG(os.lstat(manifest).st_mode)):
                    found.append(entry.name)
        return sorted(found)


def _enter(fd: int, part: str) -> int:
    """The folder ``part`` inside ``fd``, made if absent, never through a symlink."""
    try:
        os.mkdir(part, 0o777, dir_fd=fd)
    except FileExistsError:
        pass
    return os.open(part, _DIR_FLAGS, dir_fd=fd)


def _unlink_quietly(name: str, dir_fd: int) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _write_error(exc: OSError, parts: tuple[str, ...]) -> Exception:
    if exc.errno in ENTRY_ERRNOS:
        return CacheCorrupt(f"cannot write {'/'.join(parts[2:])[:80]}: {exc.strerror or exc}")
    return Unreachable(exc.strerror or str(exc))


# -- s3://, gs://, ... -----------------------------------------------------------------------
class FsspecTransport:
    """Any fsspec filesystem; objects are sized from their metadata before they are read."""

    def __init__(self, fs: Any, root: str):
        self.fs, self.root = fs, root

    def _path(self, parts: tuple[str, ...]) -> str:
        return "/".join((self.root, *parts))

    def open(self, parts: tuple[str, ...]) -> tuple[BinaryIO, int]:
        path = self._path(parts)
        try:
            info = self.fs.info(path)
            if info.get("type") != "file" or not isinstance(info.get("size"), int):
                raise CacheCorrupt(f"{'/'.join(parts[2:])[:80]} is not a file")
            return self.fs.open(path, "rb", block_size=READ_BLOCK, size=info["size"]), info["size"]
        except FileNotFoundError:
            raise EntryMissing(f"{'/'.join(parts[2:])[:80]} is missing") from None
        except CacheCorrupt:
            raise
        except Exception as exc:  # noqa: BLE001 - any transport error means "no remote"
            raise Unreachable(_first_line(exc)) from None

    def put(self, parts: tuple[str, ...], chunks: Iterable[bytes]) -> None:
        path = self._path(parts)
        try:
            self.fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)  # a no-op on object stores
            with self.fs.open(path, "wb") as fh:
                for chunk in chunks:
                    fh.write(chunk)
        except Exception as exc:  # noqa: BLE001
            raise Unreachable(_first_line(exc)) from None

    def keys(self) -> list[str]:
        try:
            found = self.fs.glob(f"{self.root}/*/*/{MANIFEST}")
        except Exception as exc:  # noqa: BLE001
            raise Unreachable(_first_line(exc)) from None
        return sorted({name for p in found if is_key(name := p.rstrip("/").split("/")[-2])})


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0][:300] if text else type(exc).__name__
