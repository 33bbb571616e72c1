"""Timings are not artifacts: they live in ``report.json`` only (ARCHITECTURE §9), so that two
builds of one recipe write byte-identical artifacts, manifests and cache entries."""

from __future__ import annotations

from typing import Any

TIMING_KEYS = frozenset({"seconds", "seconds_per_run"})


def without_timings(data: Any) -> Any:
    """``data`` with every timing key removed, at any depth (a new object; ``data`` is kept)."""
    if isinstance(data, dict):
        return {k: without_timings(v) for k, v in data.items() if k not in TIMING_KEYS}
    if isinstance(data, list):
        return [without_timings(v) for v in data]
    return data
