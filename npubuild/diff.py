"""`npubuild diff`: which stages two recipe versions build differently, why, and — where both
are built (in the build dir or the cache) — how their figures moved. Like `dvc params diff` +
`dvc metrics diff`, but per pipeline stage.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from npubuild.build.engine import BuildSession
from npubuild.build.keys import section_value
from npubuild.stages import PIPELINE

METRICS = (  # (label, path in a stage's report fragment)
    ("npu segments", ("split", "npu_segments")), ("cpu segments", ("split", "cpu_segments")),
    ("npu nodes", ("split", "npu_nodes")), ("cycles", ("estimate", "cycles")),
    ("fps", ("estimate", "fps")), ("gmem bytes", ("estimate", "gmem_bytes")),
    ("lmem peak bytes", ("estimate", "lmem_peak_bytes")),
    ("bit exact", ("simulator", "bit_exact")),
)


@dataclass
class StageDiff:
    stage: str
    same: bool
    reasons: list[str] = field(default_factory=list)


def field_changes(a: Any, b: Any, prefix: str) -> list[str]:
    """Dotted ``path: old -> new`` lines for every leaf that differs."""
    if isinstance(a, dict) and isinstance(b, dict):
        return [line for k in dict.fromkeys([*a, *b])
                for line in field_changes(a.get(k), b.get(k), f"{prefix}.{k}")]
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [line for i, (x, y) in enumerate(zip(a, b)) for line in field_changes(x, y, f"{prefix}[{i}]")]
    return [] if a == b else [f"{prefix}: {_short(a)} -> {_short(b)}"]


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def diff_sessions(a: BuildSession, b: BuildSession) -> dict:
    """Stage-by-stage differences between two recipes, and their metrics where both built."""
    expected_a, expected_b = a.expected(), b.expected()
    data_a, data_b = a.loaded.recipe.model_dump(mode="json"), b.loaded.recipe.model_dump(mode="json")
    stages, differing = [], set()
    for stage in PIPELINE:
        parts_a, man_a, note_a = expected_a[stage.name]
        parts_b, man_b, note_b = expected_b[stage.name]
        if parts_a is None or parts_b is None:
            stages.append(StageDiff(stage.name, note_a == note_b, [note_a if parts_a is None else note_b]))
            continue
        unknown_inputs = [u for u in stage.needs if u in differing
                          and "missing" in (parts_a.upstream[u], parts_b.upstream[u])]
        if parts_a.key == parts_b.key and not unknown_inputs:
            stages.append(StageDiff(stage.name, True))
            continue
        reasons = []
        for section in stage.sections:
            reasons += field_changes(section_value(data_a, section), section_value(data_b, section), section)
        if parts_a.chip != parts_b.chip:
            reasons.append(f"target chip: {a.loaded.recipe.target} -> {b.loaded.recipe.target}")
        if parts_a.files != parts_b.files:
            reasons.append("input files differ")
        for up in stage.needs:
            if up in unknown_inputs:
                reasons.append(f"its input stage `{up}` differs")
            elif parts_a.upstream[up] != parts_b.upstream[up]:
                reasons.append(f"input artifacts from `{up}` differ")
        if parts_a.version != parts_b.version:
            reasons.append("npubuild version differs")
        stages.append(StageDiff(stage.name, False, reasons))
        differing.add(stage.name)
    return {"a": str(a.loaded.path), "b": str(b.loaded.path),
            "stages": [s.__dict__ for s in stages],
            "metrics": metrics_diff(expected_a, expected_b)}


def metrics_diff(expected_a: dict, expected_b: dict) -> list[dict]:
    """Figures both builds have: output accuracy, segments, cycles, GMEM traffic."""
    report_a, report_b = _merged_report(expected_a), _merged_report(expected_b)
    rows = []
    for label, path in METRICS:
        old, new = _get(report_a, path), _get(report_b, path)
        if old is not None or new is not None:
            rows.append({"metric": label, "a": old, "b": new})
    outputs_a = (_get(report_a, ("accuracy", "outputs")) or {})
    outputs_b = (_get(report_b, ("accuracy", "outputs")) or {})
    for name in dict.fromkeys([*outputs_a, *outputs_b]):
        for metric in ("cosine", "sqnr_db"):
            old = (outputs_a.get(name) or {}).get(metric)
            new = (outputs_b.get(name) or {}).get(metric)
            if old is not None or new is not None:
                rows.append({"metric": f"{name} {metric}", "a": old, "b": new})
    return rows


def _merged_report(expected: dict) -> dict:
    report: dict = {}
    for _, manifest, _ in expected.values():
        if manifest:
            report.update(manifest.get("report", {}))
    return report


def _get(data: dict, path: tuple) -> Any:
    for part in path:
        data = data.get(part) if isinstance(data, dict) else None
    return data
