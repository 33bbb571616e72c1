"""The few figures a finished run ends with (`npubuild run` prints them): verdict, worst
cosine, NPU coverage, frames per second, GMEM traffic. Read from report.json's content; a
figure whose stage was not built is left out."""

from __future__ import annotations

from typing import Any


def headline(report: dict[str, Any]) -> dict[str, Any]:
    """The headline figures as data (absent ones omitted)."""
    out: dict[str, Any] = {}
    verify = report.get("verify")
    if isinstance(verify, dict) and "passed" in verify:
        out["verdict"] = "passed" if verify["passed"] else "failed"
    worst = worst_cosine(report)
    if worst:
        out["worst_cosine"], out["worst_tensor"] = worst
    split = report.get("split") or {}
    if "npu_nodes" in split:
        out["npu_nodes"] = split["npu_nodes"]
        out["nodes"] = split["npu_nodes"] + split.get("cpu_nodes", 0)
    estimate = report.get("estimate") or {}
    for name in ("fps", "npu_fps", "gmem_bytes", "gmem_bytes_no_grouping"):
        if estimate.get(name) is not None:
            out[name] = estimate[name]
    return out


def worst_cosine(report: dict[str, Any]) -> tuple[float, str] | None:
    """The lowest cosine on any sample of any model output, NPU hand-over tensor or output
    slice that the run measured, with the tensor's (or slice's) name."""
    verify = report.get("verify") or {}
    judged = {**((report.get("accuracy") or {}).get("outputs") or {}),
              **(verify.get("npu_outputs") or {}), **(verify.get("slices") or {})}
    scored = [(m.get("min_sample_cosine", m.get("cosine")), name) for name, m in judged.items()
              if isinstance(m, dict)]
    scored = [(c, name) for c, name in scored if isinstance(c, (int, float))]
    return min(scored) if scored else None


def headline_lines(report: dict[str, Any]) -> list[str]:
    """The headline as text, one line per figure."""
    h = headline(report)
    lines = []
    if "verdict" in h:
        lines.append(f"verify {h['verdict']}")
    if "worst_cosine" in h:
        lines.append(f"worst cosine {h['worst_cosine']:.6f} ({h['worst_tensor']}, worst sample)")
    if "nodes" in h:
        share = h["npu_nodes"] / h["nodes"] if h["nodes"] else 0.0
        lines.append(f"NPU coverage {h['npu_nodes']}/{h['nodes']} nodes ({share:.0%})")
    if "fps" in h:
        npu = f" (NPU alone {h['npu_fps']:,.0f})" if "npu_fps" in h else ""
        fps = f"{h['fps']:,.0f}" if h["fps"] >= 100 else f"{h['fps']:.1f}"
        lines.append(f"estimated {fps} fps{npu}")
    if h.get("gmem_bytes_no_grouping"):
        ratio = h["gmem_bytes"] / h["gmem_bytes_no_grouping"]
        lines.append(f"GMEM {h['gmem_bytes']:,} bytes per frame, {ratio:.2f} of layer by layer "
                     f"({h['gmem_bytes_no_grouping']:,})")
    return lines
