"""A quantized model as the float model it was quantized from.

tf2onnx writes a full-integer TFLite model as QuantizeLinear/DequantizeLinear pairs around
float ops, with int8 weights behind DequantizeLinear. ONNX Runtime runs that faithfully (the
import proves it op by op), but a chip compiler cannot treat the pairs as network layers: they
would all go to the CPU. npubuild quantizes for the chip itself, so the import hands later stages
the float model instead:

- a DequantizeLinear of constants becomes the float constant it computes (weights and int32
  biases, per-tensor or per-axis);
- each activation pair ``x → QuantizeLinear → … → DequantizeLinear`` becomes ``x``, including
  the data-movement ops between them (Reshape, Transpose, MaxPool, … run on floats alike),
  provided every DequantizeLinear reading the pair's integers uses the QuantizeLinear's own
  scale and zero point;
- where the pair's range starts at exactly zero (its zero point is the type's minimum) the
  integer clamp is a ReLU TFLite fused away, and a Relu keeps it.

An integer model input or output (TFLite's ``inference_input_type=tf.int8``) keeps its
DequantizeLinear or QuantizeLinear: the caller feeds and reads integers, and those two run on
the host. A model where one pair does not fit (another consumer of its integers, a DequantizeLinear with
other parameters) is left quantized and `to_float` says why: its pairs would run on the CPU.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from npubuild import onnx_io

# Ops that move or select integer values without arithmetic: on the dequantized floats they
# give the dequantized result (a max of affine values is the affine value of the max).
MOVEMENT = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity", "MaxPool",
            "Concat", "Slice", "Split", "Gather", "DepthToSpace", "SpaceToDepth", "Tile",
            "Expand", "ReduceMax", "ReduceMin"}
# Producers whose outputs are never negative: no Relu needed where a pair's range starts at 0
_NON_NEGATIVE = {"Relu", "Sigmoid", "Softmax", "HardSigmoid", "Abs", "Exp", "Sqrt"}
_TYPE_MIN = {onnx.TensorProto.INT8: -128, onnx.TensorProto.UINT8: 0, onnx.TensorProto.INT16: -32768,
             onnx.TensorProto.UINT16: 0}


@dataclass(frozen=True)
class Dequantized:
    """`to_float`'s result: the model, and what it did (``kept`` says why nothing was done)."""

    model: onnx.ModelProto
    pairs: int = 0
    constants: int = 0
    relus: int = 0
    kept: str = ""

    def summary(self) -> dict:
        if self.kept:
            return {"kept_quantized": self.kept}
        return {"activation_pairs_removed": self.pairs, "constants_dequantized": self.constants,
                "relus_kept": self.relus}


def is_quantized(model: onnx.ModelProto) -> bool:
    """Whether the model quantizes computed tensors, or keeps weights quantized behind a
    DequantizeLinear (a weight-only or dynamic-range quantized model)."""
    inits = {t.name for t in model.graph.initializer}
    return any((n.op_type == "QuantizeLinear" and n.input[0] not in inits)
               or (n.op_type == "DequantizeLinear" and all(i in inits for i in n.input if i))
               for n in model.graph.node)


def to_float(model: onnx.ModelProto) -> Dequantized:
    """The float model ``model`` quantizes (see the module doc), or ``model`` itself with the
    reason when one of its pairs cannot be removed exactly."""
    from npubuild.surgery.graph import Editor

    ed = Editor(model, "dequantize")
    inits = {t.name: t for t in ed.graph.initializer}
    outputs = set(ed.output_names)

    folded: dict[str, np.ndarray] = {}
    for node in ed.graph.node:
        if node.op_type == "DequantizeLinear" and all(i in inits for i in node.input if i):
            folded[node.output[0]] = _dequantize_constant(node, inits)

    params: dict[str, tuple] = {}  # integer tensor → the (scale, zero point) its pair uses
    quantizers = []
    for node in ed.graph.node:
        if node.op_type == "QuantizeLinear" and node.input[0] not in inits:
            if node.output[0] in outputs:  # an integer output the caller reads: it stays
                continue
            params[node.output[0]] = _params(node, inits)
            quantizers.append(node)
        elif node.op_type in MOVEMENT and any(i in params for i in _data_inputs(node)):
            found = {params.get(i) for i in _data_inputs(node) if i not in inits}
            if len(found) > 1:
                return Dequantized(model, kept=f"{node.op_type} {node.name!r} joins integers "
                                               "of different scales")
            for out in node.output:
                params[out] = next(iter(found))
    for name, pair in params.items():
        if name in outputs:
            return Dequantized(model, kept=f"the output {name!r} is an integer tensor")
        for user in ed.consumers(name):
            if user.op_type == "DequantizeLinear":
                if user.input[0] == name and _params(user, inits) != pair:
                    return Dequantized(model, kept=f"DequantizeLinear {user.name!r} reads "
                                                   f"{name!r} with another scale")
            elif user.op_type not in MOVEMENT or name not in _data_inputs(user):
                return Dequantized(model, kept=f"{user.op_type} {user.name!r} computes on the "
                                               f"integers of {name!r}")

    readers = {id(n) for n in ed.graph.node  # decided before the edits rename their inputs
               if n.op_type == "DequantizeLinear" and n.input[0] in params}
    relus = 0
    for node in list(ed.graph.node):
        out = node.output[0]
        if out in folded:  # the weight itself, under the DequantizeLinear's output name
            ed.remove(node)
            ed.set_initializer(out, folded[out])
        elif node.op_type == "QuantizeLinear" and out in params:
            source = node.input[0]
            if _starts_at_zero(node, inits) and not _non_negative(ed.producer(source), inits):
                relu = ed.make_node("Relu", [source], [ed.unique_tensor(out + "_relu")],
                                    node.name + "_relu")
                ed.replace_uses(out, relu.output[0])
                relus += 1
            ed.bypass(node)
        elif id(node) in readers:
            if ed.is_graph_output(out) and node.input[0] in ed.input_names:
                # an output that is the input itself: an Identity keeps both names
                ed.make_node("Identity", [node.input[0]], [out], node.name)
                ed.remove(node)
            else:
                ed.bypass(node)
    return Dequantized(ed.finish(), pairs=len(quantizers), constants=len(folded), relus=relus)


def _data_inputs(node: onnx.NodeProto) -> list[str]:
    """The inputs a data-movement op moves (the rest are shapes, indices, axes)."""
    return [i for i in node.input if i] if node.op_type == "Concat" else list(node.input[:1])


def _dequantize_constant(node: onnx.NodeProto, inits: dict) -> np.ndarray:
    values = [numpy_helper.to_array(inits[i]) for i in node.input if i]
    q, scale = values[0].astype(np.float64), values[1].astype(np.float64)
    zero = values[2].astype(np.float64) if len(values) > 2 else np.zeros_like(scale)
    if scale.ndim == 1 and scale.size > 1:  # per-axis
        axis = next((a.i for a in node.attribute if a.name == "axis"), 1) % q.ndim
        shape = [1] * q.ndim
        shape[axis] = scale.size
        scale, zero = scale.reshape(shape), zero.reshape(shape)
    # float32 arithmetic as ONNX Runtime's DequantizeLinear: the folded weights equal its output
    return ((q - zero).astype(np.float32) * scale.astype(np.float32)).astype(np.float32)


def _params(node: onnx.NodeProto, inits: dict) -> tuple:
    scale = inits.get(node.input[1])
    zero = inits.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    axis = next((a.i for a in node.attribute if a.name == "axis"), 1)
    return (numpy_helper.to_array(scale).tobytes() if scale is not None else node.input[1],
            numpy_helper.to_array(zero).tobytes() if zero is not None else b"",
            zero.data_type if zero is not None else onnx.TensorProto.UINT8,
            axis if scale is not None and numpy_helper.to_array(scale).size > 1 else None)


def _non_negative(node: onnx.NodeProto | None, inits: dict) -> bool:
    """Whether ``node``'s output is never negative (a Relu there would change nothing)."""
    if node is None:
        return False
    if node.op_type == "Clip":
        low = node.input[1] if len(node.input) > 1 else ""
        return low in inits and float(numpy_helper.to_array(inits[low])) >= 0
    return node.op_type in _NON_NEGATIVE


def _starts_at_zero(node: onnx.NodeProto, inits: dict) -> bool:
    if len(node.input) < 3 or node.input[2] not in inits:
        return False
    zero = inits[node.input[2]]
    values = numpy_helper.to_array(zero)
    return values.size == 1 and int(values.reshape(())) == _TYPE_MIN.get(zero.data_type, 1)
