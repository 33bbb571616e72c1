"""Fixes a failing verify suggests only after measuring them.

When verify fails and the bisection blames quantize, the culprits (the tensors with the
largest drops) are each tried with the changes a recipe can make — int16 on the tensor (chips
with int16), the tensor kept in float on the CPU (an override), another calibration method for
it, and the whole graph in the asymmetric scheme when the recipe fixes another — on every
verify sample, through the whole split pipeline, judged as verify judges. Each is scored with
the deployed graphs' fake-quant models (`npubuild.quant.fakequant`: the quantize stage's own
parameters, one of them changed), so a trial costs one pass of ONNX Runtime over the samples.
A hint then names a fix with the figure it moved ("int16 on 'x': output 'y' worst-sample
cosine 0.9160 → 0.9930"), best first; a change that moves nothing is left out, and when no
single change passes, the hint says so and what the precision search found.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from npubuild.quant import calibrators, schemes
from npubuild.quant.qgraph import DATA_MOVEMENT
from npubuild.quant.schemes import QParams

MOVES_DATA = set(DATA_MOVEMENT)
CULPRITS = 3             # tensors tried, largest drops first
METHODS = ("minmax", "percentile", "mse", "kl")
MEANINGFUL = 1e-4        # a figure moved less than this did not move
SHOWN = 4


@dataclass
class Trial:
    """One change, what a recipe writes for it, and the failing figure before and after."""

    change: str
    recipe: str
    before: float
    after: float
    passed: bool

    @property
    def gain(self) -> float:
        return self.after - self.before

    def text(self, figure: str) -> str:
        verdict = "passes verify" if self.passed else "still fails"
        return (f"{self.change}: {figure} {self.before:.4f} → {self.after:.4f} ({verdict}; "
                f"{self.recipe})")

    def as_dict(self) -> dict:
        return {"change": self.change, "recipe": self.recipe, "before": self.before,
                "after": self.after, "gain": self.gain, "passes": self.passed}


def figure(verdict, names: Sequence[str]) -> float:
    """The failing checks' lowest cosine (all samples or worst sample); the task agreement
    when only the task failed."""
    values = [v for name, m, _ in verdict.checks if name in names
              for v in (m["cosine"], m.get("min_sample_cosine")) if v is not None]
    if values:
        return float(min(values))
    return float((verdict.task or {}).get("agreement") or 0.0)


class FixBench:
    """The deployed quantization's fake-quant pipeline with one parameter change at a time.
    ``quantize_dir``: the quantize stage's files; ``judge(gots)``: verify's verdict."""

    def __init__(self, split_dir: Path, quantize_dir: Path, pipeline, samples: list,
                 judge: Callable, kept: Sequence[str]):
        from npubuild.quant.fakequant import FakeQuantPipeline, export_graphs
        from npubuild.quant.lower import lower
        from npubuild.quant.qgraph import QGraph

        self.pipeline, self.samples, self.judge, self.kept = pipeline, samples, judge, list(kept)
        self.qgraphs = {g.index: QGraph.load(quantize_dir / f"graph_{g.index}.qgraph.json")
                        for g in pipeline.npu_graphs}
        self.lowered = {g.index: lower(g.model) for g in pipeline.npu_graphs}
        self.fq = FakeQuantPipeline(split_dir, export_graphs(
            {i: (qg, self.lowered[i][0]) for i, qg in self.qgraphs.items()}))
        calibration = json.loads((quantize_dir / "calibration.json").read_text())
        self.ranges = {t: (r["min"], r["max"]) for g in calibration["graphs"].values()
                       for t, r in g["tensors"].items() if r.get("count")}
        self.base = {i: self._deployed(qg) for i, qg in self.qgraphs.items()}
        self._histograms: dict[str, calibrators.TensorStats] = {}

    @staticmethod
    def _deployed(qg) -> tuple[dict[str, QParams | None], set[str]]:
        params = {t: None if info.is_float else QParams(info.scale, info.zero_point,
                                                         info.log2scale, info.dtype)
                  for t, info in qg.tensors.items()}
        return params, {layer.name for layer in qg.layers if layer.device == "cpu"}

    def verdict(self, edit: Callable[[int, dict, set], None] | None = None):
        """verify's verdict with ``edit(graph, params, cpu_layers)`` applied to copies."""
        from npubuild.quant.fakequant import params_feed

        feeds = {}
        for index, (params, cpu) in self.base.items():
            params, cpu = dict(params), set(cpu)
            if edit is not None:
                edit(index, params, cpu)
            feeds[index] = params_feed(self.fq.tensors(index), params, self.fq.layers(index), cpu)
        return self.judge(self.fq.run(self.samples, feeds, self.kept))

    # ---- the changes ----------------------------------------------------------------------

    def members(self, index: int, tensor: str) -> list[str]:
        """``tensor`` and the tensors that only move its data (they share its parameters)."""
        out = [tensor]
        for layer in self.qgraphs[index].layers:
            if layer.kind in MOVES_DATA and layer.inputs and layer.inputs[0] in out:
                out += list(layer.outputs)
        return out

    def int16(self, tensor: str):
        def edit(index, params, cpu):
            qg = self.qgraphs[index]
            for t in self.members(index, tensor):
                if t in params and params[t] is not None and t in self.ranges:
                    params[t] = schemes.choose_params(qg.scheme, *self.ranges[t], "int16")
        return edit

    def cpu(self, tensor: str):
        def edit(index, params, cpu):
            qg = self.qgraphs[index]
            moved = set(self.members(index, tensor))
            cpu.update(layer.name for layer in qg.layers
                       if moved & (set(layer.inputs) | set(layer.outputs)))
            for t in moved | only_on_cpu(qg, cpu):
                if t in params:
                    params[t] = None
        return edit

    def method(self, tensor: str, method: str, calibration: list):
        stats = self._histogram(tensor, calibration)

        def edit(index, params, cpu):
            qg = self.qgraphs[index]
            if stats is None or params.get(tensor) is None or params[tensor].dtype != "int8":
                return
            lo, hi = calibrators.calibrated_range(stats, method, qg.scheme,
                                                  calibrators.CalibrationOptions())
            new = schemes.choose_params(qg.scheme, lo, hi, "int8")
            for t in self.members(index, tensor):
                if params.get(t) is not None:
                    params[t] = new
        return edit

    def asymmetric(self):
        def edit(index, params, cpu):
            for t, p in list(params.items()):
                if p is not None and t in self.ranges:
                    params[t] = schemes.choose_params("asymmetric", *self.ranges[t], p.dtype)
        return edit

    def _histogram(self, tensor: str, calibration: list) -> calibrators.TensorStats | None:
        """The tensor's histogram over the calibration samples (calibration.json keeps only
        its min and max), through the float pipeline."""
        if tensor in self._histograms:
            return self._histograms[tensor]
        stats = None
        for index, (fg, probe) in self.lowered.items():
            if tensor not in probe.output_names and tensor not in fg.inputs:
                continue
            stats = calibrators.TensorStats(with_histogram=True)
            for feeds in calibration:
                values = self.pipeline.float_values(feeds)
                inputs = {t: values[t] for t in fg.inputs}
                value = inputs[tensor] if tensor in inputs else probe.run(inputs, [tensor])[tensor]
                stats.update(np.asarray(value))
            break
        self._histograms[tensor] = stats
        return stats


def only_on_cpu(qg, cpu: set[str]) -> set[str]:
    """Tensors that CPU layers alone make and read: they stay float (the quantizer's rule)."""
    made = {t: layer.name for layer in qg.layers for t in layer.outputs}
    read: dict[str, list[str]] = {}
    for layer in qg.layers:
        for t in layer.inputs:
            read.setdefault(t, []).append(layer.name)
    return {t for t in qg.tensors if t not in qg.constants
            and (t not in made or made[t] in cpu) and all(n in cpu for n in read.get(t, []))
            and (t in made or read.get(t))}


def measure(bench: FixBench, culprits: Sequence[str], failing: Sequence[str], recipe_fixes,
            calibration: list, *, chip_int16: bool, float_fallback: bool) -> list[Trial]:
    """Every single change tried on ``culprits`` (and the scheme), best first."""
    base = bench.verdict()
    before = figure(base, failing)
    tries: list[tuple[str, str, Callable]] = []
    for t in culprits:
        index = next((i for i, qg in bench.qgraphs.items() if t in qg.tensors), None)
        if index is None or bench.qgraphs[index].tensors[t].is_float:
            continue
        if chip_int16 and bench.qgraphs[index].tensors[t].dtype != "int16":
            tries.append((f"int16 on {t!r}", f"quantization.overrides: [{{tensors: [{t!r}], "
                                             f"precision: int16}}]", bench.int16(t)))
        if float_fallback:
            tries.append((f"{t!r} in float on the CPU", f"quantization.overrides: [{{tensors: "
                                                        f"[{t!r}], precision: float}}]",
                          bench.cpu(t)))
        for method in METHODS:
            if method != recipe_fixes.method and bench.qgraphs[index].tensors[t].dtype == "int8":
                tries.append((f"{t!r} calibrated with {method}",
                              f"quantization.calibration.method: {method} (chosen per tensor "
                              "when the method is unset)", bench.method(t, method, calibration)))
    if recipe_fixes.scheme not in (None, "asymmetric"):
        tries.append(("the asymmetric scheme", "quantization.scheme: asymmetric",
                      bench.asymmetric()))
    trials = []
    for change, recipe, edit in tries:
        verdict = bench.verdict(edit)
        trials.append(Trial(change, recipe, before, figure(verdict, failing), verdict.passed))
    return sorted(trials, key=lambda tr: (not tr.passed, -tr.gain, tr.change))


def hint(trials: Sequence[Trial], figure_name: str, search: dict | None,
         deployed: float | None = None, search_on: bool = True) -> str:
    """The measured fixes worth trying, best first, and what the precision search found.
    ``deployed``: the figure verify measured (fake quantization puts it a little apart)."""
    useful = [tr for tr in trials if tr.gain > MEANINGFUL][:SHOWN]
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
                  search_on: bool = True) -> dict:
    """The bisection's finding with its suggestion replaced by the measured one."""
    return {**finding, "suggestion": hint(trials, figure_name, search, deployed, search_on),
            "measured": [tr.as_dict() for tr in trials]}

