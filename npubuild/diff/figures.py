"""The figures a reviewer compares between two versions, per chip, read from the stage manifests
that the build directory or the content cache hold (nothing is built to get them).

Figures are looked up leniently: a key a stage does not write (yet) is simply absent, and
per-output, per-handover and per-slice cosines are listed under whatever names the build has.
"""

from __future__ import annotations

from typing import Any

# (label, path in the merged report fragments)
SCALARS = (
    ("NPU fps", ("estimate", "npu_fps")),  # the measured fps (CPU parts timed) is not in manifests
    ("cycles", ("estimate", "cycles")),
    ("GMEM bytes grouped", ("estimate", "gmem_bytes")),
    ("GMEM bytes lower bound", ("estimate", "gmem_bytes_lower_bound")),
    ("GMEM bytes per layer", ("estimate", "gmem_bytes_no_grouping")),
    ("LMEM peak bytes", ("estimate", "lmem_peak_bytes")),
    ("simulator bit-exact", ("simulator", "bit_exact")),
    ("NPU segments", ("split", "npu_segments")),
    ("CPU segments", ("split", "cpu_segments")),
)
COSINES = (  # (label prefix, path to {name: metrics}) in the order a reviewer reads them
    ("cosine output", ("accuracy", "outputs")),
    ("cosine NPU hand-over", ("verify", "npu_outputs")),
    ("cosine slice", ("verify", "slices")),
    ("cosine slice", ("accuracy", "slices")),
)


def merged_report(expected: dict) -> dict:
    """The report fragments of every stage that has a manifest (built or cached)."""
    report: dict = {}
    for _, manifest, _ in expected.values():
        if manifest:
            report.update(manifest.get("report", {}))
    return report


def figures(report: dict) -> dict[str, Any]:
    """Label -> value for one build: verdict, cosines (all samples / worst sample), NPU
    coverage, NPU fps, GMEM, LMEM."""
    verdict = _get(report, ("verify", "passed"))
    out: dict[str, Any] = {} if verdict is None else {"verdict": "pass" if verdict else "fail"}
    for prefix, path in COSINES:
        for name, m in (_get(report, path) or {}).items():
            if isinstance(m, dict) and isinstance(m.get("cosine"), (int, float)):
                out[f"{prefix} {name}"] = m["cosine"]
                if isinstance(m.get("min_sample_cosine"), (int, float)):
                    out[f"{prefix} {name}, worst sample"] = m["min_sample_cosine"]
    out.update(coverage(report.get("split") or {}))
    for label, path in SCALARS:
        value = _get(report, path)
        if value is not None:
            out[label] = value
    from npubuild.backends.figures import vendor_figures

    out.update(vendor_figures(report))  # real chips: the vendor's own figures
    return out


def coverage(split: dict) -> dict[str, Any]:
    """NPU share of the nodes and (where the split stage counted them) of the MACs."""
    out = {}
    for unit in ("nodes", "macs"):
        npu, cpu = split.get(f"npu_{unit}"), split.get(f"cpu_{unit}")
        if isinstance(npu, int) and isinstance(cpu, int) and npu + cpu:
            out[f"NPU share of {'MACs' if unit == 'macs' else unit}"] = npu / (npu + cpu)
    return out


def compare(a: dict[str, Any], b: dict[str, Any]) -> list[dict]:
    """Rows ``{figure, a, b}`` for every figure either side has, a's order first."""
    return [{"figure": k, "a": a.get(k), "b": b.get(k)} for k in dict.fromkeys([*a, *b])]


def _get(data: Any, path: tuple) -> Any:
    for part in path:
        data = data.get(part) if isinstance(data, dict) else None
    return data
