"""Feed calibration samples through a float graph and keep per-tensor statistics."""

from __future__ import annotations

from typing import Iterable, Mapping

import numpy as np

from npubuild.errors import BuildError
from npubuild.quant import rounding
from npubuild.quant.calibrators import NEEDS_HISTOGRAM, TensorStats
from npubuild.quant.floatgraph import FloatGraph, Probe


class Observer:
    """Statistics of every activation tensor of one float graph, updated sample by sample."""

    def __init__(self, fg: FloatGraph, probe: Probe, method: str, *, every_tensor: bool = False,
                 histograms: bool = False, weight_grams: bool = False, grams_only: bool = False):
        """``every_tensor``: observe every node output, not only the layers' tensors (so a
        lowering with other float overrides finds its statistics too); ``histograms``: keep
        every tensor's histogram whatever ``method`` needs (methods chosen per tensor later);
        ``weight_grams``: accumulate each conv layer's input Gram matrix (GPTQ rounding);
        ``grams_only``: observe those matrices' tensors alone, without their histograms or
        per-channel figures (the second pass that gathers them keeps nothing else)."""
        self.fg, self.probe = fg, probe
        self.tensors = fg.activation_tensors()
        if every_tensor:
            extra = [n for n in probe.output_names if n not in fg.constants]
            self.tensors += [n for n in extra if n not in set(self.tensors)]
        histogram = histograms or method in NEEDS_HISTOGRAM
        self.stats = {t: TensorStats(with_histogram=histogram) for t in self.tensors}
        for t in fg.outputs:  # per-channel ranges of what leaves the graph (dead channels)
            if t in self.stats and len(fg.shapes.get(t, [])) >= 2:
                self.stats[t].channel_axis = 1
        for layer in fg.layers:  # per-channel means of conv inputs, for bias correction
            if layer.kind == "conv" and layer.inputs[0] in self.stats:
                stats = self.stats[layer.inputs[0]]
                stats.channel_axis = -1 if layer.attrs.get("fc") else 1
                if weight_grams and rounding.wants_gram(layer):
                    geometry = rounding.Geometry.of(layer)
                    stats.patch_grams.setdefault(geometry, rounding.PatchGram(geometry))
            if layer.kind == "lut" and layer.inputs[0] in self.stats:
                # the quantizer judges a table's resolution on its input's distribution, and
                # whether its outputs underflow int8 on theirs (a Sigmoid's tiny scores)
                self.stats[layer.inputs[0]].with_histogram = True
                for t in layer.outputs:
                    if t in self.stats:
                        self.stats[t].with_histogram = True
        if grams_only:
            self.tensors = [t for t in self.tensors if self.stats[t].patch_grams]
            self.stats = {t: TensorStats(patch_grams=self.stats[t].patch_grams)
                          for t in self.tensors}
        self._computed = [t for t in self.tensors if t not in fg.inputs]
        self.samples = 0
        self._method, self._every_tensor, self._histograms = method, every_tensor, histograms
        self._weight_grams, self._grams_only = weight_grams, grams_only

    def empty_like(self, weight_grams: bool | None = None,
                   grams_only: bool | None = None) -> "Observer":
        """A new observer of the same graph and tensors, with nothing observed yet (gathering
        the conv inputs' Gram matrices if ``weight_grams``, those alone if ``grams_only``,
        else as this one does)."""
        grams = self._weight_grams if weight_grams is None else weight_grams
        alone = self._grams_only if grams_only is None else grams_only
        return Observer(self.fg, self.probe, self._method, every_tensor=self._every_tensor,
                        histograms=self._histograms, weight_grams=grams, grams_only=alone)

    def merge(self, stats: Mapping[str, TensorStats], samples: int) -> None:
        """Add the statistics of ``samples`` later samples (e.g. one batch, from a worker)."""
        for name, later in stats.items():
            self.stats[name].merge(later)
        self.samples += samples

    def update(self, feeds: Mapping[str, np.ndarray]) -> None:
        values = self.probe.run(feeds, self._computed)
        for name in self.fg.inputs:
            values[name] = feeds[name]
        for name in self.tensors:
            value = values[name]
            if value.dtype.kind != "f":
                continue
            if not np.isfinite(value).all():
                raise self._not_finite(name, value)
            self.stats[name].update(value)
        self.samples += 1

    def _not_finite(self, name: str, value: np.ndarray) -> BuildError:
        """The float model computed NaN or Inf (the data loader refuses non-finite data):
        where, and what usually causes it. (Which sample is not known here: a batch's observer
        counts from 0, and batches may run elsewhere.)"""
        layer = next((la for la in self.fg.layers if name in la.outputs), None)
        made = (f" (written by node {', '.join(layer.source_nodes[-1:]) or layer.name})"
                if layer is not None else "")
        bad = int(np.size(value) - np.isfinite(value).sum())
        return BuildError(
            f"calibration: tensor {name!r}{made} has {bad} NaN or Inf values of {value.size} "
            "in the float model on a calibration sample (the first such tensor in the graph's "
            "order)", stage="quantize",
            hint="the data are finite, so the model computes them from a sample's values: data "
                 "outside what it expects (zero padding where it divides, takes a log or a "
                 "softmax over a row masked with -inf everywhere; an input not normalised as its "
                 "package feeds it); run the model in ONNX Runtime on the calibration samples to "
                 "find the one, and fix the data or model.inputs' preprocess")


def observe(fg: FloatGraph, probe: Probe, samples: Iterable[Mapping[str, np.ndarray]],
            method: str, *, weight_grams: bool = False) -> dict[str, TensorStats]:
    """Every activation's statistics over ``samples`` (and the conv inputs' Gram matrices
    with ``weight_grams``)."""
    observer = Observer(fg, probe, method, weight_grams=weight_grams)
    for feeds in samples:
        observer.update(feeds)
    return observer.stats
