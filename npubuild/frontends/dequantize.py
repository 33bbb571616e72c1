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

ONNX Runtime's dynamic quantization (``quantize_dynamic``: each activation quantized at run time
by DynamicQuantizeLinear, int8 weights) becomes its float model too: a ConvInteger or
MatMulInteger, the int32 bias added beside it and the Cast and scale Mul after it become one Conv
or MatMul on the float activation with the dequantized weights and the float bias the int32 one
was computed from; a DynamicQuantizeLSTM becomes an LSTM with its weights dequantized (and laid
out as LSTM takes them). Left as it is, every layer of such a model ran on the CPU.

An integer model input or output (TFLite's ``inference_input_type=tf.int8``) keeps its
DequantizeLinear or QuantizeLinear: the caller feeds and reads integers. The input's
DequantizeLinear is moved ahead of the layout ops between it and the input (TFLite's Reshape,
tf2onnx's NHWC→NCHW Transpose: they move the floats instead, exactly) and the output's
QuantizeLinear after those before the output, so both sit at the model's boundary, where split
places them on the NPU as its input's and output's own quantization (`split.plan.integer_io`).
A model where one pair does not fit (another consumer of its integers, a DequantizeLinear with
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
    dynamic: int = 0  # integer layers of ONNX Runtime's dynamic quantization made float
    kept: str = ""

    def summary(self) -> dict:
        if self.kept:
            return {"kept_quantized": self.kept}
        return {"activation_pairs_removed": self.pairs, "constants_dequantized": self.constants,
                "relus_kept": self.relus, "dynamic_layers_made_float": self.dynamic}


def is_quantized(model: onnx.ModelProto) -> bool:
    """Whether the model quantizes computed tensors, keeps weights quantized behind a
    DequantizeLinear (a weight-only or dynamic-range quantized model), or computes on integers
    ONNX Runtime's dynamic quantization made."""
    inits = {t.name for t in model.graph.initializer}
    return any((n.op_type == "QuantizeLinear" and n.input[0] not in inits)
               or (n.op_type == "DequantizeLinear" and all(i in inits for i in n.input if i))
               or n.op_type in DYNAMIC
               for n in model.graph.node)


def to_float(model: onnx.ModelProto) -> Dequantized:
    """The float model ``model`` quantizes (see the module doc), or ``model`` itself with the
    reason when one of its pairs cannot be removed exactly."""
    from npubuild.surgery.graph import Editor

    ed = Editor(model, "dequantize")
    dynamic = _dynamic_to_float(ed)
    if isinstance(dynamic, str):
        return Dequantized(model, kept=dynamic)
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
    _integer_io_at_the_boundary(ed)
    return Dequantized(ed.finish(), pairs=len(quantizers), constants=len(folded), relus=relus,
                       dynamic=dynamic)


# Ops that only lay out one tensor (no values selected or combined): an integer model input's
# DequantizeLinear moves ahead of them, an integer output's QuantizeLinear after them.
LAYOUT = {"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Flatten", "Identity"}


def _integer_io_at_the_boundary(ed) -> None:
    """An integer model input's DequantizeLinear reads the input itself, and an integer
    output's QuantizeLinear writes the output itself: the layout ops between them (TFLite's
    input Reshape, tf2onnx's NHWC→NCHW Transpose) run on the floats instead, exactly (a per-
    tensor affine map commutes with moving values). Split then finds the model's integer
    conversions at its boundary, where the NPU takes them as its input's and output's own
    quantization (`split.plan`)."""
    for node in list(ed.graph.node):
        if node.op_type == "DequantizeLinear" and _per_tensor(ed, node):
            chain = _layout_chain(ed, node.input[0], upward=True)
            if chain and chain[-1].input[0] in ed.input_names \
                    and not ed.is_graph_output(node.output[0]):
                source, first = chain[-1].input[0], chain[-1]
                floats = ed.unique_tensor(source + "_dequantized")
                ed.replace_uses(node.output[0], node.input[0])
                node.input[0], node.output[0] = source, floats
                first.input[0] = floats
                ed.touch()
        elif node.op_type == "QuantizeLinear" and _per_tensor(ed, node):
            chain = _layout_chain(ed, node.output[0], upward=False)
            if chain and ed.is_graph_output(chain[-1].output[0]):
                target, first = chain[-1].output[0], chain[0]
                floats = ed.unique_tensor(target + "_prequant")
                chain[-1].output[0] = floats
                first.input[0] = node.input[0]
                node.input[0], node.output[0] = floats, target
                ed.touch()


def _per_tensor(ed, node: onnx.NodeProto) -> bool:
    """A constant scalar scale and zero point."""
    params = [ed.constant(i) for i in node.input[1:3] if i]
    return len(params) == 2 and all(p is not None and np.size(p) == 1 for p in params)


def _layout_chain(ed, tensor: str, upward: bool) -> list[onnx.NodeProto]:
    """The single-path layout ops from ``tensor`` towards the model's boundary (up to its
    producers or down to its consumers), nearest first."""
    chain = []
    while True:
        if upward:
            node = ed.producer(tensor)
            if node is None or node.op_type not in LAYOUT or len(ed.consumers(tensor)) != 1 \
                    or ed.is_graph_output(tensor):
                return chain
            tensor = node.input[0]
        else:
            users = ed.consumers(tensor)
            if len(users) != 1 or users[0].op_type not in LAYOUT or ed.is_graph_output(tensor) \
                    or users[0].input[0] != tensor:
                return chain
            node = users[0]
            tensor = node.output[0]
        chain.append(node)


DYNAMIC = {"ConvInteger", "MatMulInteger", "DynamicQuantizeLSTM"}


def _dynamic_to_float(ed) -> int | str:
    """Rewrite ONNX Runtime's dynamically quantized layers as float ones (see the module doc);
    how many, or why one cannot be (then nothing should be kept of the edits)."""
    quantized = {n.output[0]: n for n in ed.graph.node if n.op_type == "DynamicQuantizeLinear"}
    count = 0
    for node in list(ed.graph.node):
        if node.op_type in ("ConvInteger", "MatMulInteger"):
            why = _integer_layer_to_float(ed, node, quantized)
        elif node.op_type == "DynamicQuantizeLSTM":
            why = _lstm_to_float(ed, node)
        else:
            continue
        if why:
            return f"{node.op_type} {node.name!r}: {why}"
        count += 1
    return count


def _integer_layer_to_float(ed, node: onnx.NodeProto, quantized: dict) -> str:
    """x → DynamicQuantizeLinear → ConvInteger/MatMulInteger(·, w) [+ int32 bias] → Cast →
    Mul(x_scale · w_scale) becomes Conv/MatMul(x, w dequantized[, bias])."""
    source = quantized.get(node.input[0])
    weight = ed.constant(node.input[1])
    w_zero = ed.constant(node.input[3]) if len(node.input) > 3 and node.input[3] else 0
    if source is None or weight is None or w_zero is None:
        return "its input is not a DynamicQuantizeLinear of a float tensor, or its weight not constant"
    add, bias = _single_user(ed, node.output[0]), None
    if add is not None and add.op_type == "Add":
        bias = _float_bias(ed, add.input[1] if add.input[0] == node.output[0] else add.input[0])
        if bias is None:
            return "the value added to its result is not a bias computed from a float constant"
        cast = _single_user(ed, add.output[0])
    else:
        add, cast = None, add
    mul = _single_user(ed, cast.output[0]) if cast is not None and cast.op_type == "Cast" else None
    if mul is None or mul.op_type != "Mul":
        return "its result is not cast to float and scaled by one Mul"
    scales = ed.producer(mul.input[1] if mul.input[0] == cast.output[0] else mul.input[0])
    w_scale = None
    if scales is not None and scales.op_type == "Mul" and source.output[1] in scales.input:
        w_scale = ed.constant(next(i for i in scales.input if i != source.output[1]))
    if w_scale is None:
        return "the scale its result is multiplied by is not the activation's times a constant"
    if node.op_type == "ConvInteger":  # per tensor or per output channel (axis 0)
        per_channel = (-1, *[1] * (weight.ndim - 1))
        w = ((weight.astype(np.float32) - np.asarray(w_zero, np.float32).reshape(per_channel))
             * np.asarray(w_scale, np.float32).reshape(per_channel))
        inputs = [source.input[0], ed.add_initializer(w, node.input[1] + "_float")]
        if bias is not None:
            inputs.append(ed.add_initializer(bias.reshape(-1).astype(np.float32), node.name + "_bias"))
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
        ed.make_node("Conv", inputs, [mul.output[0]], node.name + "_float", **attrs)
    else:
        # per tensor or per column (the last axis)
        w = (weight.astype(np.float32) - np.asarray(w_zero, np.float32)) * np.asarray(w_scale, np.float32)
        out = mul.output[0] if bias is None else ed.unique_tensor(mul.output[0] + "_matmul")
        ed.make_node("MatMul", [source.input[0], ed.add_initializer(w, node.input[1] + "_float")],
                     [out], node.name + "_float")
        if bias is not None:
            ed.make_node("Add", [out, ed.add_initializer(bias.astype(np.float32), node.name + "_bias")],
                         [mul.output[0]], node.name + "_bias")
    ed.remove(*[n for n in (node, add, cast, mul) if n is not None])
    return ""


def _single_user(ed, name: str) -> onnx.NodeProto | None:
    users = ed.consumers(name)
    return users[0] if len(users) == 1 and not ed.is_graph_output(name) else None


def _float_bias(ed, name: str) -> np.ndarray | None:
    """The float constant an int32 bias was computed from: Reshape/Cast/Floor/Round of
    Div(bias, x_scale · w_scale), as ``quantize_dynamic`` writes it."""
    node = ed.producer(name)
    while node is not None and node.op_type in ("Reshape", "Cast", "Floor", "Round", "Unsqueeze"):
        node = ed.producer(node.input[0])
    if node is None or node.op_type != "Div":
        return None
    return ed.constant(node.input[0])


def _lstm_to_float(ed, node: onnx.NodeProto) -> str:
    """DynamicQuantizeLSTM(X, W, R, B, lens, h0, c0, P, W scale, W zero point, R scale, R zero
    point), weights [directions, input, 4·hidden] → LSTM with float weights [directions,
    4·hidden, input]."""
    ins = list(node.input) + [""] * (12 - len(node.input))
    floats = []
    for q, scale, zero in ((ins[1], ins[8], ins[9]), (ins[2], ins[10], ins[11])):
        values = [ed.constant(name) for name in (q, scale, zero)]
        if any(v is None for v in values):
            return "its weights, scales or zero points are not constant"
        weight, scale, zero = (np.asarray(v, np.float32) for v in values)
        shape = (weight.shape[0], 1, -1)  # per direction, or per direction and column
        w = (weight - zero.reshape(shape)) * scale.reshape(shape)
        floats.append(ed.add_initializer(np.ascontiguousarray(w.transpose(0, 2, 1)), q + "_float"))
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    inputs = [ins[0], *floats, *ins[3:8]]
    while inputs and not inputs[-1]:
        inputs.pop()
    ed.make_node("LSTM", inputs, list(node.output), node.name + "_float", **attrs)
    ed.remove(node)
    return ""


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
