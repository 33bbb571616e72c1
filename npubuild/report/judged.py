"""What a build is judged on: every verify figure with the threshold it is held to, or none
(reported only), and how much evidence a task metric rests on.

The one place the report page, the run's headline and `npubuild diff` read "judged or not,
against what" from. Thresholds come from the resolved recipe exactly as the verify stage
resolves them (`npubuild.verify.limits.output_limits` and its siblings), so a figure shown as
passing here is one verify passed.

Every figure has a ``key``: its field path in report.json (``accuracy.outputs["output0"].cosine``),
stable across versions and free of display text, for machines (``diff --json``, CI gates).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterator

IDENTIFIER = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def field_key(*parts: str) -> str:
    """A field path: identifiers joined by dots, any other name (a tensor called
    ``/model.22/Sigmoid_output_0``) as a quoted index: ``verify.npu_outputs["/model.22/…"]``."""
    out = ""
    for part in parts:
        if IDENTIFIER.match(part):
            out += f".{part}" if out else part
        else:
            out += '["' + part.replace("\\", "\\\\").replace('"', '\\"') + '"]'
    return out


@dataclass(frozen=True)
class Figure:
    """One figure of a build; ``limit`` None means reported, not judged."""

    key: str
    label: str
    value: Any
    limit: float | None = None
    limit_name: str | None = None  # the recipe field the limit comes from
    higher_is_better: bool = True
    evidence: str = ""  # what the figure rests on: "over 2 boxes in 7 images"
    undefined_misses: bool = False  # judged and undefined is a miss (a task that judged nothing)

    @property
    def judged(self) -> bool:
        return self.limit is not None

    @property
    def ok(self) -> bool | None:
        """True/False against the limit; None when not judged or not a number (False for a
        figure whose undefined value verify counts as a miss)."""
        if self.limit is not None and self.value is None and self.undefined_misses:
            return False
        if self.limit is None or not is_number(self.value):
            return None
        return self.value >= self.limit if self.higher_is_better else self.value <= self.limit

    @property
    def margin(self) -> float | None:
        """How far the value is on the good side of its limit (negative: missed)."""
        if self.limit is None or not is_number(self.value):
            return None
        return self.value - self.limit if self.higher_is_better else self.limit - self.value

    @property
    def rule(self) -> str:
        """``≥ 0.99 (verify.min_cosine)``, or "" when not judged."""
        if self.limit is None:
            return ""
        sign = "≥" if self.higher_is_better else "≤"
        return f"{sign} {self.limit!r}" + (f" ({self.limit_name})" if self.limit_name else "")

    def as_dict(self) -> dict:
        return {"key": self.key, "label": self.label, "value": self.value, "limit": self.limit,
                "limit_name": self.limit_name,
                "direction": "min" if self.higher_is_better else "max", "ok": self.ok,
                **({"evidence": self.evidence} if self.evidence else {})}


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


class _Spec:
    """A recipe section (a dict from recipe.lock or report) read as the verify stage reads its
    pydantic model: attributes, None when unset."""

    def __init__(self, data: dict | None):
        self._data = data or {}

    def __getattr__(self, name: str) -> Any:
        value = self._data.get(name)
        if name == "handover":
            return _Spec(value)
        if name == "slices":
            return [_Spec(s) for s in value or []]
        return value


def _limits(verify_spec: dict | None):
    """(outputs, hand-over, per-slice-label) thresholds as verify resolves them."""
    from npubuild.recipe.model import SliceCheck
    from npubuild.verify.limits import handover_limits, output_limits, slice_limits

    spec = _Spec(verify_spec)
    slices = {}
    for index, check in enumerate(spec.slices):
        label = check.name or SliceCheck.model_validate(
            {k: v for k, v in check._data.items() if k in SliceCheck.model_fields},
            strict=False).label
        slices[label] = (index, slice_limits(spec, check))
    return output_limits(spec), handover_limits(spec), slices


# (metric in report, label, Thresholds attribute, higher is better, shown when not judged)
TENSOR_METRICS = (
    ("cosine", "cosine (all samples)", "min_cosine", True, True),
    ("min_sample_cosine", "cosine (worst sample)", "sample_cosine", True, True),
    ("sqnr_db", "SQNR dB", "min_sqnr_db", True, False),
    ("max_abs", "max abs error", "max_abs", False, False),
    ("range_error", "max error / range", "max_range_error", False, False),
)
GROUPS = (("outputs", "accuracy", "outputs"), ("handover", "verify", "npu_outputs"),
          ("slices", "verify", "slices"))
LIMIT_PREFIX = {"outputs": "verify", "handover": "verify.handover", "slices": "verify.slices"}


def tensor_figures(report: dict, verify_spec: dict | None) -> Iterator[tuple[str, str, list[Figure]]]:
    """Per tensor verify judged or reported: (group, name, figures); group is ``outputs``,
    ``handover`` (tensors an NPU submodel hands over) or ``slices``."""
    from npubuild.verify.limits import output_limits, selection_limits

    outputs, handover, slices = _limits(verify_spec)
    task = (report.get("accuracy") or {}).get("task") or (report.get("verify") or {}).get("task") or {}
    # outputs selected from hand-over tensors by an index (`npubuild.split.selection`)
    selected = ((report.get("verify") or {}).get("selected")
                or (report.get("accuracy") or {}).get("selected") or {})
    selecting = {t for tensors in selected.values() for t in tensors}
    task_reads = {task.get("boxes"), task.get("scores")} - {None} if isinstance(task, dict) else set()
    for group, section, field in GROUPS:
        items = (report.get(section) or {}).get(field) or {}
        if group == "outputs" and not items:
            items = (report.get("verify") or {}).get("outputs") or {}
        for name, m in items.items():
            if not isinstance(m, dict):
                continue
            prefix, limits = LIMIT_PREFIX[group], outputs if group == "outputs" else handover
            if group == "outputs" and name in task_reads:
                limits = output_limits(_Spec(verify_spec), task_reads=True)
            if group == "outputs" and name in selected:
                limits = output_limits(_Spec(verify_spec), selected=True)
            if group == "handover" and name in selecting:
                prefix, limits = "verify", selection_limits(_Spec(verify_spec))
            if group == "slices":
                index, limits = slices.get(name, (None, None))
                prefix = f"{prefix}[{index}]"
            yield group, name, list(_figures_of(prefix, section, field, name, m, limits))


def _figures_of(prefix, section, field, name, m: dict, limits) -> Iterator[Figure]:
    for metric, label, attr, higher, always in TENSOR_METRICS:
        limit = getattr(limits, attr, None) if limits is not None else None
        if metric == "min_sample_cosine" and limit is not None:
            attr = "min_cosine" if getattr(limits, "min_sample_cosine", None) is None else attr
        if metric not in m or (limit is None and not always):
            continue
        limit_name = f"{prefix}.{'min_sample_cosine' if attr == 'sample_cosine' else attr}"
        yield Figure(field_key(section, field, name, metric), f"{name} {label}", m[metric],
                     limit, limit_name if limit is not None else None, higher)
    worst = m.get("worst_channel")
    channel_limit = getattr(limits, "min_channel_cosine", None) if limits is not None else None
    if isinstance(worst, dict) and channel_limit is not None:
        yield Figure(field_key(section, field, name, "worst_channel", "cosine"),
                     f"{name} cosine (worst channel)", worst.get("cosine"), channel_limit,
                     f"{prefix}.min_channel_cosine")
    dead = m.get("dead_channel_count")  # shown when there are any (none is what a pass says)
    dead_judged = limits is not None and getattr(limits, "dead_channels", None) is not False
    if dead:
        yield Figure(field_key(section, field, name, "dead_channel_count"),
                     f"{name} dead channels", dead, 0 if dead_judged else None,
                     f"{prefix}.dead_channels" if dead_judged else None, higher_is_better=False)


def task_figure(report: dict, verify_spec: dict | None) -> Figure | None:
    """The task metric (top-1 agreement, box recall, text-map IoU) with its evidence size."""
    task = (report.get("accuracy") or {}).get("task") or (report.get("verify") or {}).get("task")
    if not isinstance(task, dict) or "agreement" not in task:
        return None
    limit = (verify_spec or {}).get("min_task_agreement")
    samples = (report.get("accuracy") or {}).get("samples") or (report.get("verify") or {}).get("samples")
    return Figure(field_key("accuracy", "task", "agreement"), str(task.get("agreement_is", "task")),
                  task.get("agreement"), limit, "verify.min_task_agreement" if limit is not None
                  else None, evidence=task_evidence(task, samples), undefined_misses=True)


def task_evidence(task: dict, samples: int | None = None) -> str:
    """What a task figure rests on: "over 2 boxes in 7 images", "over 3 samples" (images for
    the image tasks; a classifier, a CTC head or a map may read audio or text); an anchor
    detector's also counts the anchors only the deployed pipeline keeps."""
    images = task.get("samples", samples)
    noun = "image" if task.get("task") in ("detector", "anchor_detector", "text_detection") else "sample"
    shown = f"{images:,} {noun}{'s' * (images != 1)}" if is_number(images) else ""
    if task.get("task") == "detector" and is_number(task.get("float_boxes")):
        n = task["float_boxes"]
        return f"over {n:,} float box{'es' * (n != 1)}" + (f" in {shown}" if shown else "")
    if task.get("task") == "anchor_detector" and is_number(task.get("float_anchors")):
        n = task["float_anchors"]
        added = _anchors_added(task)
        return (f"over {n:,} float anchor{'s' * (n != 1)} kept"
                + (f", {added:,} added by the deployed pipeline," if added else "")
                + (f" in {shown}" if shown else ""))
    if task.get("task") == "text_detection" and is_number(task.get("text_pixels_union")):
        return f"over {task['text_pixels_union']:,} text pixels" + (f" in {shown}" if shown else "")
    if task.get("task") == "classifier" and is_number(task.get("positions")) and is_number(images) \
            and task["positions"] > images:
        return f"over {task['positions']:,} positions in {shown}"
    if task.get("task") == "binary_map" and is_number(task.get("union")):
        n = task["union"]
        return (f"over {n:,} element{'s' * (n != 1)} above {task.get('threshold', 0.5):g}"
                + (f" in {shown}" if shown else ""))
    return f"over {shown}" if shown else ""


def _anchors_added(task: dict) -> int:
    """Anchors the deployed pipeline keeps that float does not (they lower the agreement too:
    with none kept in float, they are all it rests on)."""
    deployed, agreeing = task.get("deployed_anchors"), task.get("agreeing_anchors")
    return int(deployed - agreeing) if is_number(deployed) and is_number(agreeing) else 0


def all_figures(report: dict, verify_spec: dict | None) -> list[Figure]:
    """The task figure, then every tensor's figures (outputs, hand-overs, slices)."""
    task = task_figure(report, verify_spec)
    return ([task] if task else []) + [f for _, _, figures in tensor_figures(report, verify_spec)
                                       for f in figures]


def counts(figures: list[Figure]) -> dict[str, int]:
    """How many figures are judged, failed, and reported only."""
    judged = [f for f in figures if f.judged]
    return {"judged": len(judged), "failed": sum(f.ok is False for f in judged),
            "reported": len(figures) - len(judged)}


def worst_cosine(figures: list[Figure]) -> Figure | None:
    """The lowest cosine a threshold judges (all samples or worst sample), else the lowest of
    the model outputs' (reported only)."""
    cosines = [f for f in figures if ".outputs" in f.key or f.judged
               if f.key.endswith(("cosine", "min_sample_cosine")) and is_number(f.value)]
    judged = [f for f in cosines if f.judged] or [f for f in cosines if ".outputs" in f.key]
    return min(judged, key=lambda f: f.value, default=None)


def tightest(figures: list[Figure]) -> Figure | None:
    """The judged cosine closest to (or furthest below) its threshold: the one a reviewer
    reads first."""
    judged = [f for f in figures if f.judged and f.margin is not None
              and f.key.endswith(("cosine", "min_sample_cosine"))]
    return min(judged, key=lambda f: f.margin, default=None)
