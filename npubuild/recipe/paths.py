"""Paths in recipes: relative to the recipe file, globs for data, and ``pkg:<package>/<path>``
for files shipped inside an installed Python package (found without importing it)."""

from __future__ import annotations

import glob
import importlib.util
from pathlib import Path

from npubuild.errors import UserError

PKG_PREFIX = "pkg:"


def package_dir(package: str) -> Path:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise UserError(f"package {package!r} is not installed",
                        hint=f"pip install {package} (pkg: paths read files shipped in packages)")
    return Path(next(iter(spec.submodule_search_locations)))


def resolve(spec: str, base_dir: Path) -> Path:
    """The filesystem path a recipe path names (it need not exist)."""
    if spec.startswith(PKG_PREFIX):
        package, _, inner = spec[len(PKG_PREFIX):].partition("/")
        if not package or not inner:
            raise UserError(f"{spec!r} is not of the form pkg:<package>/<path>")
        return package_dir(package) / inner
    path = Path(spec).expanduser()
    return path if path.is_absolute() else base_dir / path


def resolve_glob(specs: str | list[str], base_dir: Path) -> list[Path]:
    """Every file a data spec (a path, a glob, or a list of them) matches, sorted, no repeats."""
    found: list[Path] = []
    for spec in [specs] if isinstance(specs, str) else specs:
        pattern = resolve(spec, base_dir)
        matches = sorted(Path(p) for p in glob.glob(str(pattern)) if Path(p).is_file())
        if not matches and not glob.has_magic(str(pattern)) and pattern.is_file():
            matches = [pattern]
        if not matches:
            raise UserError(f"no file matches {spec!r} (looked for {pattern})")
        found.extend(m for m in matches if m not in found)
    return found
