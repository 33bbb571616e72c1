"""A build directory belongs to one recipe file.

``build/<name>/`` is named after the recipe's ``name:``, so two recipe files with one name would
share it: each run would find the other's stages stale, rebuild them over each other, and
rewrite the other's report.json. As Bazel refuses two targets with one label and DVC two stages
with one output, the first recipe file to build there owns the folder (``.recipe`` records it,
relative to the folder, so moving the whole tree keeps it) and another file with the same name
is refused with both paths and what to do. A recorded owner that no longer exists (the recipe was
renamed or moved) hands the folder over to the file that builds there now.
"""

from __future__ import annotations

import os
from pathlib import Path

from npubuild.atomic import write_text


def claim(build_dir: Path, owner_file: Path, recipe: Path) -> Path | None:
    """Record ``recipe`` as the owner of ``build_dir`` (called under the build lock) and return
    None; or, when another existing recipe file owns it, change nothing and return that file."""
    owner = recorded_owner(build_dir, owner_file)
    if owner is not None and owner.exists() and not same_file(owner, recipe):
        return owner
    target = os.path.relpath(recipe.resolve(), build_dir.resolve())
    if _read(owner_file) != target:
        write_text(owner_file, target + "\n")
    return None


def recorded_owner(build_dir: Path, owner_file: Path) -> Path | None:
    """The recipe file recorded as the folder's owner (None when none is recorded)."""
    text = _read(owner_file)
    return (build_dir.resolve() / text) if text else None


def _read(owner_file: Path) -> str:
    try:
        if owner_file.is_symlink() or not owner_file.is_file():
            return ""
        return owner_file.read_text(encoding="utf-8", errors="replace").strip()[:4096]
    except OSError:
        return ""


def same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def shown(path: Path) -> str:
    """A path as the user would write it: relative to the current folder when inside it."""
    resolved = path.resolve()
    try:
        return str(resolved.relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(resolved)
