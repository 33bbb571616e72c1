"""verify's verdict on a set of samples, in one place: the verify stage judges the deployed
pipeline with it, and the quantize stage's precision search judges every choice it tries with
it, so the search's pass is verify's pass.

Per sample the caller gives three value dicts: the float original (model outputs), the
deployed pipeline (model outputs and the tensors NPU submodels hand over) and the float
pipeline (the same tensors, in float). ``judge`` measures every model output against the
original, every hand-over tensor and ``verify.slices`` entry against its float reference
(`npubuild.verify.judge`), the task (`npubuild.verify.tasks`), and lists each threshold
missed, one line each.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np

from npubuild.verify.judge import HeldBytes, TensorStream, Thresholds, tensor_metrics
from npubuild.verify.judge import failures as failures_of
from npubuild.verify.limits import handover_limits, output_limits, selection_limits, slice_limits

Values = dict[str, np.ndarray]


@dataclass
class Verdict:
    """Every figure verify reports, the lines of what failed, and what to bisect."""

    outputs: dict
    npu_outputs: dict
    slices: dict
    task: dict | None
    detections: dict | None
    failures: list[str]
    # (name, metrics, thresholds) of every cosine-judged check: outputs, hand-overs, slices
    checks: list[tuple[str, dict, Thresholds]] = field(default_factory=list)
    failed: list[tuple[str, dict, Thresholds]] = field(default_factory=list)
    task_minimum: float | None = None  # verify.min_task_agreement
    # the anchor task's graded figure (`tasks.anchor_grades`: per-anchor loads)
    task_grades: np.ndarray | None = None

    @property
    def passed(self) -> bool:
        return not self.failures

    def margin(self) -> float:
        """The lowest cosine above its bar over every judged check (all samples together
        and the worst sample), or the task's shortfall where it misses: negative when one
        misses, the search's figure of merit. A task that passes adds nothing: its graded
        figure (`task_grades`) ranks the search's choices through their loads, while a margin
        demanded after the integer reference refuted a choice is in the units of the task's
        shortfall (its agreement), which no graded slack may be compared with."""
        margins = [m for _, metrics, limits in self.checks
                   for m in cosine_margins(metrics, limits)]
        return min([*margins, *self.task_shortfall()], default=1.0)

    def task_shortfall(self) -> list[float]:
        """The task's agreement below ``verify.min_task_agreement`` (negative), where it
        misses: a choice that fails only the task is ranked by how far it falls short (with
        an anchor detector's outputs judged by the task alone, no cosine ranks them)."""
        value = (self.task or {}).get("agreement")
        if self.task_minimum is None or value is None or value >= self.task_minimum:
            return []
        return [value - self.task_minimum]

    def bisect(self) -> dict:
        """The failing tensors' cosine limits and the sample where the first one is worst."""
        limits = {name: lim.min_cosine if lim.min_cosine is not None else (lim.sample_cosine or 0.0)
                  for name, _, lim in self.failed}
        sample = next((m["worst_sample"] for _, m, _ in self.failed
                       if m.get("worst_sample") is not None), 0)
        return {"limits": limits or None, "sample": sample}


UNDEFINED = -2.0  # the margin of a cosine that is not a number (non-finite values)


def cosine_margins(metrics: dict, limits: Thresholds) -> list[float]:
    shapes = metrics.get("shape_mismatch")  # a miss whatever the figures: fewer is better
    out = [-shapes["samples"] / shapes["of"]] if shapes else []
    if limits.min_cosine is not None:
        out.append(UNDEFINED if metrics["cosine"] is None else metrics["cosine"] - limits.min_cosine)
    if limits.sample_cosine is not None and metrics.get("min_sample_cosine") is not None:
        out.append(metrics["min_sample_cosine"] - limits.sample_cosine)
    return out


def cut(check, value: np.ndarray) -> np.ndarray:
    """``check``'s part of one sample's tensor (a ``verify.slices`` entry)."""
    where = [slice(None)] * np.ndim(value)
    where[check.axis] = slice(check.start, check.end)
    return np.asarray(value)[tuple(where)]


def judge(spec, refs: list[Values], gots: list[Values], floats: list[Values],
          outputs: Sequence[str], handed_over: Sequence[str], missing: Sequence[str] = (),
          *, detect: Callable[[list, list, list], dict] | None = None,
          judged_only: bool = False, channel_axis: int = 1,
          kept: dict | None = None, selected: Mapping[str, Sequence[str]] | None = None
          ) -> Verdict:
    """verify's verdict (``spec``: the recipe's ``verify`` section) on these samples.
    ``missing``: model outputs the original lacks (compared with the float pipeline);
    ``detect(refs, gots, floats)`` gives the
    detection totals (``box_recall`` ...) when the task is ``detector``; ``judged_only``
    leaves out what no threshold reads (hand-over tensors without ``verify.handover``
    thresholds: the precision search scores hundreds of choices). ``channel_axis``: the model
    outputs' channel axis (`output_channel_axis`); hand-over tensors are ONNX's NCHW inside.
    ``kept``: the references' own figures kept between calls (`judge.tensor_metrics`).
    ``selected``: model outputs a CPU part selects from hand-over tensors by an index it chose
    (`npubuild.split.selection`: a TopK's rows): each output's figures are reported and those
    hand-over tensors are judged with its thresholds instead."""
    selected = dict(selected or {})
    selecting = {t for tensors in selected.values() for t in tensors}
    metrics = output_metrics(refs, gots, floats, missing, channel_axis, kept)
    if judged_only and Thresholds.of(spec.handover) == Thresholds():
        handed_over = [t for t in handed_over if t in selecting]
    boundaries = {name: tensor_metrics([f[name] for f in floats], [g[name] for g in gots],
                                       kept=kept)
                  for name in handed_over}
    slices = slice_metrics(spec, refs, gots, floats)
    return decide(spec, metrics, boundaries, slices, refs, gots, floats, outputs, detect=detect,
                  selected=selected)


def decide(spec, metrics: dict, boundaries: dict, slices: dict, refs: list[Values],
           gots: list[Values], floats: list[Values], outputs: Sequence[str], *,
           detect: Callable[[list, list, list], dict] | None = None,
           selected: Mapping[str, Sequence[str]] | None = None) -> Verdict:
    """`judge`'s verdict from the tensors' figures (``metrics``: the model outputs',
    ``boundaries``: the hand-over tensors', ``slices``), the task and detections judged on
    ``refs``, ``gots`` and ``floats``, of which they read the model outputs alone."""
    selected = dict(selected or {})
    selecting = {t for tensors in selected.values() for t in tensors}
    read = anchor_pair(spec, {**floats[0], **refs[0]}, outputs) if spec.task == "anchor_detector" else ()
    checks = ([(name, f"output {name!r}", m, output_limits(spec, name in (read or ()),
                                                            name in selected), "")
               for name, m in metrics.items()]
              + [(name, f"NPU output {name!r}" + selected_from(name, selected), m,
                  selection_limits(spec) if name in selecting else handover_limits(spec),
                  "against the float pipeline")
                 for name, m in boundaries.items()]
              + [(c.label, f"slice {c.label!r}", slices[c.label], slice_limits(spec, c), "")
                 for c in spec.slices])
    failed, failures = [], []
    for name, label, m, limits, against in checks:
        lines = failures_of(label, m, limits, against)
        if lines:
            failed.append((name, m, limits))
            failures += lines
    detections = detect(refs, gots, floats) if detect and (
        spec.detections or spec.task == "detector") else None
    task = grades = None
    if spec.task:
        task = task_check(spec, detections, refs, gots, floats, outputs)
        failures += task_verdict(task, spec.min_task_agreement)
    if spec.task == "anchor_detector":
        from npubuild.verify import tasks

        grades = tasks.anchor_grades(*anchor_values(spec, refs, gots, floats, outputs))
    return Verdict(metrics, boundaries, slices, task, detections, failures,
                   [(name, m, limits) for name, _, m, limits, _ in checks], failed,
                   spec.min_task_agreement, grades)


class Streamed:
    """`judge`'s figures gathered one sample at a time (``add``), for a verify over samples
    too large to hold together (a 3-D U-Net's hand-over tensors: 252 MB a sample): each
    tensor's figures are streamed (`judge.TensorStream`, the same bytes as `tensor_metrics`
    over every sample), and of each sample only the model outputs are kept (``refs``, ``gots``,
    ``floats``: what the task, the detections and a reading judge); hand-over tensors are
    dropped once added. ``count``: the number of samples ``add`` will be given."""

    def __init__(self, spec, count: int, outputs: Sequence[str], handed_over: Sequence[str],
                 missing: Sequence[str] = (), channel_axis: int = 1):
        self.spec, self.count, self.outputs = spec, count, list(outputs)
        self.handed_over, self.missing = list(handed_over), list(missing)
        self.channel_axis = channel_axis
        self.refs: list[Values] = []
        self.gots: list[Values] = []
        self.floats: list[Values] = []
        self.streams: dict[tuple[str, str], TensorStream] = {}
        self.slice_shapes: dict[str, list[int]] = {}
        self._figures: tuple[dict, dict, dict] | None = None

    def add(self, ref: Values, got: Values, flt: Values) -> None:
        """One sample's float original, deployed and float-pipeline values."""
        if not self.refs:
            budget = HeldBytes()
            names = [*ref, *(m for m in self.missing if m not in ref)]
            for name in names:
                self.streams[("output", name)] = TensorStream(self.count, self.channel_axis,
                                                              budget)
            for name in self.handed_over:
                self.streams[("handover", name)] = TensorStream(self.count, budget=budget)
            for check in self.spec.slices:
                self.streams[("slice", check.label)] = TensorStream(self.count, budget=budget)
        for kind, name in self.streams:
            if kind == "output":
                self.streams[kind, name].add((flt if name in self.missing else ref)[name],
                                             got[name])
            elif kind == "handover":
                self.streams[kind, name].add(flt[name], got[name])
        for check in self.spec.slices:
            source = ref if check.tensor in ref else flt
            # copies: a view held for the exceptions would hold the whole tensor it cuts
            part = np.array(cut(check, source[check.tensor]))
            self.slice_shapes.setdefault(check.label, list(np.shape(part)))
            self.streams["slice", check.label].add(part, np.array(cut(check, got[check.tensor])))
        self.refs.append(ref)
        self.gots.append({k: v for k, v in got.items() if k in self.outputs})
        self.floats.append({k: v for k, v in flt.items() if k in self.outputs})

    def figures(self) -> tuple[dict, dict, dict]:
        """The model outputs', the hand-over tensors' and the slices' figures, as `judge`
        gives them (fresh dicts each call; summed once)."""
        if self._figures is None:
            self._figures = self._summed()
        return tuple({k: dict(v) for k, v in part.items()} for part in self._figures)

    def _summed(self) -> tuple[dict, dict, dict]:
        metrics, boundaries, slices = {}, {}, {}
        for (kind, name), stream in self.streams.items():
            if kind == "output":
                metrics[name] = stream.metrics()
                metrics[name]["reference"] = ("float pipeline (after surgery)"
                                              if name in self.missing else "float original")
            elif kind == "handover":
                boundaries[name] = stream.metrics()
        for check in self.spec.slices:
            slices[check.label] = {"tensor": check.tensor, "axis": check.axis,
                                   "start": check.start, "end": check.end,
                                   "shape": self.slice_shapes[check.label],
                                   **self.streams["slice", check.label].metrics()}
        return metrics, boundaries, slices

    def verdict(self, spec=None, *, detect: Callable[[list, list, list], dict] | None = None,
                selected: Mapping[str, Sequence[str]] | None = None) -> Verdict:
        """`judge`'s verdict on the samples added, under ``spec`` (default: the one the
        figures were gathered for; another may change the thresholds and the task, not the
        slices)."""
        return decide(spec or self.spec, *self.figures(), self.refs, self.gots, self.floats,
                      self.outputs, detect=detect, selected=selected)


def selected_from(tensor: str, selected: Mapping[str, Sequence[str]]) -> str:
    """The label's note on a hand-over tensor judged for the outputs selected from it."""
    readers = [output for output, tensors in selected.items() if tensor in tensors]
    if not readers:
        return ""
    return f" (what {', '.join(map(repr, readers))} {'selects' if len(readers) == 1 else 'select'} from)"


def output_channel_axis(recipe) -> int:
    """The model outputs' channel axis: last where the recipe declares its inputs NHWC (a
    TFLite or Keras model's outputs are channels-last: axis 1 of a [1, anchors, 1] score map is
    its anchors, not channels), else 1."""
    return -1 if recipe.model.layout == "NHWC" else 1


def output_metrics(refs: list[Values], gots: list[Values], floats: list[Values],
                   missing: Sequence[str], channel_axis: int = 1,
                   kept: dict | None = None) -> dict:
    """Per model output, over all samples; outputs the original lacks are compared with the
    float pipeline (the rewritten model) and say so."""
    out = {}
    for name in [*refs[0], *(m for m in missing if m not in refs[0])]:
        source = floats if name in missing else refs
        out[name] = tensor_metrics([r[name] for r in source], [g[name] for g in gots],
                                   channel_axis, kept)
        out[name]["reference"] = "float pipeline (after surgery)" if name in missing else "float original"
    return out


def slice_metrics(spec, refs: list[Values], gots: list[Values], floats: list[Values]) -> dict:
    """Metrics of every ``verify.slices`` entry, by label (model outputs against the float
    original, hand-over tensors against the float pipeline; `check_names` has checked that
    each fits its tensor)."""
    out = {}
    for check in spec.slices:
        source = refs if check.tensor in refs[0] else floats
        ref = [cut(check, s[check.tensor]) for s in source]
        got = [cut(check, g[check.tensor]) for g in gots]
        out[check.label] = {"tensor": check.tensor, "axis": check.axis, "start": check.start,
                            "end": check.end, "shape": list(np.shape(ref[0])),
                            **tensor_metrics(ref, got)}
    return out


def task_check(spec, detections: dict | None, refs: list[Values], gots: list[Values],
               floats: list[Values], outputs: Sequence[str]) -> dict:
    """The task's agreement on ``verify.task_outputs`` (default: the first model output); with
    several, per output and the lowest as the agreement (detector: the detection comparison)."""
    from npubuild.verify import tasks

    if spec.task == "detector":
        return tasks.detector(detections)
    if spec.task == "anchor_detector":
        return anchor_task(spec, refs, gots, floats, outputs)
    checks = {"classifier": tasks.classifier, "text_detection": tasks.text_detection,
              "text_recognition": tasks.text_recognition,
              "binary_map": lambda r, g: tasks.binary_map(
                  r, g, tasks.BINARY_THRESHOLD if spec.task_threshold is None
                  else spec.task_threshold)}
    per_output = {}
    for name in spec.task_outputs or outputs[:1]:
        source = refs if name in refs[0] else floats
        per_output[name] = checks[spec.task]([s[name] for s in source], [g[name] for g in gots])
    if len(per_output) == 1:
        return next(iter(per_output.values()))
    # an output that judges nothing (its maps never reach the threshold) is not the lowest
    worst = min(per_output.values(), key=lambda r: (r["agreement"] is None, r["agreement"] or 0))
    return {"task": spec.task, "outputs": per_output, "agreement": worst["agreement"],
            "agreement_is": f"lowest {worst['agreement_is']} of {len(per_output)} outputs"}


def anchor_pair(spec, sample: Values, outputs: Sequence[str]) -> tuple[str, str] | None:
    """(boxes, scores) an ``anchor_detector`` task reads: among ``verify.task_outputs`` (default:
    every model output), by their shapes (`tasks.anchor_outputs`)."""
    from npubuild.verify import tasks

    names = spec.task_outputs or outputs
    return tasks.anchor_outputs({n: tuple(np.shape(sample[n])) for n in names if n in sample})


def anchor_values(spec, refs: list[Values], gots: list[Values], floats: list[Values],
                  outputs: Sequence[str]) -> tuple[list, list, list, list, float]:
    """What an ``anchor_detector`` task reads: the float and deployed box regressors and
    score logits of every sample, and the score threshold."""
    from npubuild.verify import tasks

    boxes, scores = anchor_pair(spec, {**floats[0], **refs[0]}, outputs)
    source = lambda name: refs if name in refs[0] else floats  # noqa: E731
    threshold = (tasks.ANCHOR_SCORE_THRESHOLD if spec.task_threshold is None
                 else spec.task_threshold)
    return ([s[boxes] for s in source(boxes)], [g[boxes] for g in gots],
            [s[scores] for s in source(scores)], [g[scores] for g in gots], threshold)


def anchor_task(spec, refs: list[Values], gots: list[Values], floats: list[Values],
                outputs: Sequence[str]) -> dict:
    from npubuild.verify import tasks

    boxes, scores = anchor_pair(spec, {**floats[0], **refs[0]}, outputs)
    return {**tasks.anchor_detector(*anchor_values(spec, refs, gots, floats, outputs)),
            "boxes": boxes, "scores": scores}


def check_names(loaded, spec, outputs: Sequence[str], sample: Values) -> None:
    """The tensors ``verify.slices`` and ``verify.task_outputs`` name exist, and every slice
    fits its tensor (``sample``: one sample's model outputs and NPU hand-over tensors, the
    tensors a slice may read); a recipe error at the field otherwise. Both stages that judge
    call it before judging."""
    from npubuild.errors import did_you_mean

    tensors = list(sample)
    for i, check in enumerate(spec.slices):
        if check.tensor not in sample:
            handed_over = [t for t in tensors if t not in outputs]
            raise loaded.error(f"verify.slices: no model output or NPU hand-over tensor is called "
                               f"{check.tensor!r}" + did_you_mean(check.tensor, tensors),
                               "verify", "slices", i, "tensor",
                               hint="outputs: " + ", ".join(map(repr, outputs))
                               + "; hand-over tensors: " + (", ".join(map(repr, handed_over)) or "none"))
        value = sample[check.tensor]
        if not -np.ndim(value) <= check.axis < np.ndim(value):
            raise loaded.error(f"verify.slices: tensor {check.tensor!r} has {np.ndim(value)} axes, "
                               f"no axis {check.axis}", "verify", "slices", i, "axis")
        if cut(check, value).size == 0:
            raise loaded.error(f"verify.slices: {check.start}:{check.end} along axis {check.axis} of "
                               f"{check.tensor!r} (shape {list(np.shape(value))}) is empty",
                               "verify", "slices", i, "start")
    for i, name in enumerate(spec.task_outputs or ()):
        if name not in outputs:
            raise loaded.error(f"verify.task_outputs: the model has no output {name!r}",
                               "verify", "task_outputs", i,
                               hint="outputs: " + ", ".join(map(repr, outputs)))
    if spec.task == "anchor_detector" and anchor_pair(spec, sample, outputs) is None:
        shapes = ", ".join(f"{n!r} {list(np.shape(sample[n]))}" for n in spec.task_outputs
                           or outputs if n in sample)
        raise loaded.error("verify.task anchor_detector reads an anchor detector's box "
                           "regressors [1, anchors, k >= 4] and scores [1, anchors, fewer]; "
                           f"the outputs it may read are {shapes}", "verify", "task",
                           hint="name the two outputs in verify.task_outputs, or choose "
                                "another task")


def task_verdict(result: dict, minimum: float | None) -> list[str]:
    value = result.get("agreement")
    if minimum is None or (value is not None and value >= minimum):
        return []
    shown = "undefined" if value is None else f"{value:.4f}"
    why = f" ({result['note']})" if value is None and result.get("note") else ""
    return [f"task {result['task']}: {result['agreement_is']} {shown} < min_task_agreement "
            f"{minimum}{why}"]


def detection_totals(refs: list[Values], gots: list[Values], floats: list[Values],
                     outputs: Sequence[str], input_hw: tuple[int, int]) -> tuple[dict, list]:
    """Boxes the float model and the deployed pipeline find on every sample, matched: the
    totals ``tasks.detector`` reads, and per sample (float boxes, deployed boxes, agreement)."""
    from npubuild.verify import detections as det

    totals = {"float_boxes": 0, "deployed_boxes": 0, "matched": 0}
    found = []
    for ref, got, flt in zip(refs, gots, floats):
        reference = det.boxes(det.yolov8_output0({n: {**flt, **ref}[n] for n in outputs}, input_hw))
        deployed = det.boxes(det.yolov8_output0({n: got[n] for n in outputs}, input_hw))
        agreement = det.agreement(reference, deployed)
        for key, value in agreement.items():
            totals[key] += value
        found.append((reference, deployed, agreement))
    totals["box_recall"] = (totals["matched"] / totals["float_boxes"]
                            if totals["float_boxes"] else None)
    return totals, found


def judged_tensors(spec, outputs: Sequence[str], handed_over: Sequence[str],
                   selected: Mapping[str, Sequence[str]], judged_only: bool = True) -> list[str]:
    """The tensors `judge` reads (``judged_only``: as it leaves out the hand-over tensors no
    threshold reads): the model outputs, and the hand-over tensors a ``verify.handover``
    threshold, a selection or a slice reads (every one without ``judged_only``)."""
    read = {c.tensor for c in spec.slices} | {t for ts in selected.values() for t in ts}
    judged = not judged_only or Thresholds.of(spec.handover) != Thresholds()
    return [*outputs, *(t for t in handed_over if judged or t in read)]


class SampleJudge:
    """verify's verdict for fixed samples: the float original's and the float pipeline's
    values computed once, then ``judge(gots)`` for any deployed values of the same samples
    (the quantize stage's precision search judges each choice it tries this way).
    ``dirs``: the ``import`` and ``surgery`` stage directories (without them the float
    pipeline is the reference)."""

    def __init__(self, spec, dirs, pipeline, samples, input_hw: tuple[int, int] | None = None,
                 judged_only: bool = True, channel_axis: int = 1):
        from npubuild import onnx_io
        from npubuild.verify.reference import FloatReference, original_inputs, original_names
        from npubuild.verify.samples import npu_handovers, npu_selections

        self.spec, self.outputs = spec, list(pipeline.outputs)
        self.handed_over = npu_handovers(pipeline)
        self.selected = npu_selections(pipeline)
        # the hand-over tensors a judge reads (a threshold's, a selection's, a slice's): the
        # others stay unheld (deepbrain's 3-D U-Net hands over 252 MB per sample, held twice
        # per sample, float and integer, and ran out of memory at 9 GB)
        self.kept = judged_tensors(spec, self.outputs, self.handed_over, self.selected,
                                   judged_only)
        self.floats, self.names = [], {}
        for feeds in samples:
            values = pipeline.float_values(feeds)
            if not self.names:  # what a recipe may name (`check_names`): shapes, no values
                self.names = {k: np.broadcast_to(np.zeros((), values[k].dtype), np.shape(values[k]))
                              for k in [*self.outputs, *self.handed_over] if k in values}
            self.floats.append({k: v for k, v in values.items() if k in self.kept})
            del values
        if "import" in dirs and "surgery" in dirs:
            original = onnx_io.load_model(dirs["import"] / "model.onnx")
            surgery = onnx_io.load_model(dirs["surgery"] / "model.onnx")
            reference = FloatReference(original, pipeline.outputs, original_names(surgery),
                                       original_inputs(surgery))  # renamed inputs fed by their source name
            self.missing = reference.missing
            self.refs = [reference(feeds) for feeds in samples]
        else:  # the split pipeline alone (split proved it equal to the original)
            self.missing = []
            self.refs = [{k: f[k] for k in self.outputs} for f in self.floats]
        self.input_hw, self.judged_only, self.channel_axis = input_hw, judged_only, channel_axis
        # the references' own figures, kept across judges (its references never change)
        self.reference_figures: dict = {}

    def subset(self, indices: Sequence[int]) -> "SampleJudge":
        """The same judge on some of the samples (their references already computed)."""
        part = object.__new__(SampleJudge)
        part.__dict__.update(self.__dict__)
        part.refs = [self.refs[i] for i in indices]
        part.floats = [self.floats[i] for i in indices]
        return part

    def __call__(self, gots: list[Values]) -> Verdict:
        detect = None
        if self.input_hw is not None:
            detect = lambda r, g, f: detection_totals(r, g, f, self.outputs, self.input_hw)[0]  # noqa: E731
        return judge(self.spec, self.refs, gots, self.floats, self.outputs, self.handed_over,
                     self.missing, detect=detect, judged_only=self.judged_only,
                     channel_axis=self.channel_axis, kept=self.reference_figures,
                     selected=self.selected)
