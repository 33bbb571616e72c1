"""The quantize stage's proofs: the integer reference against ONNX Runtime running the QDQ
model (layer by layer, same inputs), and every tensor against the float model."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable, Mapping

import numpy as np

from npubuild import metrics, onnx_io
from npubuild.errors import BuildError
from npubuild.quant.qdq import layerwise_qdq
from npubuild.quant.qgraph import QGraph
from npubuild.quant.reference import dequantize_tensor

MIN_IDENTICAL = 0.999
MAX_LSB = 1
# ORT computes a layer in float32 before QuantizeLinear; where its value lies this close (in
# output steps) to a rounding tie k + 1/2, float32 error decides the side, not arithmetic. A
# one-step difference there is a tie, inherent to float32 vs exact integers, and counted apart.
# float32 resolves a value of v steps only to v · 2^-23 steps, and the terms ORT sums (the two
# inputs of an add, a conv's products) reach the tensor's whole range: for int16 tensors (65,536
# steps) that is ~0.008 step per float32 ulp, so the band widens to a few ulps of the range.
TIE_TOLERANCE = 1e-3
TIE_ULPS = 4
FLOAT32_EPS = 2.0 ** -23


def tie_band(levels: int) -> float:
    """How far (in steps) from ``k + 1/2`` ORT's float32 value may lie and still be a tie for
    a tensor of ``levels`` integer steps: ``TIE_TOLERANCE``, or ``TIE_ULPS`` float32 ulps of
    the whole range where that is wider (int16; int8 keeps 1e-3)."""
    return max(TIE_TOLERANCE, levels * TIE_ULPS * FLOAT32_EPS)


def check_quantized(qgraph: QGraph) -> None:
    """The stage-boundary invariant: every tensor an NPU layer reads or writes is an integer
    tensor with parameters, and every CPU layer says why it is on the CPU."""
    for layer in qgraph.layers:
        if layer.device == "cpu":
            if not layer.attrs.get("reason"):
                raise BuildError(f"{qgraph.name}: layer {layer.name!r} is on the CPU without a "
                                 "reason", stage="quantize")
            continue
        for t in [*layer.inputs, *layer.outputs]:
            info = qgraph.tensors.get(t)
            if info is None or info.is_float or not info.scale or info.scale <= 0:
                raise BuildError(f"{qgraph.name}: NPU layer {layer.name!r} ({layer.kind}) touches "
                                 f"tensor {t!r}, which is not quantized", stage="quantize")


@dataclass
class LayerAgreement:
    layer: str
    kind: str
    tensor: str
    elements: int = 0
    identical: int = 0
    ties: int = 0
    max_lsb: int = 0

    def as_dict(self) -> dict:
        return {"layer": self.layer, "kind": self.kind, "tensor": self.tensor,
                "elements": self.elements, "identical_fraction": self.fraction,
                "tie_fraction": self.ties / self.elements if self.elements else 0.0,
                "max_lsb": self.max_lsb}

    @property
    def fraction(self) -> float:
        return self.identical / self.elements if self.elements else 1.0

    @property
    def agreed(self) -> int:
        """Identical elements plus one-step differences on a float32 rounding tie."""
        return self.identical + self.ties


@dataclass
class CrossCheck:
    """Integer reference vs ORT on the QDQ model, per layer, summed over samples."""

    layers: dict[str, LayerAgreement] = field(default_factory=dict)

    @property
    def elements(self) -> int:
        return sum(a.elements for a in self.layers.values())

    @property
    def identical_fraction(self) -> float:
        total = self.elements
        return sum(a.identical for a in self.layers.values()) / total if total else 1.0

    @property
    def tie_fraction(self) -> float:
        total = self.elements
        return sum(a.ties for a in self.layers.values()) / total if total else 0.0

    @property
    def agreed_fraction(self) -> float:
        total = self.elements
        return sum(a.agreed for a in self.layers.values()) / total if total else 1.0

    @property
    def max_lsb(self) -> int:
        return max((a.max_lsb for a in self.layers.values()), default=0)

    @property
    def ok(self) -> bool:
        return self.agreed_fraction >= MIN_IDENTICAL and self.max_lsb <= MAX_LSB

    def worst(self, n: int = 10) -> list[dict]:
        ranked = sorted(self.layers.values(), key=lambda a: (-a.max_lsb, a.agreed / max(a.elements, 1)))
        return [a.as_dict() for a in ranked[:n] if a.identical < a.elements]

    def summary(self) -> dict:
        return {"elements": self.elements, "identical_fraction": self.identical_fraction,
                "tie_fraction": self.tie_fraction, "max_lsb": self.max_lsb, "ok": self.ok,
                "criteria": {"min_identical_or_tie_fraction": MIN_IDENTICAL, "max_lsb": MAX_LSB,
                             "tie_tolerance_steps": TIE_TOLERANCE,
                             "tie_tolerance_float32_ulps": TIE_ULPS},
                "worst_layers": self.worst()}


class CrossChecker:
    """One ORT session over the layer-wise QDQ model, fed from reference environments."""

    def __init__(self, qgraph: QGraph):
        self.qgraph = qgraph
        model, self.out_names = layerwise_qdq(qgraph)
        self.session = onnx_io.session(model)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.result = CrossCheck()

    def add(self, env: Mapping[str, np.ndarray]) -> None:
        feeds = {}
        for name in self.input_names:
            tensor = name[:-3] if name.endswith("::q") else name
            feeds[name] = env[tensor]
        names = list(self.out_names.values())
        got = dict(zip(self.out_names, self.session.run(names, feeds)))
        for layer in self.qgraph.layers:
            if layer.device != "npu":
                continue
            for t in layer.outputs:
                self._compare(layer, t, env[t], got[t], got.get(f"{t}::pre"))

    def _compare(self, layer, tensor: str, ours: np.ndarray, theirs: np.ndarray,
                 theirs_float: np.ndarray | None) -> None:
        agreement = self.result.layers.setdefault(tensor, LayerAgreement(layer.name, layer.kind, tensor))
        diff = np.abs(ours.astype(np.int64) - theirs.astype(np.int64))
        agreement.elements += diff.size
        agreement.identical += int(np.count_nonzero(diff == 0))
        if theirs_float is not None:
            steps = np.asarray(theirs_float, np.float64) / self.qgraph.tensors[tensor].scale
            levels = np.iinfo(np.dtype(self.qgraph.tensors[tensor].dtype)).max * 2 + 1
            near_tie = np.abs(steps - np.floor(steps) - 0.5) <= tie_band(levels)
            agreement.ties += int(np.count_nonzero((diff == 1) & near_tie))
        agreement.max_lsb = max(agreement.max_lsb, int(diff.max(initial=0)))


def crosscheck(qgraph: QGraph, envs: Iterable[Mapping[str, np.ndarray]]) -> CrossCheck:
    checker = CrossChecker(qgraph)
    for env in envs:
        checker.add(env)
    return checker.result


class TensorComparison:
    """Similarity of every quantized tensor to its float value, averaged over samples."""

    FIELDS = ("cosine", "euclid", "sqnr_db", "max_abs")
    HISTOGRAM_BINS = 48
    HISTOGRAM_SAMPLE = 16384  # elements per tensor and sample (every k-th): enough for a shape

    def __init__(self, qgraph: QGraph):
        self.qgraph = qgraph
        self.sums: dict[str, dict[str, float]] = {}
        self.counts: dict[str, int] = {}
        self.histograms: dict[str, dict] = {}

    def add(self, float_values: Mapping[str, np.ndarray], env: Mapping[str, np.ndarray]) -> None:
        for name, info in self.qgraph.tensors.items():
            if info.is_float or name not in float_values or name in self.qgraph.constants:
                continue
            sim = metrics.similarity(float_values[name], dequantize_tensor(self.qgraph, name, env[name]))
            row = self.sums.setdefault(name, dict.fromkeys(self.FIELDS, 0.0))
            for key in self.FIELDS:
                value = getattr(sim, key)
                row[key] = (max(row[key], value) if key == "max_abs"
                            else row[key] + (value if np.isfinite(value) else 200.0))
            self.counts[name] = self.counts.get(name, 0) + 1
            self._histogram(name, info, float_values[name])

    def _histogram(self, name: str, info, values: np.ndarray) -> None:
        """Float values over the tensor's quantized range (its calibration), with the counts
        that fall outside it (clipped): what a calibration histogram shows."""
        if info.scale is None or not np.issubdtype(np.dtype(info.dtype), np.integer):
            return
        limits = np.iinfo(np.dtype(info.dtype))
        lo = (limits.min - info.zero_point) * info.scale
        hi = (limits.max - info.zero_point) * info.scale
        flat = np.asarray(values).ravel()
        flat = flat[:: max(1, flat.size // self.HISTOGRAM_SAMPLE)].astype(np.float64)
        counts, _ = np.histogram(flat, self.HISTOGRAM_BINS, range=(lo, hi))
        entry = self.histograms.setdefault(name, {
            "range": [float(lo), float(hi)], "counts": [0] * self.HISTOGRAM_BINS,
            "below": 0, "above": 0, "min": float("inf"), "max": float("-inf")})
        entry["counts"] = [a + int(b) for a, b in zip(entry["counts"], counts)]
        entry["below"] += int((flat < lo).sum())
        entry["above"] += int((flat > hi).sum())
        entry["min"], entry["max"] = min(entry["min"], float(flat.min())), max(entry["max"], float(flat.max()))

    def rows(self) -> list[dict]:
        """One row per tensor, worst cosine first (TPU-MLIR's comparison order)."""
        producers = self.qgraph.producers()
        out = []
        for name, sums in self.sums.items():
            n = self.counts[name]
            layer = producers.get(name)
            out.append({"tensor": name, "layer": layer.name if layer else None,
                        "kind": layer.kind if layer else "input",
                        "device": layer.device if layer else "npu",
                        "dtype": self.qgraph.tensors[name].dtype, "samples": n,
                        **{k: (v if k == "max_abs" else v / n) for k, v in sums.items()},
                        **({"histogram": self.histograms[name]} if name in self.histograms else {})})
        return sorted(out, key=lambda r: r["cosine"])
