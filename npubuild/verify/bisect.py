"""Stage bisection: when the deployed pipeline misses its thresholds, compare tensors stage by
stage (import → surgery → fusion → split → quantize → compile) on one verify sample and name
the first stage whose output drops, the first tensor, and the rewrite, rule or layer behind it,
with a fix to try.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from npubuild import onnx_io
from npubuild.metrics import similarity

Values = dict[str, np.ndarray]


@dataclass
class Finding:
    stage: str
    tensor: str
    cosine: float
    introduced_by: str
    suggestion: str


@dataclass
class Bisection:
    checked: list[dict] = field(default_factory=list)  # per stage: worst output cosine vs previous
    finding: Finding | None = None

    def as_dict(self) -> dict:
        return {"checked": self.checked, "finding": asdict(self.finding) if self.finding else None}


def worst(reference: Values, actual: Values) -> tuple[str, float]:
    """The output with the lowest cosine similarity (name, cosine)."""
    scores = {n: similarity(reference[n], actual[n]).cosine for n in actual if n in reference}
    name = min(scores, key=scores.get)
    return name, scores[name]


def bisect(dirs: Mapping[str, Path], stage_outputs: Mapping[str, Callable[[], Values]],
           min_cosine: float, quantized_tensors: Callable[[], list[tuple[str, str, float]]]) -> Bisection:
    """Walk the stages in order; ``stage_outputs[stage]()`` gives that stage's outputs on the
    sample (the first entry is the float original), ``quantized_tensors()`` the quantize stage's
    (layer, tensor, cosine) list in graph order."""
    result = Bisection()
    names = list(stage_outputs)
    previous = stage_outputs[names[0]]()
    for stage in names[1:]:
        current = stage_outputs[stage]()
        tensor, cosine = worst(previous, current)
        result.checked.append({"stage": stage, "worst_output": tensor, "cosine": cosine})
        if cosine < min_cosine:
            result.finding = explain(stage, tensor, cosine, dirs, min_cosine, quantized_tensors)
            return result
        previous = current
    return result


def explain(stage: str, tensor: str, cosine: float, dirs: Mapping[str, Path], min_cosine: float,
            quantized_tensors: Callable[[], list[tuple[str, str, float]]]) -> Finding:
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
    if stage == "quantize":  # the first layer, in graph order, whose own output drops
        for layer, first, value in quantized_tensors():
            if value < min_cosine:
                return Finding(stage, first, value, f"layer {layer!r}",
                               f"keep it in float (quantization.overrides: [{{nodes: [{layer!r}]}}]), "
                               f"move it to the CPU (split.force_cpu), or calibrate with another "
                               f"method (percentile, kl, mse) on more representative data")
        return Finding(stage, tensor, cosine, "the accumulated quantization error",
                       "try per_channel weights, another calibration method, or more calibration data")
    return Finding(stage, tensor, cosine, "the compiled program",
                   "the simulator should equal the integer reference bit for bit: report this")


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


def quantize_tensor_drops(pipeline, qgraphs, feeds: Mapping[str, np.ndarray]) -> list[tuple[str, str, float]]:
    """For every NPU graph, in order: (layer, output tensor, cosine of the integer reference
    against float), each NPU graph fed the float pipeline's own boundary values."""
    from npubuild.quant.reference import dequantize_tensor, quantize_inputs, run_reference

    values = pipeline.float_values(feeds)
    rows = []
    for graph in pipeline.npu_graphs:
        qgraph = qgraphs[graph.index]
        names = [t for layer in qgraph.layers for t in layer.outputs]
        known = {o for n in graph.model.graph.node for o in n.output}
        names = [t for t in names if t in known]
        floats = onnx_io.run(onnx_io.with_outputs(graph.model, names), values)
        ints = run_reference(qgraph, quantize_inputs(qgraph, values))
        for layer in qgraph.layers:
            for t in layer.outputs:
                if t in floats:
                    deq = dequantize_tensor(qgraph, t, ints[t])
                    node = layer.source_nodes[0] if layer.source_nodes else layer.name
                    rows.append((node, t, similarity(floats[t], deq).cosine))
    return rows
