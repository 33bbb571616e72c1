"""Timings are not artifacts: they live in ``report.json`` only (ARCHITECTURE §9), so that two
builds of one recipe write byte-identical artifacts, manifests and cache entries."""

from __future__ import annotations

from typing import Any

TIMING_KEYS = frozenset({"seconds", "seconds_per_run"})


#: ``estimate`` figures measured on the build machine (the CPU parts' ONNX Runtime time and the
#: fps that adds it): report.json only, like timings; the NPU's own figures stay in artifacts.
MEASURED_ESTIMATE_KEYS = ("fps", "fps_no_grouping", "cpu_seconds")


def without_measurements(report: dict) -> dict:
    """A stage's report as its manifest keeps it: no timings at any depth, and no estimate
    figure measured on this machine (so two builds of one recipe write identical manifests)."""
    out = without_timings(report)
    if isinstance(out.get("estimate"), dict):
        out["estimate"] = {k: v for k, v in out["estimate"].items()
                           if k not in MEASURED_ESTIMATE_KEYS}
    return out


def without_timings(data: Any) -> Any:
    """``data`` with every timing key removed, at any depth (a new object; ``data`` is kept)."""
    if isinstance(data, dict):
        return {k: without_timings(v) for k, v in data.items() if k not in TIMING_KEYS}
    if isinstance(data, list):
        return [without_timings(v) for v in data]
    return data
