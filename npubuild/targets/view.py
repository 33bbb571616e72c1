"""What the op-support checks see of a node: its attributes, inferred shapes and constants.

`GraphFacts` is built once per (shape-inferred) model: tensor types and shapes by name,
constant tensors (initializers and Constant nodes), and the model-local functions that fused
nodes call. `NodeView` wraps one node with those facts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

import lazy_loader as lazy

from npubuild.onnx_io import STANDARD_DOMAINS

np = lazy.load("numpy")
onnx = lazy.load("onnx")

Shape = list[int | str | None]


@dataclass
class GraphFacts:
    """Types, shapes and constants of one graph's tensors."""

    types: dict[str, tuple[int, Shape | None]]
    consts: dict[str, onnx.TensorProto]
    functions: dict[tuple[str, str, str], onnx.FunctionProto] = field(default_factory=dict)
    opset_imports: list[onnx.OperatorSetIdProto] = field(default_factory=list)
    ir_version: int = 8
    cache: dict[Any, Any] = field(default_factory=dict)
    _values: dict[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def from_model(cls, model: onnx.ModelProto) -> "GraphFacts":
        """Facts of a model whose shapes were inferred (``infer_shapes`` output)."""
        g = model.graph
        types: dict[str, tuple[int, Shape | None]] = {}
        for value in [*g.input, *g.value_info, *g.output]:
            tt = value.type.tensor_type
            if value.type.HasField("tensor_type"):
                types[value.name] = (tt.elem_type, _dims(tt) if tt.HasField("shape") else None)
        consts = {t.name: t for t in g.initializer}
        for node in g.node:
            tensor = constant_value(node)
            if tensor is not None:
                consts[node.output[0]] = tensor
        for name, tensor in consts.items():
            types[name] = (tensor.data_type, list(tensor.dims))
        functions = {(f.domain, f.name, f.overload): f for f in model.functions}
        return cls(types, consts, functions, list(model.opset_import), model.ir_version)

    def shape(self, name: str) -> Shape | None:
        return self.types.get(name, (0, None))[1]

    def elem_type(self, name: str) -> int:
        return self.types.get(name, (0, None))[0]

    def is_const(self, name: str) -> bool:
        return name in self.consts

    def value(self, name: str) -> np.ndarray | None:
        if name not in self.consts:
            return None
        if name not in self._values:
            self._values[name] = onnx.numpy_helper.to_array(self.consts[name])
        return self._values[name]


def _dims(tensor_type) -> Shape:
    return [d.dim_value if d.HasField("dim_value") else (d.dim_param or None)
            for d in tensor_type.shape.dim]


def constant_value(node: onnx.NodeProto) -> onnx.TensorProto | None:
    """The tensor a Constant node produces, or None for any other node."""
    if node.op_type != "Constant" or node.domain not in STANDARD_DOMAINS or not node.attribute:
        return None
    attr = node.attribute[0]
    value = onnx.helper.get_attribute_value(attr)
    if attr.name == "value":
        tensor = onnx.TensorProto()
        tensor.CopyFrom(value)
    elif attr.name in ("value_float", "value_floats"):
        tensor = onnx.numpy_helper.from_array(np.asarray(value, dtype=np.float32))
    elif attr.name in ("value_int", "value_ints"):
        tensor = onnx.numpy_helper.from_array(np.asarray(value, dtype=np.int64))
    else:  # sparse_value, value_string(s): not needed by any check
        return None
    tensor.name = node.output[0]
    return tensor


def is_static(shape: Shape | None) -> bool:
    return shape is not None and all(isinstance(d, int) and d > 0 for d in shape)


def show_shape(shape: Shape | None) -> str:
    if shape is None:
        return "unknown"
    return "[" + ", ".join("?" if d is None else str(d) for d in shape) + "]"


@dataclass
class NodeView:
    """One node as the support checks see it."""

    node: onnx.NodeProto
    facts: GraphFacts

    @property
    def op(self) -> str:
        return self.node.op_type

    @cached_property
    def attrs(self) -> dict[str, Any]:
        return {a.name: onnx.helper.get_attribute_value(a) for a in self.node.attribute}

    def attr(self, name: str, default: Any = None) -> Any:
        value = self.attrs.get(name, default)
        return value.decode() if isinstance(value, bytes) else value

    @cached_property
    def activations(self) -> list[str]:
        """Non-empty inputs that are not constants (weights, shapes, scales are)."""
        return [i for i in self.node.input if i and not self.facts.is_const(i)]

    @cached_property
    def outputs(self) -> list[str]:
        return [o for o in self.node.output if o]

    def input(self, index: int) -> str:
        return self.node.input[index] if index < len(self.node.input) else ""

    def shape(self, name: str) -> Shape | None:
        return self.facts.shape(name) if name else None

    def const(self, index: int) -> np.ndarray | None:
        return self.facts.value(self.input(index))

    def rank(self) -> int | None:
        """The rank of the first activation input (else of the first output)."""
        names = self.activations or self.outputs
        shape = self.shape(names[0]) if names else None
        return None if shape is None else len(shape)
