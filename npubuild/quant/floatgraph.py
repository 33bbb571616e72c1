"""The float layer graph: an ONNX model lowered to the layer kinds the quantizer knows.

``FLayer`` is a layer before quantization (float weights, a float function for lookup tables);
``FloatGraph`` is the ordered list of them with every tensor's shape and the model they came
from. ``Probe`` runs the float model returning any intermediate tensor, which lowering uses for
shapes and constants and calibration uses for activations.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Mapping, Sequence

import numpy as np
import onnx

from npubuild import onnx_io

#: The reason of a layer a quantization override keeps in float.
FLOAT_OVERRIDE = "kept in float by a quantization override"


class Unsupported(Exception):
    """A node the integer kinds cannot express; the message says why (shown in reports)."""


@dataclass
class FLayer:
    name: str
    kind: str
    inputs: list[str]
    outputs: list[str]
    attrs: dict = field(default_factory=dict)
    weights: dict[str, np.ndarray] = field(default_factory=dict)
    source_nodes: list[str] = field(default_factory=list)
    fn: Callable[[np.ndarray], np.ndarray] | None = None
    activation: tuple[str, float | None, float | None] = ("none", None, None)
    reason: str = ""

    @property
    def is_float(self) -> bool:
        return self.kind == "float"


@dataclass
class FloatGraph:
    """Layers in execution order over named tensors, with the source model."""

    model: onnx.ModelProto
    inputs: list[str]
    outputs: list[str]
    layers: list[FLayer]
    shapes: dict[str, list[int]]
    constants: dict[str, np.ndarray]
    equalization: object | None = None  # quant.equalize.Result when lowered with equalize

    def activation_tensors(self) -> list[str]:
        """Every non-constant tensor a layer reads or writes, in first-use order."""
        seen: dict[str, None] = {t: None for t in self.inputs}
        for layer in self.layers:
            for t in [*layer.inputs, *layer.outputs]:
                if t not in self.constants:
                    seen.setdefault(t, None)
        return list(seen)

    def node_model(self, layer: FLayer) -> onnx.ModelProto:
        """A model of just ``layer``'s source nodes: its dynamic inputs in, its outputs out."""
        return fragment_model(self.model, layer.source_nodes,
                              list(dict.fromkeys(t for t in layer.inputs if t not in self.constants)),
                              layer.outputs, self.constants)  # x·x reads x once


def fragment_model(model: onnx.ModelProto, node_names: Sequence[str], inputs: Sequence[str],
                   outputs: Sequence[str], constants: Mapping[str, np.ndarray]) -> onnx.ModelProto:
    """Extract ``node_names`` from ``model`` as a float model; constant inputs become
    initializers, local functions and opsets are kept."""
    wanted = set(node_names)
    nodes = [n for n in model.graph.node if n.name in wanted]
    produced = {o for n in nodes for o in n.output}
    needed = {i for n in nodes for i in n.input if i and i not in produced}
    inits = [onnx.numpy_helper.from_array(np.asarray(constants[name]), name)
             for name in sorted(needed) if name in constants and name not in inputs]
    graph = onnx.helper.make_graph(
        nodes, "fragment",
        [onnx.helper.make_tensor_value_info(i, onnx.TensorProto.FLOAT, None) for i in inputs],
        [onnx.ValueInfoProto(name=o) for o in outputs], inits)
    frag = onnx.helper.make_model(graph, opset_imports=list(model.opset_import),
                                  functions=list(model.functions))
    frag.ir_version = min(model.ir_version or onnx_io.MAX_ORT_IR_VERSION, onnx_io.MAX_ORT_IR_VERSION)
    return frag


class Probe:
    """The float model with every node output exposed: run it for any set of tensors."""

    def __init__(self, model: onnx.ModelProto):
        probe = onnx_io.clone(model)
        existing = {o.name for o in probe.graph.output}
        for node in probe.graph.node:
            for out in node.output:
                if out and out not in existing:
                    probe.graph.output.append(onnx.ValueInfoProto(name=out))
                    existing.add(out)
        self.session = onnx_io.session(probe)
        self.input_names = [i.name for i in self.session.get_inputs()]
        self.output_names = [o.name for o in self.session.get_outputs()]

    def run(self, feeds: Mapping[str, np.ndarray], outputs: Sequence[str] | None = None
            ) -> dict[str, np.ndarray]:
        names = list(outputs) if outputs is not None else [
            o.name for o in self.session.get_outputs()]
        values = self.session.run(names, {k: feeds[k] for k in self.input_names})
        return dict(zip(names, values))
