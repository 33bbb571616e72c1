"""Stage bisection: when the deployed pipeline misses its thresholds, compare tensors stage by
stage (import → surgery → fusion → split → quantize → compile) on one verify sample and name
the stage whose outputs drop most against the stage before it, the tensor, and the rewrite, rule
or layer behind it, with a fix to try.

Inside quantize, the culprit is the tensor with the largest *drop*: its cosine against float
subtracted from the worst cosine of the layer's inputs. Errors accumulate along a network, so
the first tensor below the threshold is usually an innocent one downstream of a collapse (a GELU
table at 0.05 feeding layers at 0.97); the largest drop is the collapse itself. A fix the recipe
already has (per_channel weights, the calibration method in use, an override of that node) is
never suggested again.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from npubuild import onnx_io
from npubuild.metrics import similarity
from npubuild.verify.judge import common_part

Values = dict[str, np.ndarray]


@dataclass
class Finding:
    stage: str
    tensor: str
    cosine: float
    introduced_by: str
    suggestion: str
    producer: str | None = None
    input_cosine: float | None = None
    culprits: list[str] = field(default_factory=list)  # quantize: largest drops first
    measure: str = "cosine"  # or "range": 1 - largest error / calibrated range (`TINY` tensors)


@dataclass(frozen=True)
class TensorDrop:
    """One quantized tensor against float: its cosine and the worst of its layer's inputs'."""

    node: str  # the submodel's node producing it (a fused node, not its inlined body)
    kind: str
    tensor: str
    cosine: float
    input_cosine: float
    clipped: float = 0.0  # fraction of the float values outside the tensor's integer range
    measure: str = "cosine"  # what ``cosine`` is: `tensor_similarity`'s measure

    @property
    def drop(self) -> float:
        return self.input_cosine - self.cosine


@dataclass(frozen=True)
class RecipeFixes:
    """What the recipe already does, so a hint never suggests it again."""

    granularity: str = "per_tensor"
    method: str = "minmax"
    overridden: frozenset[str] = frozenset()  # node or tensor names in quantization.overrides
    int16: bool = False  # the chip has int16 activations
    scheme: str | None = None  # as the recipe fixes it (None: chosen)

    @classmethod
    def from_recipe(cls, quantization, chip_int16: bool = False) -> "RecipeFixes":
        names = {n for o in quantization.overrides for n in (*o.nodes, *o.tensors)}
        return cls(quantization.granularity or "per_channel",
                   quantization.calibration.method or "minmax", frozenset(names),
                   chip_int16, quantization.scheme)


@dataclass
class Bisection:
    checked: list[dict] = field(default_factory=list)  # per stage: worst output cosine vs previous
    finding: Finding | None = None

    def as_dict(self) -> dict:
        return {"checked": self.checked, "finding": asdict(self.finding) if self.finding else None}


def worst(reference: Values, actual: Values, limits: Mapping[str, float] | None = None
          ) -> tuple[str | None, float, float]:
    """The tensor furthest below its limit: (name, cosine, cosine − limit); without ``limits``,
    of every tensor both have, against 0 (the lowest cosine). (None, 1, inf) when the two share
    none of them (a hand-over tensor exists from the split on). A tensor whose shape differs
    (a decoding loop that stopped at another step) scores the cosine of the part both have,
    at most 0: verify counts it a miss."""
    names = [n for n in (limits or actual) if n in actual and n in reference]
    if not names:
        return None, 1.0, float("inf")
    scores = {n: _cosine(reference[n], actual[n]) for n in names}
    margin = {n: scores[n] - (limits or {}).get(n, 0.0) for n in names}
    name = min(margin, key=margin.get)
    return name, scores[name], margin[name]


def _cosine(reference: np.ndarray, actual: np.ndarray) -> float:
    if np.shape(reference) == np.shape(actual):
        return similarity(reference, actual).cosine
    return min(similarity(*common_part(reference, actual)).cosine, 0.0)


def bisect(dirs: Mapping[str, Path], stage_outputs: Mapping[str, Callable[[], Values]],
           limits: Mapping[str, float], quantized_tensors: Callable[[], list[TensorDrop]],
           fixes: RecipeFixes = RecipeFixes()) -> Bisection:
    """Compare every stage with the one before; ``stage_outputs[stage]()`` gives that stage's
    tensors on the sample (the first entry is the float original), ``limits`` the failing
    tensors' cosine thresholds, ``quantized_tensors()`` the quantize stage's tensors against
    float. The stage that takes a tensor furthest below its limit is explained."""
    result = Bisection()
    names = list(stage_outputs)
    previous = stage_outputs[names[0]]()
    margins = {}
    for stage in names[1:]:
        current = stage_outputs[stage]()
        tensor, cosine, margins[stage] = worst(previous, current, limits)
        if tensor is not None:
            result.checked.append({"stage": stage, "worst_output": tensor, "cosine": cosine})
        previous = current
    lowest = min(margins, key=margins.get, default=None)
    if lowest is not None and margins[lowest] < 0:
        row = next(c for c in result.checked if c["stage"] == lowest)
        result.finding = explain(lowest, row["worst_output"], row["cosine"], dirs,
                                 limits[row["worst_output"]], quantized_tensors, fixes)
    return result


def explain(stage: str, tensor: str, cosine: float, dirs: Mapping[str, Path], min_cosine: float,
            quantized_tensors: Callable[[], list[TensorDrop]],
            fixes: RecipeFixes = RecipeFixes()) -> Finding:
    if stage == "surgery":
        step = _largest_step(dirs["surgery"] / "log.json")
        return Finding(stage, tensor, cosine, step,
                       "check this rewrite's arguments; its own check accepted the change only "
                       "because its tolerance was relaxed — remove `tolerance` to see it fail")
    if stage == "fusion":
        rule = _largest_rule(dirs["fusion"] / "log.json")
        return Finding(stage, tensor, cosine, rule, f"drop fusion rule {rule!r} from `fusion:`")
    if stage == "split":
        return Finding(stage, tensor, cosine, "the NPU/CPU cut",
                       "report this: split's own proof should have caught it")
    if stage == "quantize":
        return explain_quantize(tensor, cosine, quantized_tensors(), min_cosine, fixes)
    from npubuild.backends import built_by, get

    backend = get(built_by(dirs["compile"]))
    if backend.toolchain is not None:  # a vendor's own compiler and quantizer made the artifact
        return Finding(stage, tensor, cosine, f"the {backend.name} artifact",
                       f"compare the quantizers side by side in the report (compile.quantizer: "
                       f"vendor or npubuild), or cut where one int8 scale spans values of "
                       f"different ranges (model.outputs, split.force_cpu)")
    return Finding(stage, tensor, cosine, "the compiled program",
                   "the simulator should equal the integer reference bit for bit: report this")


def explain_quantize(tensor: str, cosine: float, drops: list[TensorDrop], min_cosine: float,
                     fixes: RecipeFixes) -> Finding:
    """The tensor with the largest drop and its producer, or the accumulated error when no
    single layer loses more than the threshold allows."""
    ranked = sorted(drops, key=lambda d: (-d.drop, d.cosine, d.tensor))
    culprits = list(dict.fromkeys(d.tensor for d in ranked))[:CULPRITS]
    culprit = ranked[0] if ranked else None
    if culprit is None or culprit.drop <= 1 - min_cosine:
        return Finding("quantize", tensor, cosine, "the accumulated quantization error",
                       accumulated_fixes(fixes), culprits=culprits)
    return Finding("quantize", culprit.tensor, culprit.cosine,
                   f"layer {culprit.node!r} ({culprit.kind}; its inputs at cosine "
                   f"{culprit.input_cosine:.4f})", layer_fixes(culprit, fixes),
                   producer=culprit.node, input_cosine=culprit.input_cosine, culprits=culprits,
                   measure=culprit.measure)


CULPRITS = 3  # the tensors a measured hint tries fixes on
CLIPPED = 1e-3  # above this fraction of clipped values, the range is wrong, not the resolution


def layer_fixes(culprit: TensorDrop, fixes: RecipeFixes) -> str:
    """Fixes for one layer, leaving out what the recipe already has. A tensor whose float values
    fall outside its calibrated range was clipped: more bits on the same range gain nothing, so
    int16 is offered only when the loss is resolution."""
    node = culprit.node
    tries = []
    if culprit.clipped > CLIPPED:
        tries.append(f"calibrate on data that covers this input: {culprit.clipped:.1%} of its "
                     "float values fall outside the calibrated range (quantization.calibration.data)")
    if node not in fixes.overridden and culprit.tensor not in fixes.overridden:
        if fixes.int16 and culprit.clipped <= CLIPPED:
            tries.append(f"give it 16-bit activations (quantization.overrides: [{{nodes: "
                         f"[{node!r}], precision: int16}}])")
        tries.append(f"keep it in float (quantization.overrides: [{{nodes: [{node!r}]}}])")
    tries.append(f"move it to the CPU (split.force_cpu: [{node!r}])")
    return "; or ".join(tries + (calibration_fixes(fixes) if culprit.clipped <= CLIPPED else []))


def accumulated_fixes(fixes: RecipeFixes) -> str:
    tries = (["use per_channel weights (quantization.granularity)"]
             if fixes.granularity != "per_channel" else [])
    tries += calibration_fixes(fixes)
    tries.append("keep the most sensitive layers (per_layer.json, worst first) in int16 or float")
    return "; or ".join(tries)


def calibration_fixes(fixes: RecipeFixes) -> list[str]:
    from npubuild.quant.calibrators import CALIBRATORS

    others = [m for m in CALIBRATORS if m != fixes.method]
    return [f"calibrate with another method than {fixes.method} ({', '.join(others)}) on more "
            "representative data"] if others else ["calibrate on more representative data"]


def _largest_step(log: Path) -> str:
    steps = json.loads(log.read_text()).get("steps", []) if log.is_file() else []
    scored = [(s.get("max_rel") or 0.0, s) for s in steps]
    if not scored:
        return "a surgery step"
    value, step = max(scored, key=lambda item: item[0])
    return f"step {step.get('index')} ({step.get('rewrite')}), max relative change {value:.3g}"


def _largest_rule(log: Path) -> str:
    rules = json.loads(log.read_text()).get("rules", []) if log.is_file() else []
    fired = [r for r in rules if r.get("fired")]
    return max(fired, key=lambda r: (r.get("check") or {}).get("max_rel", 0.0)).get("rule", "?") \
        if fired else "a fusion rule"


def quantize_tensor_drops(pipeline, qgraphs, feeds: Mapping[str, np.ndarray]) -> list[TensorDrop]:
    """For every NPU graph, in order: each layer's output (integer reference, dequantized)
    against float, with the worst cosine of the layer's inputs (1 for tensors inside a fused
    node, which float does not expose); each NPU graph is fed the float pipeline's own boundary
    values, so a drop is the graph's own."""
    from npubuild.quant.reference import dequantize_tensor, quantize_inputs, run_reference

    values = pipeline.float_values(feeds)
    rows = []
    for graph in pipeline.npu_graphs:
        qgraph = qgraphs[graph.index]
        names = [t for layer in qgraph.layers for t in layer.outputs]
        known = {o for n in graph.model.graph.node for o in n.output}
        floats = onnx_io.run(onnx_io.with_outputs(graph.model, [t for t in names if t in known]),
                             values)
        floats.update({t: values[t] for t in qgraph.inputs if t in values})
        producers = {o: n.name for n in graph.model.graph.node for o in n.output}
        ints = run_reference(qgraph, quantize_inputs(qgraph, values))
        cosines = {t: tensor_similarity(qgraph, t, floats[t], dequantize_tensor(qgraph, t, ints[t]))
                   for t in qgraph.inputs if t in floats and t in ints}
        for layer in qgraph.layers:
            before = min((cosines[t] for t in layer.inputs if t in cosines), default=1.0)
            for t in layer.outputs:
                if t in floats and t in ints:
                    cosines[t] = tensor_similarity(qgraph, t, floats[t],
                                                   dequantize_tensor(qgraph, t, ints[t]))
                    rows.append(TensorDrop(producers.get(t, layer.name), layer.kind, t,
                                           cosines[t], before, clipped(qgraph, t, floats[t]),
                                           similarity_measure(qgraph, t, floats[t])))
    return rows


TINY = 8  # fewer values than this: a cosine over one sample swings with one value's sign


def tensor_similarity(qgraph, name: str, reference: np.ndarray, actual: np.ndarray) -> float:
    """One sample's similarity of a quantized tensor to float, on the cosine's scale: the
    cosine, except for a tensor of fewer than ``TINY`` values (a pose flag's one logit),
    whose cosine is little more than the signs of its values (a logit at 0.9 read as -0.2 is
    cosine -1, a drop of 1.9 that outranks every real collapse): there 1 minus the largest
    error over the tensor's calibrated range (one int8 step: 0.996)."""
    if similarity_measure(qgraph, name, reference) == "cosine":
        return similarity(reference, actual).cosine
    t = qgraph.tensors[name]
    from npubuild.quant.schemes import qrange

    low, high = qrange(t.dtype)
    error = np.max(np.abs(np.asarray(reference, np.float64) - np.asarray(actual, np.float64)),
                   initial=0.0)
    return float(1.0 - error / ((high - low) * t.scale))


def similarity_measure(qgraph, name: str, reference: np.ndarray) -> str:
    """``tensor_similarity``'s measure for this tensor: "range" for a quantized tensor of
    fewer than ``TINY`` values, else "cosine"."""
    t = qgraph.tensors[name]
    return "range" if np.size(reference) < TINY and not t.is_float and t.scale else "cosine"


def clipped(qgraph, name: str, value: np.ndarray) -> float:
    """The fraction of ``value`` (float) outside tensor ``name``'s representable range."""
    from npubuild.quant.schemes import qrange

    t = qgraph.tensors[name]
    if t.is_float or not t.scale:
        return 0.0
    low, high = ((q - t.zero_point) * t.scale for q in qrange(t.dtype))
    value = np.asarray(value)
    return float(np.mean((value < low - t.scale / 2) | (value > high + t.scale / 2))) if value.size else 0.0
