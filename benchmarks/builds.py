"""Where a benchmark builds: ``--build-dir`` and ``--cache`` to keep its builds (and build
again from the cache), else a temporary folder removed at the end."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path


def add_build_options(parser) -> None:
    parser.add_argument("--build-dir", type=Path, help="keep the builds here (default: temporary)")
    parser.add_argument("--cache", type=Path, help="content cache (default: temporary)")


@contextmanager
def build_roots(args) -> Iterator[tuple[Path, Path]]:
    """(build root, cache folder): the options' folders, else ones in a temporary folder."""
    with tempfile.TemporaryDirectory() as tmp:
        yield args.build_dir or Path(tmp) / "build", args.cache or Path(tmp) / "cache"
