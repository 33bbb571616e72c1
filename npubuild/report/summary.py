"""The few lines a finished `npubuild run` ends with: verdict, worst cosine, NPU coverage,
frames per second, GMEM traffic — the text form of report.html's headline row, read from the
same artifacts through the same functions; a figure whose stage was not built is left out."""

from __future__ import annotations

from pathlib import Path

from npubuild.report.artifacts import BuildArtifacts
from npubuild.report.headline import worst_cosines
from npubuild.report.overview import verdict


def headline_lines(root: Path) -> list[str]:
    """The headline of the build in ``root`` (build/<name>/), one line per figure."""
    a = BuildArtifacts(Path(root))
    split, estimate = a.report.get("split") or {}, a.report.get("estimate") or {}
    lines = []
    kind, text = verdict(a)
    if kind != "none":
        lines.append(f"verify {'passed' if kind == 'pass' else 'failed' if kind == 'fail' else text}")
    judged = [(worst, f"{group} {name}") for group, name, worst, _ in worst_cosines(a)
              if worst is not None]
    if judged:
        worst, where = min(judged)
        lines.append(f"worst cosine {worst:.6f} ({where}, worst sample)")
    if "npu_nodes" in split:
        nodes = split["npu_nodes"] + split.get("cpu_nodes", 0)
        share = split["npu_nodes"] / nodes if nodes else 0.0
        lines.append(f"NPU coverage {split['npu_nodes']}/{nodes} nodes ({share:.0%})")
    if isinstance(estimate.get("fps"), (int, float)):
        fps = estimate["fps"]
        npu = f" (NPU alone {estimate['npu_fps']:,.0f})" if estimate.get("npu_fps") else ""
        lines.append(f"estimated {fps:,.0f} fps{npu}" if fps >= 100 else
                     f"estimated {fps:.1f} fps{npu}")
    grouped, per_layer = estimate.get("gmem_bytes"), estimate.get("gmem_bytes_no_grouping")
    if grouped is not None and per_layer:
        lines.append(f"GMEM {grouped:,} bytes per frame, {grouped / per_layer:.2f} of layer by "
                     f"layer ({per_layer:,})")
    return lines
