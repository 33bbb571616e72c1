"""File names made from tensor, node and layer names: safe, bounded and deterministic.

Real models name tensors with ``/``, ``:``, spaces and hundreds of characters (a TensorFlow
export's scopes, a Paddle export's ``p2o.Conv.12`` chains); file systems allow 255 bytes and
no ``/``. A name that is already a short, plain file name is kept as it is, so dumps stay easy
to read; any other is sanitised, truncated and given a short hash of the full name, so two
names that sanitise or truncate alike still get different files. The same name always gives
the same file name (no counters that depend on what was written first).
"""

from __future__ import annotations

import hashlib
import re

MAX_STEM = 96  # characters before the suffix: far below the 255-byte limit of common filesystems
HASH_CHARS = 8
UNSAFE = re.compile(r"[^A-Za-z0-9_.-]+")


def safe_stem(name: str, max_len: int = MAX_STEM, *, hashed: bool = False) -> str:
    """A file-name stem for ``name``: ``name`` itself when it is plain and short enough (and
    not ``hashed``), else its sanitised, truncated form plus ``-`` and a short hash of ``name``."""
    plain = UNSAFE.sub("_", name).strip("_.")
    if not hashed and plain == name and 0 < len(name) <= max_len:
        return name
    digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:HASH_CHARS]
    keep = max(max_len - HASH_CHARS - 1, 1)
    return f"{(plain or 'tensor')[:keep].rstrip('_.')}-{digest}"
