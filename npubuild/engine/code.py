"""The digest of npubuild's own code: part of every stage key.

Two commits of npubuild with the same version string may build different artifacts, so a key
that named only the version would let a shared remote cache hand one commit's artifacts to
the other. The digest covers what can change an artifact: the installed package's ``.py``
files and the data it ships (chip presets, schemas), as sorted relative paths plus contents.
It is what a wheel installs, so a wheel install and an editable install of the same source
agree; byte code (``__pycache__``) and anything else lying in a source checkout is left out.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from npubuild.engine.hashing import HashCache

# The package's code and shipped data; pyproject's [tool.setuptools.package-data] lists the
# same data patterns (a test keeps the two equal).
CODE_PATTERNS = ("**/*.py",)
DATA_PATTERNS = ("targets/*.yaml", "schemas/*.schema.json", "py.typed", "toolchains/workers/*.py")


def code_files(package: Path) -> list[Path]:
    """The package's code and shipped data files, sorted by relative path."""
    found = {p for pattern in (*CODE_PATTERNS, *DATA_PATTERNS) for p in package.glob(pattern)
             if p.is_file() and "__pycache__" not in p.relative_to(package).parts}
    return sorted(found, key=lambda p: p.relative_to(package).as_posix())


def tree_digest(package: Path, files: Iterable[Path] | None = None) -> str:
    """sha256 over each file's relative path and content (lengths framed, so no two trees
    collide by moving bytes between a name and a content); ``files``: `code_files` of
    ``package``, when the caller has them."""
    digest = hashlib.sha256()
    for path in code_files(package) if files is None else files:
        name, data = path.relative_to(package).as_posix().encode(), path.read_bytes()
        digest.update(b"%d:%s%d:" % (len(name), name, len(data)))
        digest.update(data)
    return digest.hexdigest()


def running_package() -> Path:
    """The folder of the running npubuild."""
    import npubuild

    return Path(npubuild.__file__).resolve().parent


@cache
def running_code_files() -> tuple[Path, ...]:
    """`code_files` of the running npubuild, listed once per process (a run's no-op stamp and
    validate's model facts both ask)."""
    return tuple(code_files(running_package()))


@cache
def code_digest() -> str:
    """The running npubuild's digest, computed once per process (≈ 1.5 MB read)."""
    return tree_digest(running_package(), running_code_files())


def remembered_code_digest(hashes: HashCache) -> str:
    """`code_digest`, read from a build's hash cache when it holds it for these very files
    (their stat keys, which the cache trusts for every file it remembers), else computed and
    remembered there: a run that finds its stages current reads no code."""
    return hashes.derived(f"npubuild code in {running_package()}", running_code_files(),
                          code_digest)
