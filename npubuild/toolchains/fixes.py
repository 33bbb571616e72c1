"""Post-install fixes a toolchain's environment needs, by name (`Toolchain.post_install`)."""

from __future__ import annotations

import logging
from pathlib import Path

log = logging.getLogger("npubuild")

#: tpu_mlir's wheel bundles Ubuntu 22.04's glibc 2.35 (libc, libm, libpthread) in
#: tpu_mlir/lib/third_party/, which its tools load before the system's: on a newer glibc every
#: tool dies with "GLIBC_2.36 not found". Moved aside, the system's own are used.
BUNDLED_GLIBC = ("libc.so.6", "libm.so.6", "libpthread.so.0")


def move_bundled_glibc(env: Path) -> list[Path]:
    """Rename the glibc files tpu_mlir bundles to ``*.bundled`` (kept, not deleted)."""
    moved = []
    for lib in sorted(env.glob("lib/python*/site-packages/tpu_mlir/lib/third_party")):
        for name in BUNDLED_GLIBC:
            path = lib / name
            if path.exists():
                path.rename(path.with_name(name + ".bundled"))
                moved.append(path)
    log.info("toolchain tpu-mlir: moved aside its bundled glibc files: %s",
             ", ".join(p.name for p in moved) or "none found")
    return moved
