"""Fixes a failing verify suggests only after measuring them.

When verify fails and the bisection blames quantize, the changes a recipe line can make are
tried — int16 on each culprit (the tensors with the largest drops; chips with int16), each
culprit kept in float on the CPU (an override), every tensor calibrated with another method,
the asymmetric scheme where the recipe fixes another — on every verify sample, through the
whole split pipeline, judged as verify judges. Each is scored as adopting its recipe line
builds it: the deployed graphs are quantized again with the change (`FixBench`: the quantize
stage's options and choices, the calibration statistics observed again on the same samples),
and their fake-quant models (`npubuild.quant.fakequant`) are fed every activation's
parameters and placement and the conv layers' weights, biases and quantized constants that
quantization gives (`fakequant.choice_inputs`, as the precision search scores a choice): int16
on a conv's input quantizes its bias at a 256 times finer accumulator scale, a method or a
scheme moves every tensor. A trial costs one quantization of the graphs' parameters and conv
layers and one pass of ONNX Runtime over the samples; the few a hint shows (those that moved
the figure under fake quantization) are then confirmed on the integer reference, the
simulator's arithmetic, with every layer quantized (`FixBench.reference_verdict`): the
figures a hint names are verify's. A hint names a fix with the figure it moved ("int16 on
'x': output 'y' worst-sample cosine 0.9160 → 0.9930"), best first; a change that moves
nothing is left out, and when no single change passes, the hint says so and what the
precision search found. The quantize stage measures cross-layer equalisation and the weight
rounding again on a rebuild where the recipe leaves them unset, and may keep the other: each
line also holds them as deployed (`pins`), so the line as written builds what was measured.
Where quantizing again does not give the deployed graphs (`FixBench.differences`), the hint
says its figures are that quantization's and where it differs. With the precision search on,
the trials are made on top of its choice, which a rebuild searches again.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Mapping, Sequence

import numpy as np

from npubuild.quant import calibrate, quantizer
from npubuild.quant.qgraph import DATA_MOVEMENT, QGraph
from npubuild.quant.workflow import OverrideSpec

MOVES_DATA = set(DATA_MOVEMENT)
CULPRITS = 3             # tensors tried, largest drops first
METHODS = ("minmax", "percentile", "mse", "kl")
MEANINGFUL = 1e-4        # a figure moved less than this did not move
SHOWN = 4


@dataclass
class Trial:
    """One change, what a recipe writes for it, and the failing figure before and after
    under fake quantization and, where confirmed (``reference``: before, after), on the
    integer reference, the simulator's arithmetic (``passed`` is then its verdict)."""

    change: str
    recipe: str
    before: float
    after: float
    passed: bool
    reference: tuple[float, float] | None = None

    @property
    def gain(self) -> float:
        return self.after - self.before

    @property
    def moved(self) -> float:
        """The gain verify would see: on the integer reference where confirmed."""
        return self.gain if self.reference is None else self.reference[1] - self.reference[0]

    def text(self, figure: str) -> str:
        verdict = "passes verify" if self.passed else "still fails"
        if self.reference is None:
            return (f"{self.change}: {figure} {self.before:.4f} → {self.after:.4f} ({verdict}; "
                    f"{self.recipe})")
        return (f"{self.change}: {figure} {self.reference[0]:.4f} → {self.reference[1]:.4f} "
                f"(fake quantization {self.before:.4f} → {self.after:.4f}; {verdict}; "
                f"{self.recipe})")

    def as_dict(self) -> dict:
        out = {"change": self.change, "recipe": self.recipe, "before": self.before,
               "after": self.after, "gain": self.gain, "passes": self.passed}
        if self.reference is not None:
            out.update(reference_before=self.reference[0], reference_after=self.reference[1])
        return out


def figure(verdict, names: Sequence[str]) -> float:
    """The failing checks' lowest cosine (all samples or worst sample); the task agreement
    when only the task failed."""
    values = [v for name, m, _ in verdict.checks if name in names
              for v in (m["cosine"], m.get("min_sample_cosine")) if v is not None]
    if values:
        return float(min(values))
    return float((verdict.task or {}).get("agreement") or 0.0)


@dataclass(frozen=True)
class Change:
    """One change as a recipe line makes it: overrides after the deployed ones, or another
    calibration method or scheme for every tensor (a recipe has no per-tensor method)."""

    overrides: tuple[OverrideSpec, ...] = ()
    method: str | None = None
    scheme: str | None = None


class FixBench:
    """The deployed quantization's fake-quant pipeline, scoring a change as adopting it
    builds it: ``workflow`` (`npubuild.quant.workflow.Workflow`) holds the deployed graphs'
    float graphs, their calibration statistics (observed with every tensor's histogram) and
    the deployed options (``histograms``: whether the quantize stage kept every one); each
    change quantizes them again (`Quantizer`: every activation's parameters and placement,
    and the conv layers' weights, biases and the quantized constants the change moves,
    `fakequant.choice_inputs`), exactly as the precision search scores a choice.
    ``deployed``: the quantize stage's graphs (index -> QGraph), which the fake-quant models
    are exported from; ``judge(gots)``: verify's verdict."""

    def __init__(self, workflow, deployed: Mapping[int, QGraph], samples: list,
                 judge: Callable, kept: Sequence[str]):
        from npubuild.quant.fakequant import FakeQuantPipeline, export_graphs

        self.workflow, self.samples, self.judge, self.kept = workflow, samples, judge, list(kept)
        self.qgraphs = dict(deployed)
        self.states = {s.graph.index: s for s in workflow.states}
        self.fq = FakeQuantPipeline(workflow.pipeline.split_dir, export_graphs(
            {i: (qg, self.states[i].fg) for i, qg in self.qgraphs.items()}))
        self.ranges: dict = {}   # the quantizers' calibrated ranges, shared (kl searches)
        self._stats: dict[tuple, dict] = {}

    def values(self, change: Change = Change()) -> list[dict]:
        """Per verify sample, the kept tensors of the graphs quantized with ``change``."""
        feeds = {i: self._feed(i, change) for i in self.qgraphs}
        return self.fq.run(self.samples, feeds, self.kept)

    def verdict(self, change: Change = Change()):
        """verify's verdict on the graphs quantized with ``change``."""
        return self.judge(self.values(change))

    def reference_verdict(self, change: Change = Change()):
        """verify's verdict on the graphs quantized with ``change`` (every layer built) and
        run by the integer reference, what the simulator computes: fake quantization leaves
        out the fixed-point multipliers, integer tables and softmax (face-detection, int8:
        0.9592 there, 0.9696 on the simulator; 'activation_5' in float: 0.9656, 0.9448)."""
        qgraphs = {i: self.quantizer(i, change).run(f"graph_{i}") for i in self.qgraphs}
        runner, kept = self.workflow.pipeline.quantized_runner(qgraphs), set(self.kept)
        return self.judge([{t: v for t, v in runner.run(dict(sample), keep_intermediates=True)
                            .items() if t in kept} for sample in self.samples])

    def quantizer(self, index: int, change: Change = Change()) -> quantizer.Quantizer:
        """Graph ``index``'s quantizer as the quantize stage builds it with ``change`` in
        the recipe (its overrides after the deployed ones, its method or scheme)."""
        from npubuild.quant.workflow import _config_for

        state, options = self.states[index], self.workflow.options
        config = options.config
        if change.method is not None:
            config = replace(config, method=change.method, tensor_methods=())
        if change.scheme is not None:
            config = replace(config, scheme=change.scheme)
        config, _ = _config_for(replace(options, config=config),
                                [*options.overrides, *change.overrides], state.graph.model)
        # a recipe that sets the method keeps histograms only where its method or a table reads them
        histograms = options.histograms and change.method is None
        return quantizer.Quantizer(state.fg, self._stats_for(state, config.method, histograms),
                                   config, ranges=self.ranges)

    def _feed(self, index: int, change: Change) -> dict[str, np.ndarray]:
        from npubuild.quant import fakequant

        return fakequant.quantizer_inputs(self.quantizer(index, change), index,
                                          self.states[index].fg, self.fq)

    def _stats_for(self, state, method: str, histograms: bool) -> dict:
        """The statistics a calibration with ``method`` (and every histogram if
        ``histograms``) keeps: the workflow observed every histogram, and a histogram the
        quantize stage would not have kept must not reach the quantizer (it reads a tensor's
        typical size from one where there is one: int16 where int8 underflows)."""
        key = (state.graph.index, method, histograms)
        if key not in self._stats:
            kept = calibrate.Observer(state.fg, state.probe, method, every_tensor=True,
                                      histograms=histograms).stats
            self._stats[key] = {
                t: s if t not in kept or kept[t].with_histogram
                else replace(s, with_histogram=False, hist=None)
                for t, s in state.observer.stats.items()}
        return self._stats[key]

    def differences(self) -> list[str]:
        """Where quantizing again as deployed does not give the deployed graphs (empty:
        every trial is scored against the deployment itself)."""
        out = []
        for index, deployed in self.qgraphs.items():
            found = first_difference(deployed, self.quantizer(index).run(f"graph_{index}"))
            if found:
                out.append(f"graph_{index}: {found}")
        return out

    # ---- the changes ----------------------------------------------------------------------

    @staticmethod
    def int16(tensor: str) -> Change:
        return Change(overrides=(OverrideSpec(tensors=(tensor,), precision="int16"),))

    @staticmethod
    def cpu(tensor: str) -> Change:
        return Change(overrides=(OverrideSpec(tensors=(tensor,), precision="float"),))

    @staticmethod
    def method(method: str) -> Change:
        return Change(method=method)

    @staticmethod
    def asymmetric() -> Change:
        return Change(scheme="asymmetric")


def moved_with(qg: QGraph, tensor: str) -> list[str]:
    """``tensor`` and the tensors that only move its data (data movement, a nearest resize):
    they share its parameters, and the precision search's overrides name them too."""
    out = [tensor]
    for layer in qg.layers:
        moves = layer.kind in MOVES_DATA or (layer.kind == "resize"
                                             and layer.attrs.get("mode") == "nearest")
        if moves and layer.inputs and layer.inputs[0] in out:
            out += [t for t in layer.outputs if t not in out]
    return out


def first_difference(deployed: QGraph, rebuilt: QGraph) -> str | None:
    """The first tensor or layer whose parameters or integers differ between two
    quantizations of one graph, in words; None where they agree."""
    for t, info in deployed.tensors.items():
        other = rebuilt.tensors.get(t)
        mine = (info.dtype, info.scale, info.zero_point)
        if other is None or (other.dtype, other.scale, other.zero_point) != mine:
            return f"tensor {t!r}"
    built = {layer.name: layer for layer in rebuilt.layers}
    for layer in deployed.layers:
        other = built.get(layer.name)
        if other is None or other.device != layer.device or other.kind != layer.kind:
            return f"layer {layer.name!r}"
        for name, array in layer.arrays.items():
            if name in other.arrays and not np.array_equal(array, other.arrays[name]):
                return f"layer {layer.name!r} ({name})"
    for t, value in deployed.constants.items():
        if t not in rebuilt.constants or not np.array_equal(value, rebuilt.constants[t]):
            return f"constant {t!r}"
    return None


def measure(bench: FixBench, culprits: Sequence[str], failing: Sequence[str], recipe_fixes,
            *, chip_int16: bool, float_fallback: bool, pinned: Sequence[str] = ()) -> list[Trial]:
    """Every single change tried: int16 and float on each of ``culprits``, the other
    calibration methods and the asymmetric scheme on every tensor (what the recipe line
    does), best first. ``pinned``: recipe lines each change's line carries too (`pins`)."""
    before = figure(bench.verdict(), failing)
    tries: list[tuple[str, str, Change]] = []
    for t in culprits:
        index = next((i for i, qg in bench.qgraphs.items() if t in qg.tensors), None)
        if index is None or bench.qgraphs[index].tensors[t].is_float:
            continue
        if chip_int16 and bench.qgraphs[index].tensors[t].dtype != "int16":
            tries.append((f"int16 on {t!r}", override_line(t, "int16", recipe_fixes),
                          bench.int16(t)))
        if float_fallback:
            tries.append((f"{t!r} in float on the CPU", override_line(t, "float", recipe_fixes),
                          bench.cpu(t)))
    config = bench.workflow.options.config
    for method in METHODS:
        if method != recipe_fixes.method and (method != config.method or config.tensor_methods):
            tries.append((f"every tensor calibrated with {method}",
                          f"quantization.calibration.method: {method}", bench.method(method)))
    if recipe_fixes.scheme not in (None, "asymmetric"):
        tries.append(("the asymmetric scheme", "quantization.scheme: asymmetric",
                      bench.asymmetric()))
    trials = []
    for change, recipe, edit in tries:
        verdict = bench.verdict(edit)
        trials.append((Trial(change, "; ".join([recipe, *pinned]), before,
                             figure(verdict, failing), verdict.passed), edit))
    trials.sort(key=lambda pair: (not pair[0].passed, -pair[0].gain, pair[0].change))
    # the few a hint would show are confirmed on the integer reference: verify's figure
    shown = [pair for pair in trials if pair[0].gain > MEANINGFUL][:SHOWN]
    if shown:
        start = figure(bench.reference_verdict(), failing)
        for tr, edit in shown:
            verdict = bench.reference_verdict(edit)
            tr.reference, tr.passed = (start, figure(verdict, failing)), verdict.passed
    confirmed = sorted((tr for tr, _ in shown), key=lambda tr: (not tr.passed, -tr.moved,
                                                                 tr.change))
    return confirmed + [tr for tr, _ in trials[len(shown):]]


def override_line(tensor: str, precision: str, recipe_fixes) -> str:
    """The recipe line of one override: the list, or one entry added to the recipe's own
    (the trial keeps them: a list written instead would drop them)."""
    entry = f"{{tensors: [{tensor!r}], precision: {precision}}}"
    if recipe_fixes.overridden:
        return f"quantization.overrides: {entry} added to the recipe's"
    return f"quantization.overrides: [{entry}]"


def pins(spec, options) -> list[str]:
    """The recipe lines that hold what the quantize stage measured and kept where the recipe
    (``spec``: its ``quantization``) leaves it unset, as deployed (``options``: the
    workflow's): cross-layer equalisation and the weight rounding. A change's trial holds
    them, and a rebuild with the change alone measures them again and may keep the other
    (face-detection, int8 as written: neither kept; with 'activation_5' in float both are,
    0.9731 where the trial measured 0.9656)."""
    out = []
    if spec.cross_layer_equalization is None:
        out.append(f"quantization.cross_layer_equalization: {str(options.equalize).lower()}")
    if spec.weight_rounding is None:
        out.append(f"quantization.weight_rounding: {options.config.weight_rounding}")
    return out


def hint(trials: Sequence[Trial], figure_name: str, search: dict | None,
         deployed: float | None = None, search_on: bool = True,
         differences: Sequence[str] = ()) -> str:
    """The measured fixes worth trying, best first, and what the precision search found.
    ``deployed``: the figure verify measured (fake quantization puts it a little apart);
    ``differences``: where quantizing again did not give the deployed graphs
    (`FixBench.differences`), said, since the figures are then that quantization's."""
    useful = [tr for tr in trials if tr.moved > MEANINGFUL][:SHOWN]
    parts = [tr.text(figure_name) for tr in useful]
    if not useful:
        tried = ", ".join(tr.change for tr in trials[:6])
        parts.append(f"no single change measured moves it ({tried or 'nothing to try'}, each "
                     "on every verify sample)")
    if not any(tr.passed for tr in trials):
        parts.append(search_text(search, search_on))
    where = "" if deployed is None or not trials else (
        f" (fake quantization puts the deployed figure at {trials[0].before:.4f}, the "
        f"simulator at {deployed:.4f})")
    if differences:
        parts.append(f"these figures are of the graphs quantized again from the calibration "
                     f"data, which differ from the deployed ones ({', '.join(differences[:3])})")
    return f"measured on the verify samples{where}: " + "; ".join(parts)


def search_text(search: dict | None, search_on: bool = True) -> str:
    if search is None:
        return ("no single change passes; the precision search is off (quantization.auto: "
                "false): switched on it finds the fewest tensors to keep out of int8"
                if not search_on else "no single change passes")
    chosen = search.get("chosen") or []
    kinds = sorted({c["precision"] for c in chosen})
    found = (f"the precision search kept {len(chosen)} tensor(s) in {'/'.join(kinds)}"
             if chosen else "the precision search kept no tensor out of int8")
    reached = "and reached verify's thresholds on its samples" if search.get("passed") else \
        "and no choice it tried passes"
    note = f" ({search['note']})" if search.get("note") else ""
    return f"no single change passes; {found} {reached}{note} (quantize/search.json)"


def with_measured(finding: dict, trials: Sequence[Trial], figure_name: str,
                  search: dict | None, deployed: float | None = None,
                  search_on: bool = True, differences: Sequence[str] = ()) -> dict:
    """The bisection's finding with its suggestion replaced by the measured one."""
    return {**finding, "suggestion": hint(trials, figure_name, search, deployed, search_on,
                                          differences),
            "measured": [tr.as_dict() for tr in trials]}

