"""ONNX node → TFLite int8 builtins, one emitter per ONNX op (`EMITTERS`), for
`npubuild.backends.tflite_writer`. 4-D activations are NHWC in the flatbuffer."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper

from npubuild.backends.tflite_writer import (
    AXIS_NHWC,
    NCHW_TO_NHWC,
    NHWC_TO_NCHW,
    Quant,
    Unwritable,
    Writer,
    weight_quant,
)

EMITTERS: dict[str, Callable[[Writer, onnx.NodeProto], None]] = {}


def emitter(*ops: str):
    def register(fn):
        for op in ops:
            EMITTERS[op] = fn
        return fn
    return register


def attrs(node: onnx.NodeProto) -> dict:
    return {a.name: helper.get_attribute_value(a) for a in node.attribute}


def _str(value) -> str:
    return value.decode() if isinstance(value, bytes) else str(value or "")


# ---- padding ---------------------------------------------------------------------------------

def _same_pads(size: int, k: int, s: int, d: int) -> tuple[int, int]:
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2, total - total // 2


def padding(w: Writer, node, x, kernel: list[int], strides: list[int], dilations: list[int],
            pad_value: int | None = None):
    """TFLite's SAME or VALID for the node's pads; other pads become an explicit PAD first.
    Returns (input tensor, padding enum)."""
    a = attrs(node)
    h, wd = x.shape[1], x.shape[2]
    auto = _str(a.get("auto_pad", "NOTSET"))
    if auto in ("SAME_UPPER",):
        return x, w.s.Padding.SAME
    if auto == "VALID":
        return x, w.s.Padding.VALID
    pads = list(a.get("pads", [0, 0, 0, 0]))
    top, left, bottom, right = pads[0], pads[1], pads[2], pads[3]
    if not any(pads):
        return x, w.s.Padding.VALID
    same = (_same_pads(h, kernel[0], strides[0], dilations[0])
            + _same_pads(wd, kernel[1], strides[1], dilations[1]))
    if (top, bottom, left, right) == same:
        return x, w.s.Padding.SAME
    return _pad(w, node, x, [[0, 0], [top, bottom], [left, right], [0, 0]], pad_value), w.s.Padding.VALID


def _pad(w: Writer, node, x, pads: list[list[int]], value: int | None):
    shape = [d + a + b for d, (a, b) in zip(x.shape, pads)]
    name = f"{node.output[0]}/pad"
    index = w._add_tensor(name, shape, w.s.TensorType.INT8, x.quant)
    out = type(x)(index, shape, x.nhwc, x.quant)
    paddings = w.int32(f"{name}/paddings", np.array(pads, np.int32))
    if value is None:
        w.op(w.s.BuiltinOperator.PAD, [x.index, paddings], [index], w.s.BuiltinOptions.PadOptions,
             w.s.PadOptionsT())
    else:
        fill = w._add_tensor(f"{name}/value", [], w.s.TensorType.INT8, x.quant,
                             np.array(value, np.int8))
        w.op(w.s.BuiltinOperator.PADV2, [x.index, paddings, fill], [index],
             w.s.BuiltinOptions.PadV2Options, w.s.PadV2OptionsT())
    return out


# ---- convolution and pooling -----------------------------------------------------------------

@emitter("Conv")
def conv(w: Writer, node) -> None:
    a = attrs(node)
    x = w.activation(node.input[0])
    if not x.nhwc:
        raise Unwritable("only 2-D convolutions (4-D tensors)")
    weight = w.consts.get(node.input[1])
    if weight is None:
        raise Unwritable("the weights are not constant")
    cout, cin_g, kh, kw = weight.shape
    group = int(a.get("group", 1))
    cin = x.shape[3]
    strides = list(a.get("strides", [1, 1]))
    dil = list(a.get("dilations", [1, 1]))
    x, pad = padding(w, node, x, [kh, kw], strides, dil)
    y = w.activation(node.output[0])
    bias = w.consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros(cout)
    if group == 1:
        q, wq = weight_quant(weight.transpose(0, 2, 3, 1), 0)  # OHWI
        code, otype = w.s.BuiltinOperator.CONV_2D, w.s.BuiltinOptions.Conv2DOptions
        options = w.s.Conv2DOptionsT()
    elif group == cin and cin_g == 1:
        q, wq = weight_quant(weight.transpose(1, 2, 3, 0), 3)  # 1HWO
        code, otype = w.s.BuiltinOperator.DEPTHWISE_CONV_2D, w.s.BuiltinOptions.DepthwiseConv2DOptions
        options = w.s.DepthwiseConv2DOptionsT()
        options.depthMultiplier = cout // cin
    else:
        raise Unwritable(f"grouped convolution (group {group} of {cin} channels)")
    options.padding = pad
    options.strideH, options.strideW = strides
    options.dilationHFactor, options.dilationWFactor = dil
    options.fusedActivationFunction = w.s.ActivationFunctionType.NONE
    wi = w._add_tensor(f"{node.output[0]}/weights", list(q.shape), w.s.TensorType.INT8, wq, q)
    bscale = (x.quant.scale[0] * wq.scale).astype(np.float32)
    bq = np.round(np.asarray(bias, np.float64) / bscale).astype(np.int32)
    bi = w.int32(f"{node.output[0]}/bias", bq, Quant(bscale, np.zeros(len(bscale), np.int64)))
    w.op(code, [x.index, wi, bi], [y.index], otype, options)


def _pool(w: Writer, node, code, otype, kernel, strides, pad_value=None) -> None:
    x = w.activation(node.input[0])
    if not x.nhwc:
        raise Unwritable("only 2-D pooling (4-D tensors)")
    x, pad = padding(w, node, x, kernel, strides, [1, 1], pad_value)
    y = w.activation(node.output[0])
    options = w.s.Pool2DOptionsT()
    options.padding = pad
    options.strideH, options.strideW = strides
    options.filterHeight, options.filterWidth = kernel
    w.op(code, [x.index], [y.index], otype, options)


@emitter("MaxPool")
def max_pool(w: Writer, node) -> None:
    a = attrs(node)
    if a.get("ceil_mode", 0) or any(d != 1 for d in a.get("dilations", [1, 1])):
        raise Unwritable("ceil_mode or dilations")
    _pool(w, node, w.s.BuiltinOperator.MAX_POOL_2D, w.s.BuiltinOptions.Pool2DOptions,
          list(a["kernel_shape"]), list(a.get("strides", [1, 1])), pad_value=-128)


@emitter("AveragePool")
def average_pool(w: Writer, node) -> None:
    a = attrs(node)
    if a.get("ceil_mode", 0) or (a.get("count_include_pad", 0) and any(a.get("pads", []))):
        raise Unwritable("ceil_mode or count_include_pad with padding")
    _pool(w, node, w.s.BuiltinOperator.AVERAGE_POOL_2D, w.s.BuiltinOptions.Pool2DOptions,
          list(a["kernel_shape"]), list(a.get("strides", [1, 1])))


@emitter("GlobalAveragePool")
def global_average_pool(w: Writer, node) -> None:
    x = w.activation(node.input[0])
    y = w.activation(node.output[0])
    options = w.s.Pool2DOptionsT()
    options.padding = w.s.Padding.VALID
    options.strideH = options.strideW = 1
    options.filterHeight, options.filterWidth = x.shape[1], x.shape[2]
    w.op(w.s.BuiltinOperator.AVERAGE_POOL_2D, [x.index], [y.index],
         w.s.BuiltinOptions.Pool2DOptions, options)


# ---- elementwise -----------------------------------------------------------------------------

def _operand(w: Writer, name: str, nhwc: bool):
    if name in w.consts:
        return w.const_int8(f"{name}/int8", w.consts[name], nhwc)
    return w.activation(name)


@emitter("Add", "Sub", "Mul")
def binary(w: Writer, node) -> None:
    nhwc = len(w.shapes.get(node.output[0], [])) == 4
    a, b = (_operand(w, n, nhwc) for n in node.input[:2])
    y = w.activation(node.output[0])
    code = {"Add": w.s.BuiltinOperator.ADD, "Sub": w.s.BuiltinOperator.SUB,
            "Mul": w.s.BuiltinOperator.MUL}[node.op_type]
    otype = {"Add": (w.s.BuiltinOptions.AddOptions, w.s.AddOptionsT),
             "Sub": (w.s.BuiltinOptions.SubOptions, w.s.SubOptionsT),
             "Mul": (w.s.BuiltinOptions.MulOptions, w.s.MulOptionsT)}[node.op_type]
    w.op(code, [a.index, b.index], [y.index], otype[0], otype[1]())


def _unary(w: Writer, node, code, otype=None, options=None) -> None:
    x = w.activation(node.input[0])
    y = w.activation(node.output[0], node.op_type)
    w.op(code, [x.index], [y.index], otype, options)


@emitter("Relu")
def relu(w: Writer, node) -> None:
    _unary(w, node, w.s.BuiltinOperator.RELU)


@emitter("Clip")
def clip(w: Writer, node) -> None:
    lo = w.consts.get(node.input[1]) if len(node.input) > 1 and node.input[1] else None
    lo = float(lo) if lo is not None else float(attrs(node).get("min", -np.inf))
    if lo != 0.0:
        raise Unwritable(f"Clip with a lower bound {lo} (only 0: RELU saturating at the output range)")
    # the upper bound is the output range: int8 saturation clips there
    _unary(w, node, w.s.BuiltinOperator.RELU)


@emitter("Sigmoid")
def sigmoid(w: Writer, node) -> None:
    _unary(w, node, w.s.BuiltinOperator.LOGISTIC)


@emitter("Tanh")
def tanh(w: Writer, node) -> None:
    _unary(w, node, w.s.BuiltinOperator.TANH)


@emitter("HardSwish")
def hard_swish(w: Writer, node) -> None:
    _unary(w, node, w.s.BuiltinOperator.HARD_SWISH)


@emitter("LeakyRelu")
def leaky_relu(w: Writer, node) -> None:
    options = w.s.LeakyReluOptionsT()
    options.alpha = float(attrs(node).get("alpha", 0.01))
    _unary(w, node, w.s.BuiltinOperator.LEAKY_RELU, w.s.BuiltinOptions.LeakyReluOptions, options)


@emitter("Softmax")
def softmax(w: Writer, node) -> None:
    x = w.activation(node.input[0])
    axis = int(attrs(node).get("axis", -1)) % len(w.shapes[node.input[0]])
    last = (AXIS_NHWC[axis] if x.nhwc else axis) == len(x.shape) - 1
    if not last:
        raise Unwritable(f"softmax over axis {axis} (TFLite's runs over the last dimension)")
    options = w.s.SoftmaxOptionsT()
    options.beta = 1.0
    _unary(w, node, w.s.BuiltinOperator.SOFTMAX, w.s.BuiltinOptions.SoftmaxOptions, options)


@emitter("Identity")
def identity(w: Writer, node) -> None:
    w.names[node.output[0]] = w.activation(node.input[0])


# ---- data movement ---------------------------------------------------------------------------

@emitter("Concat")
def concat(w: Writer, node) -> None:
    xs = [w.activation(n) for n in node.input]
    axis = int(attrs(node)["axis"]) % len(w.shapes[node.output[0]])
    axis = AXIS_NHWC[axis] if xs[0].nhwc else axis
    y = w.activation(node.output[0])
    options = w.s.ConcatenationOptionsT()
    options.axis = axis
    w.op(w.s.BuiltinOperator.CONCATENATION, [x.index for x in xs], [y.index],
         w.s.BuiltinOptions.ConcatenationOptions, options)


@emitter("Resize")
def resize(w: Writer, node) -> None:
    a = attrs(node)
    if _str(a.get("mode", "nearest")) != "nearest":
        raise Unwritable("only nearest resizing")
    coordinates = _str(a.get("coordinate_transformation_mode", "half_pixel"))
    nearest = _str(a.get("nearest_mode", "round_prefer_floor"))
    x = w.activation(node.input[0])
    y = w.activation(node.output[0])
    options = w.s.ResizeNearestNeighborOptionsT()
    if coordinates == "asymmetric" and nearest == "floor":
        options.alignCorners, options.halfPixelCenters = False, False
    elif coordinates in ("half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn"):
        options.alignCorners, options.halfPixelCenters = False, True
    else:
        raise Unwritable(f"coordinate mode {coordinates} with nearest_mode {nearest}")
    size = w.int32(f"{node.output[0]}/size", np.array(y.shape[1:3], np.int32))
    w.op(w.s.BuiltinOperator.RESIZE_NEAREST_NEIGHBOR, [x.index, size], [y.index],
         w.s.BuiltinOptions.ResizeNearestNeighborOptions, options)


@emitter("Pad")
def pad(w: Writer, node) -> None:
    if _str(attrs(node).get("mode", "constant")) != "constant":
        raise Unwritable("only constant padding")
    value = w.consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else None
    if value is not None and float(value) != 0.0:
        raise Unwritable("padding with a value other than 0")
    x = w.activation(node.input[0])
    pads = [int(p) for p in w.consts[node.input[1]]]
    rank = len(pads) // 2
    pairs = [[pads[i], pads[i + rank]] for i in range(rank)]
    if x.nhwc:
        pairs = [pairs[i] for i in NCHW_TO_NHWC]
    y = w.activation(node.output[0])
    paddings = w.int32(f"{node.output[0]}/paddings", np.array(pairs, np.int32))
    w.op(w.s.BuiltinOperator.PAD, [x.index, paddings], [y.index], w.s.BuiltinOptions.PadOptions,
         w.s.PadOptionsT())


@emitter("Reshape", "Flatten", "Squeeze", "Unsqueeze")
def reshape(w: Writer, node) -> None:
    """ONNX reshapes in NCHW order: an NHWC feature map is transposed to NCHW first (unless its
    spatial size is 1), and a 4-D result transposed back to NHWC."""
    x = w.activation(node.input[0])
    out_shape = list(w.shapes[node.output[0]])
    if x.nhwc and not (x.shape[1] == 1 and x.shape[2] == 1):
        x = _transpose(w, node, x, NHWC_TO_NCHW, "in")
    y = w.activation(node.output[0])
    spatial = y.nhwc and not (out_shape[2] == 1 and out_shape[3] == 1)
    target = out_shape if spatial else y.shape
    if spatial:
        name = f"{node.output[0]}/nchw"
        index = w._add_tensor(name, target, w.s.TensorType.INT8, x.quant)
        mid = type(x)(index, target, False, x.quant)
    else:
        mid = y
    shape = w.int32(f"{node.output[0]}/shape", np.array(target, np.int32))
    options = w.s.ReshapeOptionsT()
    options.newShape = list(target)
    w.op(w.s.BuiltinOperator.RESHAPE, [x.index, shape], [mid.index],
         w.s.BuiltinOptions.ReshapeOptions, options)
    if spatial:
        p = w.int32(f"{node.output[0]}/perm", np.array(NCHW_TO_NHWC, np.int32))
        w.op(w.s.BuiltinOperator.TRANSPOSE, [mid.index, p], [y.index],
             w.s.BuiltinOptions.TransposeOptions, w.s.TransposeOptionsT())


def _transpose(w: Writer, node, x, perm, tag: str = "transpose"):
    shape = [x.shape[i] for i in perm]
    name = f"{node.output[0]}/{tag}"
    index = w._add_tensor(name, shape, w.s.TensorType.INT8, x.quant)
    p = w.int32(f"{name}/perm", np.array(perm, np.int32))
    w.op(w.s.BuiltinOperator.TRANSPOSE, [x.index, p], [index],
         w.s.BuiltinOptions.TransposeOptions, w.s.TransposeOptionsT())
    return type(x)(index, shape, False, x.quant)


@emitter("Gemm")
def gemm(w: Writer, node) -> None:
    a = attrs(node)
    if a.get("transA", 0) or a.get("alpha", 1.0) != 1.0 or a.get("beta", 1.0) != 1.0:
        raise Unwritable("transA, alpha or beta")
    weight = w.consts.get(node.input[1])
    if weight is None:
        raise Unwritable("the weights are not constant")
    weight = weight if a.get("transB", 0) else weight.T  # FULLY_CONNECTED: [out, in]
    x = w.activation(node.input[0])
    y = w.activation(node.output[0])
    q, wq = weight_quant(weight, 0)
    wi = w._add_tensor(f"{node.output[0]}/weights", list(q.shape), w.s.TensorType.INT8, wq, q)
    bias = w.consts.get(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros(len(q))
    bscale = (x.quant.scale[0] * wq.scale).astype(np.float32)
    bq = np.round(np.broadcast_to(bias, (len(q),)) / bscale).astype(np.int32)
    bi = w.int32(f"{node.output[0]}/bias", bq, Quant(bscale, np.zeros(len(bscale), np.int64)))
    options = w.s.FullyConnectedOptionsT()
    w.op(w.s.BuiltinOperator.FULLY_CONNECTED, [x.index, wi, bi], [y.index],
         w.s.BuiltinOptions.FullyConnectedOptions, options)


@emitter("Split")
def split(w: Writer, node) -> None:
    x = w.activation(node.input[0])
    rank = len(w.shapes[node.input[0]])
    axis = int(attrs(node).get("axis", 0)) % rank
    axis = AXIS_NHWC[axis] if x.nhwc else axis
    sizes = (w.consts.get(node.input[1]) if len(node.input) > 1 and node.input[1]
             else attrs(node).get("split"))
    if sizes is None:
        sizes = [x.shape[axis] // len(node.output)] * len(node.output)
    ys = [w.activation(o) for o in node.output]
    size_splits = w.int32(f"{node.output[0]}/sizes", np.array(sizes, np.int32))
    axis_t = w.int32(f"{node.output[0]}/axis", np.array(axis, np.int32))
    options = w.s.SplitVOptionsT()
    options.numSplits = len(ys)
    w.op(w.s.BuiltinOperator.SPLIT_V, [x.index, size_splits, axis_t], [y.index for y in ys],
         w.s.BuiltinOptions.SplitVOptions, options)


@emitter("Div")
def div(w: Writer, node) -> None:
    """A division by a constant is a MUL by its reciprocal (TFLite's DIV has no int8 kernel
    Vela runs on Ethos-U55/U65); a division by a tensor has no form here."""
    divisor = w.consts.get(node.input[1])
    if divisor is None:
        raise Unwritable("division by a tensor")
    nhwc = len(w.shapes.get(node.output[0], [])) == 4
    a = _operand(w, node.input[0], nhwc)
    b = w.const_int8(f"{node.input[1]}/reciprocal", 1.0 / np.asarray(divisor, np.float32), nhwc)
    y = w.activation(node.output[0])
    w.op(w.s.BuiltinOperator.MUL, [a.index, b.index], [y.index], w.s.BuiltinOptions.MulOptions,
         w.s.MulOptionsT())
