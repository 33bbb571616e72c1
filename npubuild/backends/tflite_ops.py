"""npubuild's quantized layers → TFLite integer builtins, one emitter per layer kind
(`EMITTERS`), for `npubuild.backends.tflite_writer`. 4-D activations are NHWC in the flatbuffer;
the layers' attributes are in ONNX (NCHW) terms."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npubuild.backends.tflite_writer import (
    AXIS_NHWC,
    INT_RANGE,
    NCHW_TO_NHWC,
    NHWC_TO_NCHW,
    Quant,
    Tensor,
    Unwritable,
    Writer,
)
from npubuild.quant.qgraph import QLayer

EMITTERS: dict[str, Callable[[Writer, QLayer], None]] = {}


def emitter(*kinds: str):
    def register(fn):
        for kind in kinds:
            EMITTERS[kind] = fn
        return fn
    return register


# ---- padding and fused activations -------------------------------------------------------------

def _same_pads(size: int, k: int, s: int, d: int) -> tuple[int, int]:
    out = -(-size // s)
    total = max((out - 1) * s + (k - 1) * d + 1 - size, 0)
    return total // 2, total - total // 2


def padding(w: Writer, layer: QLayer, x: Tensor, fill: int | None = None) -> tuple[Tensor, int]:
    """TFLite's SAME or VALID for the layer's pads [top, bottom, left, right]; other pads become
    an explicit PAD (``fill``: PADV2 with that integer; default the zero point, real 0) first."""
    a = layer.attrs
    pads = list(a.get("pads", [0, 0, 0, 0]))
    if not any(pads):
        return x, w.s.Padding.VALID
    (kh, kw), (sh, sw) = a["kernel"], a["stride"]
    dh, dw = a.get("dilation", [1, 1])
    if pads == [*_same_pads(x.shape[1], kh, sh, dh), *_same_pads(x.shape[2], kw, sw, dw)]:
        return x, w.s.Padding.SAME
    pairs = [[0, 0], pads[0:2], pads[2:4], [0, 0]]
    return pad_tensor(w, f"{layer.outputs[0]}/pad", x, pairs, fill), w.s.Padding.VALID


def pad_tensor(w: Writer, name: str, x: Tensor, pairs: list[list[int]], fill: int | None) -> Tensor:
    """A tensor of its own holding ``x`` padded by ``pairs`` (`pad_op`)."""
    shape = [d + a + b for d, (a, b) in zip(x.shape, pairs)]
    out = w.helper(name, x, x.quant, "npubuild (padding)", shape=shape)
    pad_op(w, name, x, out, pairs, fill)
    return out


def pad_op(w: Writer, name: str, x: Tensor, y: Tensor, pairs: list[list[int]], fill: int | None) -> None:
    """PAD (``fill`` None or the zero point: real 0) or PADV2 (``fill``) of ``x`` into ``y`` by
    ``pairs`` in ``x``'s own order."""
    paddings = w.constant(f"{name}/paddings", np.array(pairs, np.int32), "int32")
    if fill is None or fill == x.quant.zero_point[0]:
        w.op(w.s.BuiltinOperator.PAD, [x.index, paddings], [y.index],
             w.s.BuiltinOptions.PadOptions, w.s.PadOptionsT())
    else:
        value = w.constant(f"{name}/value", np.array(fill), x.dtype, x.quant)
        w.op(w.s.BuiltinOperator.PADV2, [x.index, paddings, value], [y.index],
             w.s.BuiltinOptions.PadV2Options, w.s.PadV2OptionsT())


def _tflite_round(v: float) -> int:
    return int(np.sign(v) * np.floor(abs(v) + 0.5))


def fused_activation(w: Writer, layer: QLayer, y: Tensor) -> int:
    """The TFLite fused activation whose clamp (TFLite's CalculateActivationRangeQuantized on
    the output's quantization) is the layer's integer clamp [qmin, qmax]."""
    qmin, qmax = layer.params.get("qmin"), layer.params.get("qmax")
    lo_t, hi_t = INT_RANGE[y.dtype]
    if qmin is None:
        return w.s.ActivationFunctionType.NONE
    scale, zp = y.quant.scale[0], y.quant.zero_point[0]
    q = lambda v: zp + _tflite_round(v / scale)  # noqa: E731
    A = w.s.ActivationFunctionType
    candidates = {A.NONE: (lo_t, hi_t), A.RELU: (max(lo_t, q(0.0)), hi_t),
                  A.RELU6: (max(lo_t, q(0.0)), min(hi_t, q(6.0))),
                  A.RELU_N1_TO_1: (max(lo_t, q(-1.0)), min(hi_t, q(1.0)))}
    for code, bounds in candidates.items():
        if bounds == (qmin, qmax):
            return code
    raise Unwritable(f"its integer clamp [{qmin}, {qmax}] is no TFLite fused activation "
                     f"(NONE, RELU, RELU6, RELU_N1_TO_1 on scale {scale:.6g}, zero point {zp})")


# ---- convolution and pooling -------------------------------------------------------------------

@emitter("conv")
def conv(w: Writer, layer: QLayer) -> None:
    a, p = layer.attrs, layer.params
    if layer.arrays["weight"].dtype != np.int8:
        raise Unwritable(f"its weights are {layer.arrays['weight'].dtype} (w16a16): TFLite's "
                         "kernels, 16x8 included, keep weights int8")
    x = w.tensor(layer.inputs[0])
    y = w.tensor(layer.outputs[0])
    weight = np.asarray(layer.arrays["weight"], np.int8)
    cout, cin_g = weight.shape[:2]
    scales = np.broadcast_to(np.asarray(p["weight_scale"], np.float64), (cout,))
    name = layer.outputs[0]
    if a.get("fc"):
        if x.nhwc:
            raise Unwritable("a fully connected layer on a 4-D tensor")
        code, otype = w.s.BuiltinOperator.FULLY_CONNECTED, w.s.BuiltinOptions.FullyConnectedOptions
        options = w.s.FullyConnectedOptionsT()
        options.keepNumDims = len(x.shape) > 2
        wq, axis, inputs = weight.reshape(cout, cin_g), 0, x
    else:
        if not x.nhwc:
            raise Unwritable("only 2-D convolutions (4-D tensors)")
        group, cin = int(a.get("group", 1)), x.shape[3]
        inputs, pad = padding(w, layer, x)
        if group == 1:
            wq, axis = weight.transpose(0, 2, 3, 1), 0  # OHWI
            code, otype = w.s.BuiltinOperator.CONV_2D, w.s.BuiltinOptions.Conv2DOptions
            options = w.s.Conv2DOptionsT()
        elif group == cin and cin_g == 1:
            wq, axis = weight.transpose(1, 2, 3, 0), 3  # 1HWO
            code = w.s.BuiltinOperator.DEPTHWISE_CONV_2D
            otype = w.s.BuiltinOptions.DepthwiseConv2DOptions
            options = w.s.DepthwiseConv2DOptionsT()
            options.depthMultiplier = cout // cin
        else:
            raise Unwritable(f"grouped convolution (group {group} of {cin} channels)")
        options.padding = pad
        options.strideH, options.strideW = a["stride"]
        options.dilationHFactor, options.dilationWFactor = a.get("dilation", [1, 1])
    options.fusedActivationFunction = fused_activation(w, layer, y)
    wi = w.constant(f"{name}/weights", wq, "int8", Quant.of(scales, 0, axis))
    # TFLite's 16x8 kernels take an int64 bias
    bias_dtype = "int32" if x.dtype == "int8" else "int64"
    bi = w.constant(f"{name}/bias", np.asarray(layer.arrays["bias"]), bias_dtype,
                    Quant.of(np.float32(x.quant.scale[0]) * scales.astype(np.float32), 0))
    w.op(code, [inputs.index, wi, bi], [y.index], otype, options)


def _pool(w: Writer, layer: QLayer, code, out_quant: Quant | None, why: str,
          fill: int | None = None) -> None:
    a = layer.attrs
    x = w.tensor(layer.inputs[0])
    if not x.nhwc:
        raise Unwritable("only 2-D pooling (4-D tensors)")
    if any(d != 1 for d in a.get("dilation", [1, 1])):
        raise Unwritable("dilated pooling")
    x, pad = padding(w, layer, x, fill)
    options = w.s.Pool2DOptionsT()
    options.padding = pad
    options.strideH, options.strideW = a["stride"]
    options.filterHeight, options.filterWidth = a["kernel"]
    w.output_at(layer.outputs[0], out_quant, why, lambda y: w.op(
        code, [x.index], [y.index], w.s.BuiltinOptions.Pool2DOptions, options))


@emitter("maxpool")
def max_pool(w: Writer, layer: QLayer) -> None:
    x = w.tensor(layer.inputs[0])
    _pool(w, layer, w.s.BuiltinOperator.MAX_POOL_2D, x.quant,
          "MAX_POOL_2D keeps its input's quantization", fill=INT_RANGE[x.dtype][0])


@emitter("avgpool")
def average_pool(w: Writer, layer: QLayer) -> None:
    """AVERAGE_POOL_2D at its input's quantization (then a QUANTIZE to npubuild's); a global
    average pool is a MEAN over H and W, which requantizes itself (one rounding, not two: an
    average's range is often a fraction of its input's)."""
    a = layer.attrs
    x = w.tensor(layer.inputs[0])
    if a.get("global") and x.nhwc:
        axes = w.constant(f"{layer.outputs[0]}/axes", np.array([1, 2], np.int32), "int32")
        options = w.s.ReducerOptionsT()
        options.keepDims = True
        y = w.tensor(layer.outputs[0])
        w.op(w.s.BuiltinOperator.MEAN, [x.index, axes], [y.index],
             w.s.BuiltinOptions.ReducerOptions, options)
        return
    pads = list(a.get("pads", [0, 0, 0, 0]))
    if any(pads) and not a.get("count_include_pad"):
        (kh, kw), (sh, sw) = a["kernel"], a["stride"]
        if pads != [*_same_pads(x.shape[1], kh, sh, 1), *_same_pads(x.shape[2], kw, sw, 1)]:
            raise Unwritable("padding that is not TFLite's SAME, without count_include_pad "
                             "(TFLite's SAME divides by the valid positions only)")
    _pool(w, layer, w.s.BuiltinOperator.AVERAGE_POOL_2D, x.quant,
          "AVERAGE_POOL_2D keeps its input's quantization")


# ---- elementwise -------------------------------------------------------------------------------

BINARY = {"add": ("ADD", "AddOptions"), "sub": ("SUB", "SubOptions"), "mul": ("MUL", "MulOptions")}


def _binary(w: Writer, layer: QLayer, which: str, inputs: list[Tensor]) -> None:
    op, opts = BINARY[which]
    y = w.tensor(layer.outputs[0])
    options = getattr(w.s, f"{opts}T")()
    options.fusedActivationFunction = fused_activation(w, layer, y)
    w.op(getattr(w.s.BuiltinOperator, op), [t.index for t in inputs], [y.index],
         getattr(w.s.BuiltinOptions, opts), options)


@emitter("add")
def add(w: Writer, layer: QLayer) -> None:
    like = w.tensor(next(t for t in layer.inputs if t not in w.q.constants))
    _binary(w, layer, "sub" if layer.attrs.get("sub") else "add",
            [w.operand(t, like) for t in layer.inputs])


@emitter("mul")
def mul(w: Writer, layer: QLayer) -> None:
    like = w.tensor(next(t for t in layer.inputs if t not in w.q.constants))
    _binary(w, layer, "mul", [w.operand(t, like) for t in layer.inputs])


@emitter("rescale")
def rescale(w: Writer, layer: QLayer) -> None:
    """x · k as a MUL by a one-element constant holding k exactly (±qmax at scale |k|/qmax);
    with a negative side (PRelu, LeakyRelu) of one slope, LEAKY_RELU."""
    if "negative_factor" in layer.attrs:
        _leaky_relu(w, layer)
        return
    x = w.tensor(layer.inputs[0])
    k = float(layer.attrs["factor"])
    top = INT_RANGE[x.dtype][1]
    shape = [1] * len(x.shape)
    value = np.full(shape, top if k >= 0 else -top)
    factor = w.constant(f"{layer.outputs[0]}/factor", value, x.dtype, Quant.of(abs(k) / top, 0))
    factor_t = Tensor(factor, shape, x.nhwc, Quant.of(abs(k) / top, 0), x.dtype)
    _binary(w, layer, "mul", [x, factor_t])


# ---- tables ------------------------------------------------------------------------------------

def _fragment(layer: QLayer) -> onnx.ModelProto | None:
    data = layer.arrays.get("model")
    return None if data is None else onnx.load_from_string(np.asarray(data, np.uint8).tobytes())


def _clip_bounds(frag: onnx.ModelProto) -> tuple[float, float]:
    node = next(n for n in frag.graph.node if n.op_type == "Clip")
    consts = {t.name: float(numpy_helper.to_array(t)) for t in frag.graph.initializer}
    consts.update({n.output[0]: float(numpy_helper.to_array(n.attribute[0].t))
                   for n in frag.graph.node if n.op_type == "Constant"})
    attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
    lo = consts.get(node.input[1], -np.inf) if len(node.input) > 1 and node.input[1] else attrs.get("min", -np.inf)
    hi = consts.get(node.input[2], np.inf) if len(node.input) > 2 and node.input[2] else attrs.get("max", np.inf)
    return float(lo), float(hi)


def _unary(w: Writer, layer: QLayer, op: str, fixed: bool = False, options=None) -> None:
    x = w.tensor(layer.inputs[0])
    quant = w.fixed(op, x.dtype) if fixed else None
    code = getattr(w.s.BuiltinOperator, op)
    otype = None if options is None else getattr(w.s.BuiltinOptions, type(options).__name__[:-1])
    w.output_at(layer.outputs[0], quant, f"fixed by {op}",
                lambda y: w.op(code, [x.index], [y.index], otype, options))


def _silu(w: Writer, layer: QLayer) -> None:
    """x · sigmoid(x): LOGISTIC (at its fixed quantization) and a MUL."""
    x = w.tensor(layer.inputs[0])
    sig = w.helper(f"{layer.outputs[0]}/logistic", x, w.fixed("LOGISTIC", x.dtype),
                   "fixed by LOGISTIC (SiLU's sigmoid)")
    w.op(w.s.BuiltinOperator.LOGISTIC, [x.index], [sig.index])
    y = w.tensor(layer.outputs[0])
    w.op(w.s.BuiltinOperator.MUL, [x.index, sig.index], [y.index], w.s.BuiltinOptions.MulOptions,
         w.s.MulOptionsT())


def _clip(w: Writer, layer: QLayer) -> None:
    bounds = _clip_bounds(_fragment(layer))
    op = {(0.0, np.inf): "RELU", (0.0, 6.0): "RELU6", (-1.0, 1.0): "RELU_N1_TO_1"}.get(bounds)
    if op is None:
        raise Unwritable(f"Clip{bounds} is none of RELU, RELU6, RELU_N1_TO_1")
    _unary(w, layer, op)


def _leaky_relu(w: Writer, layer: QLayer) -> None:
    """A rescale whose positive side is x itself and whose negative side is one slope."""
    a = layer.attrs
    if "axis" in a or a["factor"] != 1.0:
        raise Unwritable("a PRelu with one slope per channel has no TFLite builtin here")
    options = w.s.LeakyReluOptionsT()
    options.alpha = float(a["negative_factor"])
    _unary(w, layer, "LEAKY_RELU", options=options)


def _hard_swish(w: Writer, layer: QLayer) -> None:
    frag = _fragment(layer)
    for node in frag.graph.node if frag is not None else []:
        attrs = {a.name: helper.get_attribute_value(a) for a in node.attribute}
        if node.op_type == "HardSigmoid" and (abs(attrs.get("alpha", 0.2) - 1 / 6) > 1e-6
                                              or abs(attrs.get("beta", 0.5) - 0.5) > 1e-6):
            raise Unwritable("x · HardSigmoid(x) with other than alpha 1/6, beta 1/2")
    _unary(w, layer, "HARD_SWISH")


TABLES: dict[str, Callable[[Writer, QLayer], None]] = {
    "Sigmoid": lambda w, layer: _unary(w, layer, "LOGISTIC", fixed=True),
    "Tanh": lambda w, layer: _unary(w, layer, "TANH", fixed=True),
    "Relu": lambda w, layer: _unary(w, layer, "RELU"),
    "HardSwish": _hard_swish, "SiLU": _silu, "Clip": _clip,
}


@emitter("lut")
def table(w: Writer, layer: QLayer) -> None:
    function = layer.attrs.get("function", "")
    emit = TABLES.get(function)
    if emit is None:
        raise Unwritable(f"a {function} table has no TFLite builtin here")
    emit(w, layer)


@emitter("softmax")
def softmax(w: Writer, layer: QLayer) -> None:
    x = w.tensor(layer.inputs[0])
    axis = layer.attrs["axis"]
    if (AXIS_NHWC[axis] if x.nhwc else axis) != len(x.shape) - 1:
        raise Unwritable(f"softmax over axis {axis} (TFLite's runs over the last dimension)")
    options = w.s.SoftmaxOptionsT()
    options.beta = 1.0
    _unary(w, layer, "SOFTMAX", fixed=True, options=options)


# ---- data movement -----------------------------------------------------------------------------

def _moves(w: Writer, layer: QLayer, x: Tensor, op: str, emit) -> None:
    """A data-movement op: npubuild gives its output its input's parameters (else a QUANTIZE)."""
    w.output_at(layer.outputs[0], x.quant, f"{op} keeps its input's quantization", emit)


@emitter("concat")
def concat(w: Writer, layer: QLayer) -> None:
    y = w.tensor(layer.outputs[0])
    xs = [w.at(w.tensor(t), y.quant, f"{t}/to_concat", "CONCATENATION takes its output's "
               "quantization") for t in layer.inputs]
    axis = layer.attrs["axis"]
    options = w.s.ConcatenationOptionsT()
    options.axis = AXIS_NHWC[axis] if y.nhwc else axis
    options.fusedActivationFunction = fused_activation(w, layer, y)
    w.op(w.s.BuiltinOperator.CONCATENATION, [x.index for x in xs], [y.index],
         w.s.BuiltinOptions.ConcatenationOptions, options)


@emitter("resize")
def resize(w: Writer, layer: QLayer) -> None:
    a = layer.attrs
    if a["mode"] != "nearest":
        raise Unwritable("only nearest resizing")
    coordinates, nearest = a["coordinate_transformation_mode"], a["nearest_mode"]
    options = w.s.ResizeNearestNeighborOptionsT()
    if coordinates == "asymmetric" and nearest == "floor":
        options.alignCorners, options.halfPixelCenters = False, False
    elif coordinates in ("half_pixel", "pytorch_half_pixel", "tf_half_pixel_for_nn"):
        options.alignCorners, options.halfPixelCenters = False, True
    else:
        raise Unwritable(f"coordinate mode {coordinates} with nearest_mode {nearest}")
    x = w.tensor(layer.inputs[0])
    size = w.constant(f"{layer.outputs[0]}/size", np.array(a["output_size"], np.int32), "int32")
    _moves(w, layer, x, "RESIZE_NEAREST_NEIGHBOR", lambda y: w.op(
        w.s.BuiltinOperator.RESIZE_NEAREST_NEIGHBOR, [x.index, size], [y.index],
        w.s.BuiltinOptions.ResizeNearestNeighborOptions, options))


def transpose_tensor(w: Writer, name: str, x: Tensor, perm, nhwc: bool) -> Tensor:
    shape = [x.shape[i] for i in perm]
    out = w.helper(name, x, x.quant, "npubuild (layout)", shape=shape, nhwc=nhwc)
    _transpose_op(w, x, out, perm)
    return out


def _transpose_op(w: Writer, x: Tensor, y: Tensor, perm) -> None:
    p = w.constant(f"{w.tensors[y.index].name.decode()}/perm", np.array(perm, np.int32), "int32")
    w.op(w.s.BuiltinOperator.TRANSPOSE, [x.index, p], [y.index],
         w.s.BuiltinOptions.TransposeOptions, w.s.TransposeOptionsT())


@emitter("reshape")
def reshape(w: Writer, layer: QLayer) -> None:
    """ONNX reshapes in NCHW order: an NHWC feature map is transposed to NCHW first (unless its
    spatial size is 1), and a 4-D result is reshaped in NCHW and transposed back to NHWC."""
    x = w.tensor(layer.inputs[0])
    out_shape = list(w.qtensor(layer.outputs[0]).shape)
    if x.nhwc and not (x.shape[1] == 1 and x.shape[2] == 1):
        x = transpose_tensor(w, f"{layer.outputs[0]}/nchw_in", x, NHWC_TO_NCHW, False)
    spatial = len(out_shape) == 4 and not (out_shape[2] == 1 and out_shape[3] == 1)

    def emit(y: Tensor) -> None:
        mid = (w.helper(f"{layer.outputs[0]}/nchw", x, x.quant, "npubuild (layout)",
                        shape=out_shape, nhwc=False) if spatial else y)
        shape = w.constant(f"{layer.outputs[0]}/shape", np.array(mid.shape, np.int32), "int32")
        options = w.s.ReshapeOptionsT()
        options.newShape = list(mid.shape)
        w.op(w.s.BuiltinOperator.RESHAPE, [x.index, shape], [mid.index],
             w.s.BuiltinOptions.ReshapeOptions, options)
        if spatial:
            _transpose_op(w, mid, y, NCHW_TO_NHWC)
    _moves(w, layer, x, "RESHAPE", emit)


def _tflite_perm(perm: list[int], in_nhwc: bool, out_nhwc: bool) -> list[int]:
    """ONNX's perm (out[i] = in[perm[i]]) between TFLite layouts."""
    to_onnx_out = NCHW_TO_NHWC if out_nhwc else range(len(perm))  # TFLite dim j = ONNX dim map[j]
    onnx_to_tfl_in = {onnx: j for j, onnx in enumerate(NCHW_TO_NHWC if in_nhwc else range(len(perm)))}
    return [onnx_to_tfl_in[perm[o]] for o in to_onnx_out]


@emitter("transpose")
def transpose(w: Writer, layer: QLayer) -> None:
    x = w.tensor(layer.inputs[0])
    out_nhwc = len(w.qtensor(layer.outputs[0]).shape) == 4
    perm = _tflite_perm(list(layer.attrs["perm"]), x.nhwc, out_nhwc)
    _moves(w, layer, x, "TRANSPOSE", lambda y: _transpose_op(w, x, y, perm))


@emitter("split")
def split(w: Writer, layer: QLayer) -> None:
    x = w.tensor(layer.inputs[0])
    axis = layer.attrs["axis"]
    axis = AXIS_NHWC[axis] if x.nhwc else axis
    ys = [w.tensor(o) for o in layer.outputs]
    if any(y.quant != x.quant for y in ys):
        raise Unwritable("its outputs' quantization differs from its input's")
    sizes = w.constant(f"{layer.outputs[0]}/sizes", np.array(layer.attrs["sizes"], np.int32), "int32")
    axis_t = w.constant(f"{layer.outputs[0]}/axis", np.array(axis, np.int32), "int32")
    options = w.s.SplitVOptionsT()
    options.numSplits = len(ys)
    w.op(w.s.BuiltinOperator.SPLIT_V, [x.index, sizes, axis_t], [y.index for y in ys],
         w.s.BuiltinOptions.SplitVOptions, options)


@emitter("slice")
def slice_(w: Writer, layer: QLayer) -> None:
    a = layer.attrs
    x = w.tensor(layer.inputs[0])
    onnx_shape = [x.shape[i] for i in NHWC_TO_NCHW] if x.nhwc else list(x.shape)
    begin, end, strides = [0] * len(onnx_shape), list(onnx_shape), [1] * len(onnx_shape)
    for start, stop, axis, step in zip(a["starts"], a["ends"], a["axes"], a["steps"]):
        if step <= 0 or stop is None:
            raise Unwritable("a slice with a negative step")
        begin[axis], end[axis], strides[axis] = start, stop, step
    order = NCHW_TO_NHWC if x.nhwc else range(len(onnx_shape))
    vectors = [w.constant(f"{layer.outputs[0]}/{k}", np.array([v[i] for i in order], np.int32), "int32")
               for k, v in (("begin", begin), ("end", end), ("strides", strides))]
    _moves(w, layer, x, "STRIDED_SLICE", lambda y: w.op(
        w.s.BuiltinOperator.STRIDED_SLICE, [x.index, *vectors], [y.index],
        w.s.BuiltinOptions.StridedSliceOptions, w.s.StridedSliceOptionsT()))


@emitter("pad")
def pad(w: Writer, layer: QLayer) -> None:
    a = layer.attrs
    if a.get("mode", "constant") != "constant":
        raise Unwritable(f"{a['mode']} padding")
    x = w.tensor(layer.inputs[0])
    pads = list(a["pads"])
    rank = len(pads) // 2
    pairs = [[pads[i], pads[i + rank]] for i in range(rank)]
    if x.nhwc:
        pairs = [pairs[i] for i in NCHW_TO_NHWC]
    fill = int(a.get("value", x.quant.zero_point[0]))
    _moves(w, layer, x, "PAD", lambda y: pad_op(w, layer.outputs[0], x, y, pairs, fill))
