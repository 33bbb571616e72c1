"""Values the verify data reach that calibration never produced.

A detector calibrated on images without its object (a face detector on cats and coffee) sees
only negative scores, so its score tensor's range ends at 0 and the one face of a verify image
is clipped there: a few elements in thousands, which no cosine threshold and no clipped-fraction
test notices, and which int16 or float elsewhere cannot bring back. Where the float pipeline's
value of an NPU hand-over tensor lies steps beyond everything calibration observed for it, the
cause is the calibration data, and verify says so first, naming the sample.
"""

from __future__ import annotations

from typing import Iterable

import numpy as np

UNSEEN_STEPS = 2.0  # beyond calibration's observed extremes by this many steps of the tensor
SHOWN = 4


def unseen_values(calibration: dict, floats: list[dict], labels: list[str],
                  passing: Iterable[str] = ()) -> list[dict]:
    """Hand-over tensors (in ``floats``, the float pipeline's values per sample) whose values go
    at least ``UNSEEN_STEPS`` quantization steps past what calibration observed (calibration.json's
    ``min``/``max``): per tensor and end (``above`` the largest, ``below`` the smallest), the
    sample where it goes furthest; the furthest first. Both ends are kept apart: a detector's
    far negative scores (harmless) would otherwise hide its one clipped positive. ``passing``
    model outputs (and a hand-over tensor holding the same values) are left out: what they
    clip did not fail them."""
    found = []
    for graph in calibration.get("graphs", {}).values():
        for name, seen in graph.get("tensors", {}).items():
            if name in floats[0] and seen.get("scale") and seen.get("min") is not None:
                for end in ("above", "below"):
                    beyond = _furthest(seen, [f[name] for f in floats], end)
                    if beyond["steps"] >= UNSEEN_STEPS:
                        found.append({"tensor": name, "sample": labels[beyond.pop("index")],
                                      **beyond})
    found.sort(key=lambda f: (-f["steps"], f["tensor"], f["end"]))
    # a model output that is a CPU reshape of a hand-over tensor holds the same values: once
    passing = set(passing)
    harmless = {_key(f) for f in found if f["tensor"] in passing}
    same = {}
    for f in found:
        same.setdefault(_key(f), f)
    return [f for key, f in same.items() if key not in harmless][:SHOWN]


def _key(f: dict) -> tuple:
    return (f["end"], f["value"], f["sample"], *f["calibrated"])


def _furthest(seen: dict, values: list[np.ndarray], end: str) -> dict:
    """The value furthest ``end`` (above or below) ``[seen.min, seen.max]``, in steps of
    ``seen.scale``."""
    lo, hi, step = float(seen["min"]), float(seen["max"]), float(seen["scale"])
    best = {"end": end, "steps": 0.0, "value": None, "calibrated": [lo, hi], "index": 0}
    for i, v in enumerate(values):
        v = np.asarray(v, np.float64)
        if not v.size:
            continue
        value = float(v.max()) if end == "above" else float(v.min())
        past = value - hi if end == "above" else lo - value
        if np.isfinite(past) and past / step > best["steps"]:
            best.update(steps=round(past / step, 2), value=value, index=i)
    return best


def note(found: list[dict]) -> str:
    """The hint's first sentence for ``unseen_values``'s findings ("" for none)."""
    if not found:
        return ""
    parts = [f"{f['tensor']!r} reaches {f['value']:.4g} on {f['sample']} where calibration saw "
             f"{f['calibrated'][0]:.4g} .. {f['calibrated'][1]:.4g} ({f['steps']:g} steps {f['end']})"
             for f in found]
    return ("the verify data reach values the calibration data never produced, and int8 clips "
            "them: " + "; ".join(parts) + ". Add samples like these to "
            "quantization.calibration.data (the precision search cannot widen a range "
            "calibration never saw)")
