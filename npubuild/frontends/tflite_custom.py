"""TFLite custom ops npubuild lowers to ONNX: MediaPipe's segmentation ops.

MediaPipe models (selfie and hair segmentation, and others built with its converter) use three
custom ops that TensorFlow Lite's own interpreter and tf2onnx do not know. Each entry of
`CUSTOM_OPS` gives, for one op:

- `fields`: its parameters, the leading int32 fields of the C struct MediaPipe stores as the
  op's custom options (``TfLiteTransposeConvParams`` or ``TfLitePoolParams`` of the builtin op
  it extends; not a flexbuffer, so tf2onnx cannot read them, and `tflite_graph` rewrites them);
- `lower`: a tf2onnx handler that writes the op as standard ONNX ops (NHWC in and out, as
  tf2onnx's TFLite graph is; its transpose optimizer removes what cancels);
- `reference`: the op in numpy, written from MediaPipe's kernels
  (``mediapipe/util/tflite/operations/*.cc``). The import proof runs the source model with the
  TFLite interpreter around the custom ops and this reference for them, since the interpreter
  cannot run them.

tf2onnx is imported inside `register_handlers` only.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Callable

import numpy as np

# TfLitePadding and TfLiteFusedActivation, as the C structs store them
PADDING = {1: "SAME", 2: "VALID"}
ACTIVATION_RANGE = {0: None, 1: (0.0, None), 2: (-1.0, 1.0), 3: (0.0, 6.0)}


# The leading int32 fields of the C structs MediaPipe stores as custom options
TRANSPOSE_CONV_PARAMS = ("padding", "stride_w", "stride_h")  # TfLiteTransposeConvParams
POOL_PARAMS = ("padding", "stride_w", "stride_h", "filter_w", "filter_h", "activation")  # TfLitePoolParams


@dataclass(frozen=True)
class CustomOp:
    """One custom op: its options' C struct fields, its lowering and its numpy reference."""

    name: str
    fields: tuple[str, ...]
    reference: Callable[..., list[np.ndarray]]  # (*inputs, options) -> outputs
    lower: Callable  # (tf2onnx graph, tf2onnx node, options) -> None

    def options(self, raw: bytes) -> dict:
        """The options from the op's custom-options bytes; ValueError when they do not fit."""
        if len(raw) < 4 * len(self.fields):  # later TFLite versions append fields: ignored
            raise ValueError(f"its custom options hold {len(raw)} bytes, expected at least "
                             f"{4 * len(self.fields)} ({', '.join(self.fields)})")
        values = dict(zip(self.fields, struct.unpack_from(f"<{len(self.fields)}i", raw)))
        if values["padding"] not in PADDING:
            raise ValueError(f"unknown padding {values['padding']} in its options")
        if values.get("activation", 0) not in ACTIVATION_RANGE:
            raise ValueError(f"unsupported fused activation {values['activation']}")
        return values


# --- the ops' geometry, shared by the references and the lowerings ---------------------------


def transpose_conv_pads(size: int, kernel: int, stride: int, padding: int) -> tuple[int, int]:
    """(before, after) padding of a transposed conv along one axis, as TFLite's kernel takes it:
    the output is ``stride*(size-1) + kernel - total``, cropped ``total // 2`` at the start."""
    total = max(0, kernel - (size - 1) % stride - 1) if PADDING[padding] == "SAME" else 0
    return total // 2, total - total // 2


def pool_output_size(size: int, kernel: int, stride: int, padding: int) -> int:
    """TensorFlow's windowed output size (``GetWindowedOutputSize``)."""
    if PADDING[padding] == "SAME":
        return (size + stride - 1) // stride
    return (size - kernel + stride) // stride


def compute_padding(stride: int, size: int, kernel: int, out: int) -> int:
    """TFLite's ``ComputePadding`` (dilation 1): the leading padding, C++ division."""
    return max(int(((out - 1) * stride + kernel - size) / 2), 0)


def unpool_geometry(height: int, width: int, opts: dict) -> tuple[int, int, int, int]:
    """MaxUnpooling2D's output size (input size × filter size) and leading padding."""
    out_h, out_w = height * opts["filter_h"], width * opts["filter_w"]
    return (out_h, out_w, compute_padding(opts["stride_h"], out_h, opts["filter_h"], height),
            compute_padding(opts["stride_w"], out_w, opts["filter_w"], width))


# --- numpy references (NHWC float32, as the kernels) ------------------------------------------


def transpose_conv_bias(x: np.ndarray, weights: np.ndarray, bias: np.ndarray,
                        opts: dict) -> list[np.ndarray]:
    """``Convolution2DTransposeBias``: a transposed conv with OHWI weights, plus the bias."""
    batch, height, width, _ = x.shape
    out_c, k_h, k_w, _ = weights.shape
    (top, bottom), (left, right) = (
        transpose_conv_pads(height, k_h, opts["stride_h"], opts["padding"]),
        transpose_conv_pads(width, k_w, opts["stride_w"], opts["padding"]))
    full_h, full_w = opts["stride_h"] * (height - 1) + k_h, opts["stride_w"] * (width - 1) + k_w
    full = np.zeros((batch, full_h, full_w, out_c), np.float64)
    for fy in range(k_h):
        for fx in range(k_w):
            # every input pixel adds x · W[:, fy, fx, :] at (stride·y + fy, stride·x + fx)
            contribution = np.einsum("nhwi,oi->nhwo", x.astype(np.float64), weights[:, fy, fx, :])
            full[:, fy:fy + opts["stride_h"] * (height - 1) + 1:opts["stride_h"],
                 fx:fx + opts["stride_w"] * (width - 1) + 1:opts["stride_w"], :] += contribution
    out = full[:, top:full_h - bottom, left:full_w - right, :] + bias
    return [out.astype(np.float32)]


def max_pool_with_argmax(x: np.ndarray, opts: dict) -> list[np.ndarray]:
    """``MaxPoolingWithArgmax2D``: max pooling, and per output the position of the first
    maximum inside its window (``y * filter_w + x``) as float32 plus 0.1."""
    batch, height, width, channels = x.shape
    k_h, k_w, s_h, s_w = opts["filter_h"], opts["filter_w"], opts["stride_h"], opts["stride_w"]
    out_h = pool_output_size(height, k_h, s_h, opts["padding"])
    out_w = pool_output_size(width, k_w, s_w, opts["padding"])
    pad_h, pad_w = compute_padding(s_h, height, k_h, out_h), compute_padding(s_w, width, k_w, out_w)
    values = np.zeros((batch, out_h, out_w, channels), np.float32)
    where = np.zeros_like(values)
    for oy in range(out_h):
        for ox in range(out_w):
            best = np.full((batch, channels), np.finfo(np.float32).min, np.float32)
            arg = np.zeros((batch, channels), np.int64)
            for fy in range(k_h):
                for fx in range(k_w):
                    iy, ix = oy * s_h - pad_h + fy, ox * s_w - pad_w + fx
                    if 0 <= iy < height and 0 <= ix < width:
                        larger = x[:, iy, ix, :] > best  # strictly: the first maximum wins
                        best = np.where(larger, x[:, iy, ix, :], best)
                        arg = np.where(larger, fy * k_w + fx, arg)
            values[:, oy, ox, :], where[:, oy, ox, :] = best, arg + np.float32(0.1)
    low, high = ACTIVATION_RANGE[opts["activation"]] or (None, None)
    return [np.clip(values, low, high) if (low, high) != (None, None) else values, where]


def max_unpooling(x: np.ndarray, indices: np.ndarray, opts: dict) -> list[np.ndarray]:
    """``MaxUnpooling2D``: each value goes back to the window position its index names
    (``int(index)`` = ``y * filter_w + x``); the rest of the output is zero."""
    batch, height, width, channels = x.shape
    out_h, out_w, pad_h, pad_w = unpool_geometry(height, width, opts)
    out = np.zeros((batch, out_h, out_w, channels), np.float32)
    index = np.trunc(indices).astype(np.int64)
    n, c = np.arange(batch)[:, None], np.arange(channels)[None, :]
    for iy in range(height):  # in the kernel's loop order: a later write wins
        for ix in range(width):
            oy = iy * opts["stride_h"] - pad_h + index[:, iy, ix, :] // opts["filter_w"]
            ox = ix * opts["stride_w"] - pad_w + index[:, iy, ix, :] % opts["filter_w"]
            inside = (oy >= 0) & (oy < out_h) & (ox >= 0) & (ox < out_w)
            nn, cc = np.broadcast_to(n, inside.shape)[inside], np.broadcast_to(c, inside.shape)[inside]
            out[nn, oy[inside], ox[inside], cc] = x[:, iy, ix, :][inside]
    return [out]


# --- lowerings: tf2onnx handlers writing standard ONNX ops -----------------------------------


def _replace(ctx, node, outputs: list[str]) -> None:
    """Make the values `outputs` carry the custom node's output names, then drop the node."""
    names, shapes, dtypes = list(node.output), node.output_shapes, node.output_dtypes
    ctx.remove_node(node.name)
    for name, value, shape, dtype in zip(names, outputs, shapes, dtypes):
        ctx.make_node("Identity", [value], outputs=[name], shapes=[shape], dtypes=[dtype])


def _nchw(ctx, value: str) -> str:
    return ctx.make_node("Transpose", [value], attr={"perm": [0, 3, 1, 2]}).output[0]


def _nhwc(ctx, value: str) -> str:
    return ctx.make_node("Transpose", [value], attr={"perm": [0, 2, 3, 1]}).output[0]


def _input_shape(ctx, node, index: int = 0) -> list[int]:
    shape = ctx.get_shape(node.input[index])
    if shape is None or any(d is None or d < 0 for d in shape[1:]):
        raise ValueError(f"{node.type} needs a static input shape, got {shape}")
    return list(shape)


def lower_transpose_conv_bias(ctx, node, opts: dict) -> None:
    """ConvTranspose (NCHW, weights OHWI → I,O,H,W) with the bias, pads as TFLite crops."""
    _, height, width, _ = _input_shape(ctx, node)
    _, k_h, k_w, _ = ctx.get_shape(node.input[1])
    top, bottom = transpose_conv_pads(height, k_h, opts["stride_h"], opts["padding"])
    left, right = transpose_conv_pads(width, k_w, opts["stride_w"], opts["padding"])
    weights = ctx.make_node("Transpose", [node.input[1]], attr={"perm": [3, 0, 1, 2]}).output[0]
    conv = ctx.make_node("ConvTranspose", [_nchw(ctx, node.input[0]), weights, node.input[2]],
                         attr={"kernel_shape": [k_h, k_w], "pads": [top, left, bottom, right],
                               "strides": [opts["stride_h"], opts["stride_w"]]})
    _replace(ctx, node, [_nhwc(ctx, conv.output[0])])


def _const(ctx, name: str, value: np.ndarray) -> str:
    from tf2onnx import utils

    return ctx.make_const(utils.make_name(name), value).output[0]


def lower_max_pool_with_argmax(ctx, node, opts: dict) -> None:
    """MaxPool with its Indices output; the flat NCHW index becomes the position inside the
    window (``(y - y0) * filter_w + (x - x0)``, y0/x0 the window's origin) plus 0.1."""
    _, height, width, _ = _input_shape(ctx, node)
    k_h, k_w, s_h, s_w = opts["filter_h"], opts["filter_w"], opts["stride_h"], opts["stride_w"]
    out_h = pool_output_size(height, k_h, s_h, opts["padding"])
    out_w = pool_output_size(width, k_w, s_w, opts["padding"])
    pad_h, pad_w = compute_padding(s_h, height, k_h, out_h), compute_padding(s_w, width, k_w, out_w)
    pads = [pad_h, pad_w, max(0, (out_h - 1) * s_h + k_h - height - pad_h),
            max(0, (out_w - 1) * s_w + k_w - width - pad_w)]
    pool = ctx.make_node("MaxPool", [_nchw(ctx, node.input[0])], output_count=2,
                         attr={"kernel_shape": [k_h, k_w], "strides": [s_h, s_w], "pads": pads})
    values = pool.output[0]
    low, high = ACTIVATION_RANGE[opts["activation"]] or (None, None)
    if (low, high) != (None, None):
        bounds = [_const(ctx, "clip", np.array(b, np.float32)) if b is not None else ""
                  for b in (low, high)]
        values = ctx.make_node("Clip", [values, *bounds]).output[0]
    flat = ctx.make_node("Mod", [pool.output[1], _const(ctx, "hw", np.array(height * width))])
    row = ctx.make_node("Div", [flat.output[0], _const(ctx, "w", np.array(width))])
    col = ctx.make_node("Mod", [flat.output[0], _const(ctx, "w", np.array(width))])
    y0 = (np.arange(out_h) * s_h - pad_h).reshape(1, 1, out_h, 1)
    x0 = (np.arange(out_w) * s_w - pad_w).reshape(1, 1, 1, out_w)
    dy = ctx.make_node("Sub", [row.output[0], _const(ctx, "y0", y0.astype(np.int64))])
    dx = ctx.make_node("Sub", [col.output[0], _const(ctx, "x0", x0.astype(np.int64))])
    scaled = ctx.make_node("Mul", [dy.output[0], _const(ctx, "fw", np.array(k_w))])
    window = ctx.make_node("Add", [scaled.output[0], dx.output[0]])
    as_float = ctx.make_node("Cast", [window.output[0]], attr={"to": 1})  # FLOAT
    where = ctx.make_node("Add", [as_float.output[0], _const(ctx, "tenth", np.array(0.1, np.float32))])
    _replace(ctx, node, [_nhwc(ctx, values), _nhwc(ctx, where.output[0])])


def lower_max_unpooling(ctx, node, opts: dict) -> None:
    """ScatterElements into a flat zero output with one spare slot at its end: an index outside
    the output (the kernel skips those) is sent to the spare slot, which is then sliced off."""
    batch, height, width, channels = _input_shape(ctx, node)
    out_h, out_w, pad_h, pad_w = unpool_geometry(height, width, opts)
    size = batch * out_h * out_w * channels
    index = ctx.make_node("Cast", [node.input[1]], attr={"to": 7}).output[0]  # INT64, truncating
    fw = _const(ctx, "fw", np.array(opts["filter_w"]))
    dy = ctx.make_node("Div", [index, fw]).output[0]
    dx = ctx.make_node("Mod", [index, fw]).output[0]
    y0 = (np.arange(height) * opts["stride_h"] - pad_h).reshape(1, height, 1, 1)
    x0 = (np.arange(width) * opts["stride_w"] - pad_w).reshape(1, 1, width, 1)
    oy = ctx.make_node("Add", [dy, _const(ctx, "y0", y0.astype(np.int64))]).output[0]
    ox = ctx.make_node("Add", [dx, _const(ctx, "x0", x0.astype(np.int64))]).output[0]
    base = (np.arange(batch).reshape(batch, 1, 1, 1) * out_h * out_w * channels
            + np.arange(channels).reshape(1, 1, 1, channels))
    pos = ctx.make_node("Mul", [oy, _const(ctx, "row", np.array(out_w * channels))]).output[0]
    pos = ctx.make_node("Add", [pos, ctx.make_node(
        "Mul", [ox, _const(ctx, "col", np.array(channels))]).output[0]]).output[0]
    pos = ctx.make_node("Add", [pos, _const(ctx, "base", base.astype(np.int64))]).output[0]
    inside = _all(ctx, [_compare(ctx, "GreaterOrEqual", oy, 0), _compare(ctx, "Less", oy, out_h),
                        _compare(ctx, "GreaterOrEqual", ox, 0), _compare(ctx, "Less", ox, out_w)])
    target = ctx.make_node("Where", [inside, pos, _const(ctx, "spare", np.array(size))]).output[0]
    flat_shape = _const(ctx, "flat", np.array([-1], np.int64))
    scatter = ctx.make_node("ScatterElements", [
        _const(ctx, "zeros", np.zeros(size + 1, np.float32)),
        ctx.make_node("Reshape", [target, flat_shape]).output[0],
        ctx.make_node("Reshape", [node.input[0], flat_shape]).output[0]], attr={"axis": 0})
    kept = ctx.make_node("Slice", [scatter.output[0], _const(ctx, "start", np.array([0])),
                                   _const(ctx, "stop", np.array([size]))]).output[0]
    shape = _const(ctx, "shape", np.array([batch, out_h, out_w, channels], np.int64))
    _replace(ctx, node, [ctx.make_node("Reshape", [kept, shape]).output[0]])


def _compare(ctx, op: str, value: str, bound: int) -> str:
    return ctx.make_node(op, [value, _const(ctx, "bound", np.array(bound))]).output[0]


def _all(ctx, conditions: list[str]) -> str:
    result = conditions[0]
    for condition in conditions[1:]:
        result = ctx.make_node("And", [result, condition]).output[0]
    return result


CUSTOM_OPS: dict[str, CustomOp] = {op.name: op for op in (
    CustomOp("Convolution2DTransposeBias", TRANSPOSE_CONV_PARAMS, transpose_conv_bias,
             lower_transpose_conv_bias),
    CustomOp("MaxPoolingWithArgmax2D", POOL_PARAMS, max_pool_with_argmax,
             lower_max_pool_with_argmax),
    CustomOp("MaxUnpooling2D", POOL_PARAMS, max_unpooling, lower_max_unpooling),
)}
_registered = False


def register_handlers() -> None:
    """Register a tf2onnx handler per custom op (once per process)."""
    global _registered
    if _registered:
        return
    from tf2onnx.handler import tfl_op

    for op in CUSTOM_OPS.values():
        tfl_op([f"TFL_{op.name}"])(_handler(op))
    _registered = True


def _handler(op: CustomOp):
    """A tf2onnx handler class. tf2onnx reads a custom op's options only from a flexbuffer map,
    so `tflite_graph.with_readable_options` rewrites the C struct into one beforehand."""

    def version_1(cls, ctx, node, **kwargs):
        op.lower(ctx, node, {name: node.get_attr_value(name) for name in op.fields})

    return type(f"Tfl{op.name}", (), {"version_1": classmethod(version_1)})
