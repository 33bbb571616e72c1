"""Lowering rules: one ONNX op → one float layer of a quantizable kind.

``RULES[op_type](node, ctx) -> FLayer`` raises ``Unsupported(reason)`` when the node cannot be
expressed (it then stays float and runs on the CPU, with the reason in the report).
``LUT_FUNCTIONS`` are the element-wise functions that become exact lookup tables; each is
evaluated in float64 when the table is built.
"""

from __future__ import annotations

import math
from typing import Callable

import numpy as np
import onnx

from npubuild.quant.floatgraph import FLayer, Unsupported


def attr(node: onnx.NodeProto, name: str, default=None):
    for a in node.attribute:
        if a.name == name:
            value = onnx.helper.get_attribute_value(a)
            return value.decode() if isinstance(value, bytes) else value
    return default


# ---- element-wise functions (float64) ---------------------------------------------------------

def _sigmoid(x):
    from scipy.special import expit

    return expit(x)


def _softplus(x):
    return np.logaddexp(0.0, x)


def _erf(x):
    from scipy.special import erf

    return erf(x)


def _power(node, ctx):
    """``x ** e`` for one constant whole exponent (GELU's ``x³`` in its tanh form, a square):
    a function of ``x`` alone, defined on every real ``x``; a fractional or tensor exponent
    has no table."""
    exponent = ctx.const(node.input[1]) if len(node.input) > 1 else None
    if exponent is None or np.size(exponent) != 1:
        raise Unsupported("Pow with an exponent that is not one constant value")
    e = float(np.ravel(exponent)[0])
    if not e.is_integer() or e < 0:
        raise Unsupported(f"Pow to the power {e:g} (a table takes whole exponents >= 0)")
    return lambda x, e=int(e): np.power(np.asarray(x, np.float64), e)


def _gelu(node):
    if attr(node, "approximate", "none") == "tanh":
        return lambda x: 0.5 * x * (1 + np.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))
    return lambda x: 0.5 * x * (1 + _erf(x / math.sqrt(2)))


def _clip_fn(node, ctx):
    lo, hi = clip_bounds(node, ctx)
    return lambda x: np.clip(x, -np.inf if lo is None else lo, np.inf if hi is None else hi)


def clip_bounds(node, ctx) -> tuple[float | None, float | None]:
    """Clip's min and max (attributes before opset 11, constant inputs after)."""
    if ctx.opset < 11:
        return attr(node, "min", None), attr(node, "max", None)
    bounds = []
    for i in (1, 2):
        name = node.input[i] if len(node.input) > i else ""
        if not name:
            bounds.append(None)
            continue
        value = ctx.const(name)
        if value is None:
            raise Unsupported("Clip bounds are not constant")
        bounds.append(float(value))
    return bounds[0], bounds[1]


def slope_channel_axis(slope_shape, input_rank: int) -> int | None:
    """The input axis a PRelu slope varies along (it broadcasts onto the input from the right),
    or None when it is one value; Unsupported when it varies along more than one axis."""
    varying = [i for i, d in enumerate(slope_shape) if d != 1]
    if not varying:
        return None
    if len(varying) > 1 or len(slope_shape) > input_rank:
        raise Unsupported(f"PRelu slope of shape {list(slope_shape)} varies along more than one "
                          "axis: not one slope per channel")
    return input_rank - len(slope_shape) + varying[0]


def prelu(node, ctx) -> FLayer:
    """PRelu and LeakyRelu as a ``rescale`` with a negative side: ``x`` where ``x ≥ 0``, the
    slope times ``x`` elsewhere; a slope that varies along one axis (per channel, as Keras and
    MediaPipe models have it) has one negative factor per index of that axis (``attrs.axis``).
    Piecewise linear, so no table: the same kernel takes int8 and int16 inputs."""
    if node.op_type == "LeakyRelu":
        slope = np.float64(attr(node, "alpha", 0.01))
    else:
        slope = ctx.const(node.input[1])
        if slope is None:
            raise Unsupported("PRelu with a non-constant slope")
    attrs = {"function": node.op_type, "factor": 1.0}
    axis = slope_channel_axis(np.shape(slope), len(ctx.shape(node.input[0])))
    if axis is None:
        attrs["negative_factor"] = float(np.ravel(slope)[0])
    else:
        attrs.update(negative_factor=np.asarray(slope, np.float64).reshape(-1).tolist(), axis=axis)
    return _layer(node, "rescale", [node.input[0]], attrs=attrs)


LUT_FUNCTIONS: dict[str, Callable] = {
    "Sigmoid": lambda n, c: _sigmoid,
    "Tanh": lambda n, c: np.tanh,
    "Relu": lambda n, c: (lambda x: np.maximum(x, 0.0)),
    "HardSigmoid": lambda n, c: (lambda x, a=attr(n, "alpha", 0.2), b=attr(n, "beta", 0.5):
                                 np.clip(a * x + b, 0.0, 1.0)),
    "HardSwish": lambda n, c: (lambda x: x * np.clip(x / 6.0 + 0.5, 0.0, 1.0)),
    "Elu": lambda n, c: (lambda x, a=attr(n, "alpha", 1.0): np.where(x > 0, x, a * np.expm1(x))),
    "Celu": lambda n, c: (lambda x, a=attr(n, "alpha", 1.0):
                          np.maximum(x, 0) + np.minimum(0, a * np.expm1(x / a))),
    "Selu": lambda n, c: (lambda x, a=attr(n, "alpha", 1.67326319217681884765625),
                          g=attr(n, "gamma", 1.05070102214813232421875):
                          g * np.where(x > 0, x, a * np.expm1(x))),
    "ThresholdedRelu": lambda n, c: (lambda x, a=attr(n, "alpha", 1.0): np.where(x > a, x, 0.0)),
    "Softplus": lambda n, c: _softplus,
    "Softsign": lambda n, c: (lambda x: x / (1 + np.abs(x))),
    "Mish": lambda n, c: (lambda x: x * np.tanh(_softplus(x))),
    "Gelu": lambda n, c: _gelu(n),
    "Erf": lambda n, c: _erf,
    "Exp": lambda n, c: np.exp,
    "Abs": lambda n, c: np.abs,
    "Sqrt": lambda n, c: (lambda x: np.sqrt(np.maximum(x, 0.0))),
    "Reciprocal": lambda n, c: _reciprocal,
    "Clip": _clip_fn,
    "Pow": _power,
}

def silu(x):
    return x * _sigmoid(x)


def hardswish(x):
    return x * np.clip(x / 6.0 + 0.5, 0.0, 1.0)


# ---- rules ------------------------------------------------------------------------------------

def _layer(node, kind, inputs, **kw) -> FLayer:
    return FLayer(node.name, kind, list(inputs), [o for o in node.output if o],
                  source_nodes=[node.name], **kw)


def _spatial_pads(node, ctx, kernel, stride, dilation) -> list[int]:
    """ONNX pads / auto_pad → [top, bottom, left, right]."""
    auto = attr(node, "auto_pad", "NOTSET")
    if auto in ("NOTSET", "VALID"):
        p = attr(node, "pads", [0, 0, 0, 0]) if auto == "NOTSET" else [0, 0, 0, 0]
        if len(p) != 4:
            raise Unsupported("only 2-D spatial ops are supported")
        return [p[0], p[2], p[1], p[3]]
    shape = ctx.shape(node.input[0])
    out = []
    for axis in (0, 1):
        size = shape[2 + axis]
        o = -(-size // stride[axis])
        total = max(0, (o - 1) * stride[axis] + dilation[axis] * (kernel[axis] - 1) + 1 - size)
        small, big = total // 2, total - total // 2
        out += [small, big] if auto == "SAME_UPPER" else [big, small]
    return out


def _geometry(node, ctx, kernel):
    stride = list(attr(node, "strides", [1, 1]))
    dilation = list(attr(node, "dilations", [1, 1]))
    if len(kernel) != 2 or len(stride) != 2:
        raise Unsupported("only 2-D spatial ops are supported")
    return {"kernel": list(kernel), "stride": stride, "dilation": dilation,
            "pads": _spatial_pads(node, ctx, kernel, stride, dilation)}


def conv(node, ctx) -> FLayer:
    w = ctx.const(node.input[1])
    if w is None:
        raise Unsupported("Conv weights are not constant")
    if w.ndim != 4:
        raise Unsupported(f"only 2-D convolutions are supported (weight rank {w.ndim})")
    bias = ctx.const(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros(w.shape[0])
    if bias is None:
        raise Unsupported("Conv bias is not constant")
    attrs = _geometry(node, ctx, list(attr(node, "kernel_shape", w.shape[2:])))
    attrs["group"] = int(attr(node, "group", 1))
    return _layer(node, "conv", [node.input[0]], attrs=attrs,
                  weights={"weight": w.astype(np.float64), "bias": bias.astype(np.float64)})


def gemm(node, ctx) -> FLayer:
    b = ctx.const(node.input[1])
    if b is None or attr(node, "transA", 0):
        raise Unsupported("Gemm needs a constant B and transA = 0")
    w = ctx.fc_weight(node.input[1], bool(attr(node, "transB", 0)), attr(node, "alpha", 1.0))
    c = ctx.const(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros(1)
    if c is None:
        raise Unsupported("Gemm C is not constant")
    bias = np.broadcast_to(np.ravel(c) * attr(node, "beta", 1.0), (w.shape[0],))
    return _fc(node, node.input[0], w, bias)


def matmul(node, ctx) -> FLayer:
    """A constant 2-D right operand: a fully connected layer; two activations (attention's
    Q·Kᵀ and weights·V): a ``matmul`` of their integers, batch dimensions broadcast as ONNX's
    MatMul does."""
    a, b = (ctx.const(i) for i in node.input[:2])
    if b is not None and a is None and b.ndim == 2:
        return _fc(node, node.input[0], ctx.fc_weight(node.input[1], False, 1.0),
                   np.zeros(b.shape[1]))
    if a is None and b is None:
        return _layer(node, "matmul", [node.input[0], node.input[1]])
    raise Unsupported("MatMul takes two activations or a constant 2-D right operand")


def _fc(node, x, w, bias) -> FLayer:
    """``w``: [out, in, 1, 1] float64 (`lower.Context.fc_weight`)."""
    return _layer(node, "conv", [x], attrs={"fc": True, "group": 1, "kernel": [1, 1],
                                            "stride": [1, 1], "dilation": [1, 1], "pads": [0, 0, 0, 0]},
                  weights={"weight": w, "bias": np.asarray(bias, np.float64)})


def batchnorm(node, ctx) -> FLayer:
    params = [ctx.const(n) for n in node.input[1:5]]
    if any(p is None for p in params) or len(ctx.shape(node.input[0])) != 4:
        raise Unsupported("BatchNormalization needs constant parameters and a 4-D input")
    gamma, beta, mean, var = (np.asarray(p, np.float64) for p in params)
    scale = gamma / np.sqrt(var + attr(node, "epsilon", 1e-5))
    c = scale.size
    return _layer(node, "conv", [node.input[0]],
                  attrs={"group": c, "kernel": [1, 1], "stride": [1, 1], "dilation": [1, 1],
                         "pads": [0, 0, 0, 0], "batchnorm": True},
                  weights={"weight": scale.reshape(c, 1, 1, 1), "bias": beta - mean * scale})


def _scalar(value) -> float | None:
    if value is None:
        return None
    flat = np.ravel(value)
    return float(flat[0]) if flat.size and np.all(flat == flat[0]) else None


def add_sub(node, ctx) -> FLayer:
    ins = [i for i in node.input if i]
    if len(ins) != 2:
        raise Unsupported(f"{node.op_type} of {len(ins)} inputs")
    if all(ctx.const(i) is not None for i in ins):
        raise Unsupported("both operands are constant")
    return _layer(node, "add", ins, attrs={"sub": node.op_type == "Sub"})


def mul(node, ctx) -> FLayer:
    a, b = node.input[0], node.input[1]
    for x, c in ((a, b), (b, a)):
        k = _scalar(ctx.const(c))
        if k is not None and ctx.const(x) is None and ctx.shape(x) == ctx.shape(node.output[0]):
            return _layer(node, "rescale", [x], attrs={"factor": k})
    return _layer(node, "mul", [a, b])


def _reciprocal(x):
    with np.errstate(divide="ignore"):
        return 1.0 / np.asarray(x, np.float64)


def div(node, ctx) -> FLayer:
    """By a constant: a rescale (a scalar) or a product by its reciprocal. A constant of one
    value over a tensor (T5's RMS norm: ``1 / Sqrt(mean(x²) + eps)``) is a function of that
    tensor alone, so a table, as Reciprocal is; a tensor over a tensor has no kernel."""
    c = ctx.const(node.input[1])
    if c is None:
        k = _scalar(ctx.const(node.input[0]))
        if k is None or ctx.shape(node.input[1]) != ctx.shape(node.output[0]):
            raise Unsupported("division by a tensor that is not constant")
        return _layer(node, "lut", [node.input[1]], fn=lambda x, k=k: k * _reciprocal(x),
                      attrs={"function": node.op_type})
    k = _scalar(c)
    if k is not None and ctx.shape(node.input[0]) == ctx.shape(node.output[0]):
        return _layer(node, "rescale", [node.input[0]], attrs={"factor": 1.0 / k})
    inv = ctx.add_constant(node.output[0] + "::reciprocal", 1.0 / np.asarray(c, np.float64))
    return _layer(node, "mul", [node.input[0], inv])


def neg(node, ctx) -> FLayer:
    return _layer(node, "rescale", [node.input[0]], attrs={"factor": -1.0})


def concat(node, ctx) -> FLayer:
    rank = len(ctx.shape(node.output[0]))
    return _layer(node, "concat", list(node.input), attrs={"axis": attr(node, "axis") % rank})


def maxpool(node, ctx) -> FLayer:
    if len([o for o in node.output if o]) > 1:
        raise Unsupported("MaxPool with an indices output")
    attrs = _geometry(node, ctx, list(attr(node, "kernel_shape")))
    _ceil_pads(node, ctx, attrs)
    return _layer(node, "maxpool", [node.input[0]], attrs=attrs)


def averagepool(node, ctx) -> FLayer:
    attrs = _geometry(node, ctx, list(attr(node, "kernel_shape")))
    attrs["count_include_pad"] = int(attr(node, "count_include_pad", 0))
    if attr(node, "ceil_mode", 0) and attrs["count_include_pad"]:
        raise Unsupported("AveragePool with ceil_mode and count_include_pad")
    _ceil_pads(node, ctx, attrs)
    return _layer(node, "avgpool", [node.input[0]], attrs=attrs)


def _ceil_pads(node, ctx, attrs) -> None:
    """ceil_mode as extra bottom/right padding, from the real output size."""
    h, w = ctx.shape(node.input[0])[2:]
    oh, ow = ctx.shape(node.output[0])[2:]
    (kh, kw), (sh, sw), (dh, dw) = attrs["kernel"], attrs["stride"], attrs["dilation"]
    p = attrs["pads"]
    p[1] += max(0, (oh - 1) * sh + dh * (kh - 1) + 1 - (h + p[0] + p[1]))
    p[3] += max(0, (ow - 1) * sw + dw * (kw - 1) + 1 - (w + p[2] + p[3]))


def global_pool(node, ctx) -> FLayer:
    if len(ctx.shape(node.input[0])) != 4:
        raise Unsupported("global pooling of a tensor that is not 4-D")
    kind = "maxpool" if node.op_type == "GlobalMaxPool" else "avgpool"  # or a ReduceMean
    h, w = ctx.shape(node.input[0])[2:]
    return _layer(node, kind, [node.input[0]],
                  attrs={"global": True, "kernel": [h, w], "stride": [1, 1], "dilation": [1, 1],
                         "pads": [0, 0, 0, 0], "count_include_pad": 0})


def reduce_mean(node, ctx) -> FLayer:
    """The mean over H and W of a 4-D tensor, dimensions kept, is a global average pool:
    Paddle exports write their squeeze-excite means so (PP-OCRv6's detector and recognizer:
    5 ReduceMeans, each a CPU hop between NPU segments without this rule)."""
    shape = ctx.shape(node.input[0])
    axes = attr(node, "axes", None)
    if axes is None and len(node.input) > 1 and node.input[1]:
        axes = ctx.const(node.input[1])
        if axes is None:
            raise Unsupported("ReduceMean axes that are not a constant")
    if axes is None or len(shape) != 4 or not attr(node, "keepdims", 1):
        raise Unsupported("ReduceMean other than over H and W of a 4-D tensor, dimensions kept")
    if sorted(int(a) % 4 for a in np.ravel(axes)) != [2, 3]:
        raise Unsupported("ReduceMean other than over H and W of a 4-D tensor, dimensions kept")
    return global_pool(node, ctx)


def resize(node, ctx) -> FLayer:
    ins, outs = ctx.shape(node.input[0]), ctx.shape(node.output[0])
    if len(ins) != 4 or ins[:2] != outs[:2]:
        raise Unsupported("Resize must keep N and C of a 4-D tensor")
    mode = attr(node, "mode", "nearest")
    if node.op_type == "Upsample":
        ctm, nearest = "asymmetric", "floor"
    else:
        ctm = attr(node, "coordinate_transformation_mode", "half_pixel")
        nearest = attr(node, "nearest_mode", "round_prefer_floor")
    if mode not in ("nearest", "linear", "bilinear") or attr(node, "antialias", 0):
        raise Unsupported(f"Resize mode {mode!r}")
    if ctm == "tf_crop_and_resize":
        raise Unsupported("Resize tf_crop_and_resize")
    return _layer(node, "resize", [node.input[0]], attrs={
        "mode": "nearest" if mode == "nearest" else "linear",
        "coordinate_transformation_mode": ctm, "nearest_mode": nearest,
        "input_size": list(ins[2:]), "output_size": list(outs[2:])})


def reshape(node, ctx) -> FLayer:
    return _layer(node, "reshape", [node.input[0]], attrs={"shape": list(ctx.shape(node.output[0]))})


def transpose(node, ctx) -> FLayer:
    rank = len(ctx.shape(node.input[0]))
    perm = attr(node, "perm", list(range(rank))[::-1])
    return _layer(node, "transpose", [node.input[0]], attrs={"perm": list(perm)})


def depth_to_space(node, ctx) -> FLayer:
    """A pixel shuffle: channel blocks moved to the spatial grid (mode CRD or DCR), no
    arithmetic, so the output keeps the input's scale and zero point."""
    if len(ctx.shape(node.input[0])) != 4:
        raise Unsupported("DepthToSpace of a tensor that is not 4-D")
    return _layer(node, "depth_to_space", [node.input[0]],
                  attrs={"blocksize": int(attr(node, "blocksize")),
                         "mode": str(attr(node, "mode", "DCR"))})


def slice_(node, ctx) -> FLayer:
    shape = ctx.shape(node.input[0])
    if ctx.opset < 10:
        starts, ends = attr(node, "starts"), attr(node, "ends")
        axes, steps = attr(node, "axes", list(range(len(starts)))), [1] * len(starts)
    else:
        starts, ends = _const_input(node, ctx, 1), _const_input(node, ctx, 2)
        axes, steps = _const_input(node, ctx, 3), _const_input(node, ctx, 4)
        if starts is None or ends is None:
            raise Unsupported("Slice without constant starts and ends")
        starts, ends = starts.tolist(), ends.tolist()
        axes = axes.tolist() if axes is not None else list(range(len(starts)))
        steps = steps.tolist() if steps is not None else [1] * len(starts)
    norm = [_slice_bounds(s, e, st, shape[a % len(shape)])
            for s, e, st, a in zip(starts, ends, steps, axes)]
    return _layer(node, "slice", [node.input[0]], attrs={
        "starts": [n[0] for n in norm], "ends": [n[1] for n in norm],
        "axes": [a % len(shape) for a in axes], "steps": [int(s) for s in steps]})


def _const_input(node, ctx, i: int):
    if len(node.input) <= i or not node.input[i]:
        return None
    value = ctx.const(node.input[i])
    if value is None:
        raise Unsupported(f"{node.op_type} input {i} is not constant")
    return np.asarray(value)


def _slice_bounds(start: int, end: int, step: int, dim: int) -> tuple[int, int | None]:
    start = start + dim if start < 0 else start
    end = end + dim if end < 0 else end
    if step > 0:
        return int(min(max(start, 0), dim)), int(min(max(end, 0), dim))
    start, end = int(min(max(start, 0), dim - 1)), int(min(max(end, -1), dim - 1))
    return start, (None if end < 0 else end)


def split(node, ctx) -> FLayer:
    rank = len(ctx.shape(node.input[0]))
    axis = attr(node, "axis", 0) % rank
    sizes = [ctx.shape(o)[axis] for o in node.output]
    return _layer(node, "split", [node.input[0]], attrs={"axis": axis, "sizes": sizes})


def identity(node, ctx) -> FLayer:
    if node.op_type == "Cast" and attr(node, "to") != onnx.TensorProto.FLOAT:
        raise Unsupported("Cast to a type other than float")
    return FLayer(node.name, "reshape", [node.input[0]], [node.output[0]],
                  attrs={"shape": list(ctx.shape(node.output[0]))}, source_nodes=[node.name])


def pad(node, ctx) -> FLayer:
    mode = attr(node, "mode", "constant")
    if ctx.opset < 11:
        pads, value = attr(node, "pads"), attr(node, "value", 0.0)
    else:
        pads = ctx.const(node.input[1])
        value = ctx.const(node.input[2]) if len(node.input) > 2 and node.input[2] else np.zeros(1)
        if pads is None or value is None or (len(node.input) > 3 and node.input[3]):
            raise Unsupported("Pad parameters are not constant (or axes are given)")
        pads, value = np.asarray(pads).tolist(), float(np.ravel(value)[0])
    if mode not in ("constant", "edge", "reflect"):
        raise Unsupported(f"Pad mode {mode!r}")
    if mode == "constant" and not np.isfinite(value):  # a mask for a max or softmax after it
        raise Unsupported(f"Pad value {value:g}: no integer stands for it")
    return _layer(node, "pad", [node.input[0]], attrs={"pads": [int(p) for p in pads],
                                                       "mode": mode, "value_real": value})


def softmax(node, ctx) -> FLayer:
    """Softmax along one axis (opset ≥ 13; before, along one axis only when it is the last)."""
    rank = len(ctx.shape(node.input[0]))
    axis = attr(node, "axis", -1 if ctx.opset >= 13 else 1)
    axis = axis + rank if axis < 0 else axis
    if ctx.opset < 13 and axis != rank - 1:
        raise Unsupported(f"Softmax (opset {ctx.opset}) over axes {axis}.. of a rank-{rank} "
                          "tensor: not one axis")
    return _layer(node, "softmax", [node.input[0]], attrs={"axis": axis})


def layer_norm(node, ctx) -> FLayer:
    """LayerNormalization over the trailing axes from ``axis``, with a constant Scale (and B):
    the ``layernorm`` kind. Its Mean and InvStdDev outputs (training) have no kernel."""
    if any(node.output[1:]):
        raise Unsupported("LayerNormalization with its Mean or InvStdDev output read")
    shape = ctx.shape(node.input[0])
    if shape is None or not all(isinstance(d, int) for d in shape):
        raise Unsupported("LayerNormalization of a tensor without a static shape")
    axis = attr(node, "axis", -1)
    axis = axis + len(shape) if axis < 0 else axis
    normalized = list(shape[axis:])
    gain = _const_input(node, ctx, 1)
    offset = _const_input(node, ctx, 2)
    try:
        gain = np.broadcast_to(np.asarray(gain, np.float64), normalized).reshape(-1)
        offset = (np.zeros_like(gain) if offset is None else
                  np.broadcast_to(np.asarray(offset, np.float64), normalized).reshape(-1))
    except ValueError:
        raise Unsupported("a Scale or B that does not broadcast to the normalized axes") from None
    return _layer(node, "layernorm", [node.input[0]],
                  attrs={"axis": axis, "epsilon": float(attr(node, "epsilon", 1e-5))},
                  weights={"scale": gain, "bias": offset})


def rms_norm(node, ctx) -> FLayer:
    """RMSNormalization over the trailing axes from ``axis`` with a constant Scale: the
    ``layernorm`` kind with ``rms`` (no mean subtracted; the row's sum of squares exact)."""
    shape = ctx.shape(node.input[0])
    if shape is None or not all(isinstance(d, int) for d in shape):
        raise Unsupported("RMSNormalization of a tensor without a static shape")
    layer = layer_norm(node, ctx)
    layer.attrs["rms"] = True
    return layer


def lrn(node, ctx) -> FLayer:
    """LRN (AlexNet, GoogLeNet, ZFNet): each value over a power of its channel window's sum of
    squares, the ``lrn`` kind."""
    if len(ctx.shape(node.input[0])) != 4:
        raise Unsupported("LRN of a tensor that is not 4-D")
    return _layer(node, "lrn", [node.input[0]], attrs={
        "size": int(attr(node, "size")), "alpha": float(attr(node, "alpha", 1e-4)),
        "beta": float(attr(node, "beta", 0.75)), "bias": float(attr(node, "bias", 1.0))})


def lut(node, ctx) -> FLayer:
    fn = LUT_FUNCTIONS[node.op_type](node, ctx)
    return _layer(node, "lut", [node.input[0]], fn=fn, attrs={"function": node.op_type})


def extremum(node, ctx) -> FLayer:
    """Max or Min of one tensor and constants of a single value (TensorFlow's
    ``tf.maximum(x, -0.4)`` after a LeakyReLU, a threshold): a function of that tensor alone,
    so a lookup table, built like every table from the node itself (the constant in any
    operand position). Of two tensors there is no integer kernel."""
    operands = [i for i in node.input if i]
    tensors = [i for i in operands if ctx.const(i) is None]
    if len(tensors) != 1:
        raise Unsupported(f"{len(tensors)} tensor operands (a table takes one tensor and "
                          "constants)")
    values = np.concatenate([np.ravel(ctx.const(i)) for i in operands if i not in tensors] or
                            [np.zeros(0)])
    if values.size and not np.all(values == values[0]):
        raise Unsupported("a constant operand of more than one value")
    if ctx.shape(tensors[0]) != ctx.shape(node.output[0]):
        raise Unsupported("a constant operand that broadcasts the tensor to another shape")
    pick = np.maximum if node.op_type == "Max" else np.minimum
    fn = (lambda x: np.asarray(x, np.float64)) if not values.size else (
        lambda x, c=float(values[0]): pick(x, c))
    return _layer(node, "lut", tensors, fn=fn, attrs={"function": node.op_type})


def integer_io(node, ctx) -> FLayer:
    """A model's integer input conversion ``DequantizeLinear(x, s, z)`` or output conversion
    ``QuantizeLinear(y, s, z)`` (int8, a constant scalar scale and zero point: a full-integer
    TFLite export's, placed on the NPU by `split.plan.integer_io`) as a ``rescale``: the int8
    tensor holds integers (scale 1, zero point 0, `quant.quantizer`), so the input's is
    ``s · (x - z)`` (``input_offset``) and the output's ``y / s + z`` (``divisor``,
    ``output_offset``), each the identity on the integers where the float side takes
    ``(s, z)`` as its own parameters."""
    values = [ctx.const(i) if i else None for i in node.input[1:3]]
    if len(node.input) < 3 or any(v is None or np.size(v) != 1 for v in values):
        raise Unsupported(f"{node.op_type} without a constant scalar scale and zero point")
    scale, zero = values
    if np.asarray(zero).dtype != np.int8 or not float(np.ravel(scale)[0]) > 0:
        raise Unsupported(f"{node.op_type} of another type than int8")
    s, z = float(np.ravel(scale)[0]), int(np.ravel(zero)[0])
    if node.op_type == "DequantizeLinear":
        return _layer(node, "rescale", [node.input[0]],
                      attrs={"factor": s, "input_offset": z, "integer_io": "input"})
    return _layer(node, "rescale", [node.input[0]],
                  attrs={"factor": 1.0 / s, "divisor": s, "output_offset": z,
                         "integer_io": "output"})


RULES: dict[str, Callable] = {
    "DequantizeLinear": integer_io, "QuantizeLinear": integer_io,
    "Conv": conv, "Gemm": gemm, "MatMul": matmul, "BatchNormalization": batchnorm,
    "Add": add_sub, "Sub": add_sub, "Sum": add_sub, "Mul": mul, "Div": div, "Neg": neg,
    "Concat": concat, "MaxPool": maxpool, "AveragePool": averagepool,
    "GlobalAveragePool": global_pool, "GlobalMaxPool": global_pool, "ReduceMean": reduce_mean,
    "Resize": resize, "Upsample": resize,
    "Reshape": reshape, "Flatten": reshape, "Squeeze": reshape, "Unsqueeze": reshape,
    "Transpose": transpose, "DepthToSpace": depth_to_space, "Slice": slice_, "Split": split, "Pad": pad,
    "Identity": identity, "Dropout": identity, "Cast": identity,
    **{op: lut for op in LUT_FUNCTIONS},
    "PRelu": prelu, "LeakyRelu": prelu, "Softmax": softmax, "Max": extremum, "Min": extremum,
    "LayerNormalization": layer_norm, "RMSNormalization": rms_norm, "LRN": lrn,
}
