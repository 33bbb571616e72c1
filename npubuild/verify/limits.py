"""The thresholds a verified tensor is judged against, read from the recipe's ``verify:``
section: a module of its own, without numpy, so the run summary (`npubuild.report.judged`)
names each figure's limit without loading the measuring code."""

from __future__ import annotations

from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Thresholds:
    """What a tensor must reach; None: reported, not judged."""

    min_cosine: float | None = None
    min_sqnr_db: float | None = None
    max_abs: float | None = None
    max_range_error: float | None = None
    min_channel_cosine: float | None = None
    min_sample_cosine: float | None = None  # None: min_cosine
    dead_channels: bool | None = None  # None: fail on a dead channel

    @classmethod
    def of(cls, spec, **defaults) -> "Thresholds":
        """From a recipe section with these fields (``defaults`` fill the unset ones)."""
        values = {f: getattr(spec, f, None) for f in cls.__dataclass_fields__}
        return cls(**{f: defaults.get(f) if v is None else v for f, v in values.items()})

    @property
    def sample_cosine(self) -> float | None:
        return self.min_cosine if self.min_sample_cosine is None else self.min_sample_cosine


def output_limits(spec, task_reads: bool = False, selected: bool = False) -> Thresholds:
    """A model output's thresholds; ``task_reads``: an output the ``anchor_detector`` task
    judges (its box regressors and scores) with ``min_task_agreement`` set: its cosines are
    reported, not judged, since a user decodes only the anchors the task compares (thousands
    of anchors no object is near carry regressors nobody reads). Without the task's bar the
    cosines stay judged, so the outputs are never left unjudged. ``selected``: an output a CPU
    part selects from NPU hand-over tensors by an index it chose (`npubuild.split.selection`):
    reported, its thresholds judged on those tensors (`selection_limits`)."""
    if selected:
        return Thresholds(dead_channels=False)
    limits = Thresholds.of(spec)
    if task_reads and spec.task == "anchor_detector" and spec.min_task_agreement is not None:
        return replace(limits, min_cosine=None, min_sample_cosine=None)
    return limits


def slice_limits(spec, check) -> Thresholds:
    """A slice's own thresholds; its min_cosine defaults to verify.min_cosine."""
    return Thresholds.of(check, min_cosine=spec.min_cosine)


def handover_limits(spec) -> Thresholds:
    """Hand-over tensors: verify.handover only (dead channels reported, failed when asked)."""
    return Thresholds.of(spec.handover, dead_channels=False)


def selection_limits(spec) -> Thresholds:
    """A hand-over tensor a model output is selected from: the outputs' thresholds (a dead
    channel, along the anchors such a tensor lists, reported only unless asked)."""
    return Thresholds.of(spec, dead_channels=False)
