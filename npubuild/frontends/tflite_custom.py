"""TFLite custom ops npubuild lowers to ONNX: MediaPipe's segmentation and attention-mesh ops.

MediaPipe models (selfie and hair segmentation, and others built with its converter) use three
custom ops that TensorFlow Lite's own interpreter and tf2onnx do not know; its face mesh with
attention (``face_landmark_with_attention.tflite``: refined lips, eyes and irises) three more,
which crop regions of a feature map around landmarks it has just found. Each entry of
`CUSTOM_OPS` gives, for one op:

- `fields`: its parameters. For the segmentation ops, the leading int32 fields of the C struct
  MediaPipe stores as the op's custom options (``TfLiteTransposeConvParams`` or
  ``TfLitePoolParams`` of the builtin op it extends; not a flexbuffer, so tf2onnx cannot read
  them, and `tflite_graph` rewrites them); the attention ops store a flexbuffer map already
  (`flexbuffer`), which tf2onnx reads as it is, a missing key taking its entry in `defaults`;
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
    flexbuffer: bool = False  # options stored as a flexbuffer map (else a C struct)
    defaults: tuple[tuple[str, object], ...] = ()  # flexbuffer keys that may be missing

    def options(self, raw: bytes) -> dict:
        """The options from the op's custom-options bytes; ValueError when they do not fit."""
        if self.flexbuffer:
            return self._flexbuffer_options(raw)
        if len(raw) < 4 * len(self.fields):  # later TFLite versions append fields: ignored
            raise ValueError(f"its custom options hold {len(raw)} bytes, expected at least "
                             f"{4 * len(self.fields)} ({', '.join(self.fields)})")
        values = dict(zip(self.fields, struct.unpack_from(f"<{len(self.fields)}i", raw)))
        if values["padding"] not in PADDING:
            raise ValueError(f"unknown padding {values['padding']} in its options")
        if values.get("activation", 0) not in ACTIVATION_RANGE:
            raise ValueError(f"unsupported fused activation {values['activation']}")
        return values

    def _flexbuffer_options(self, raw: bytes) -> dict:
        from flatbuffers import flexbuffers

        try:
            stored = flexbuffers.Loads(raw) if raw else {}
        except Exception as exc:  # flexbuffers raises what the bytes make it raise
            raise ValueError(f"its custom options are not a flexbuffer map ({exc})") from None
        if not isinstance(stored, dict):
            raise ValueError("its custom options are not a flexbuffer map")
        values = {**dict(self.defaults), **{k: v for k, v in stored.items() if k in self.fields}}
        missing = [name for name in self.fields if name not in values]
        if missing:
            raise ValueError(f"its options lack {', '.join(missing)}")
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


# --- the attention mesh's ops (``mediapipe/util/tflite/operations``, version 2) -------------

LANDMARKS_TO_MATRIX_PARAMS = ("left_rotation_idx", "right_rotation_idx", "output_height",
                              "output_width", "scale_x", "scale_y", "subset_idxs",
                              "target_rotation_radians")


def landmarks_to_transform_matrix(landmarks: np.ndarray, opts: dict) -> list[np.ndarray]:
    """``Landmarks2TransformMatrix``: from landmarks [1, N, 3], the 4x4 matrix taking a pixel
    of an ``output_width`` x ``output_height`` crop to the landmarks' frame. The crop is turned
    so the line from the left to the right rotation landmark lies at
    ``target_rotation_radians``, is centred on the box of the subset's landmarks in that turned
    frame, and is ``scale_x``/``scale_y`` times that box."""
    points = landmarks.reshape(-1, landmarks.shape[-1])[:, :2].astype(np.float64)
    left, right = points[opts["left_rotation_idx"]], points[opts["right_rotation_idx"]]
    r = opts["target_rotation_radians"] - np.arctan2(right[1] - left[1], right[0] - left[0])
    turn = np.array([[np.cos(r), -np.sin(r)], [np.sin(r), np.cos(r)]])
    subset = points[np.asarray(opts["subset_idxs"], np.int64)] @ turn.T
    low, high = subset.min(0), subset.max(0)
    centre = turn.T @ ((low + high) / 2)  # back to the landmarks' frame
    size = np.array([opts["output_width"], opts["output_height"]], np.float64)
    scale = np.array([opts["scale_x"], opts["scale_y"]]) * (high - low) / size
    linear = turn.T * scale  # the rotation by -r, then the scale: R(-r) @ diag(scale)
    matrix = np.eye(4)
    matrix[:2, :2] = linear
    matrix[:2, 3] = centre - linear @ (size / 2)
    return [matrix[None].astype(np.float32)]


def transform_tensor_bilinear(x: np.ndarray, matrix: np.ndarray, opts: dict) -> list[np.ndarray]:
    """``TransformTensorBilinear``: an ``output_height`` x ``output_width`` crop of x [1, H, W,
    C], output pixel (px, py) read at the matrix's image of its centre less half a pixel,
    bilinearly; a pixel whose point falls outside [0, W-1] x [0, H-1] is zero."""
    _, height, width, channels = x.shape
    rows = _centred(matrix.reshape(4, 4).astype(np.float64))
    py, px = np.mgrid[0:opts["output_height"], 0:opts["output_width"]].astype(np.float64)
    tx = rows[0, 0] * px + rows[0, 1] * py + rows[0, 3]
    ty = rows[1, 0] * px + rows[1, 1] * py + rows[1, 3]
    inside = (tx >= 0) & (tx <= width - 1) & (ty >= 0) & (ty <= height - 1)
    x0, y0 = np.floor(tx).astype(np.int64), np.floor(ty).astype(np.int64)
    fx, fy = (tx - x0)[..., None], (ty - y0)[..., None]
    image = x[0].astype(np.float64)

    def read(yy, xx):
        ok = (yy >= 0) & (yy < height) & (xx >= 0) & (xx < width)
        value = image[np.clip(yy, 0, height - 1), np.clip(xx, 0, width - 1)]
        return np.where(ok[..., None], value, 0)

    upper = (1 - fx) * read(y0, x0) + fx * read(y0, x0 + 1)
    lower = (1 - fx) * read(y0 + 1, x0) + fx * read(y0 + 1, x0 + 1)
    out = np.where(inside[..., None], fy * lower + (1 - fy) * upper, 0)
    return [out[None].astype(np.float32).reshape(1, *px.shape, channels)]


def _centred(matrix: np.ndarray) -> np.ndarray:
    """The matrix with MediaPipe's align-corners correction (pixel centres: T -> S T A)."""
    rows = matrix.copy()
    rows[:2, 3] += rows[:2, 0] * 0.5 + rows[:2, 1] * 0.5 - 0.5
    return rows


def transform_landmarks(landmarks: np.ndarray, matrix: np.ndarray, opts: dict) -> list[np.ndarray]:
    """``TransformLandmarks``: each landmark's (x, y) [1, N, 2 or 3] through the matrix's first
    two rows (z = 0, w = 1); a third coordinate passes unchanged."""
    rows = matrix.reshape(4, 4).astype(np.float64)
    xy = landmarks[..., :2].astype(np.float64)
    moved = xy @ rows[:2, :2].T + rows[:2, 3]
    return [np.concatenate([moved, landmarks[..., 2:]], -1).astype(np.float32)]


def _node(ctx, kind: str, *inputs: str, **attr) -> str:
    """One ONNX node on tf2onnx's graph; its (first) output."""
    return ctx.make_node(kind, list(inputs), attr=attr).output[0]


def _f32(ctx, *values: float) -> str:
    return _const(ctx, "f", np.array(values, np.float32))


def _i64(ctx, *values: int) -> str:
    return _const(ctx, "i", np.array(values, np.int64))


def _gather(ctx, value: str, indices, axis: int) -> str:
    return _node(ctx, "Gather", value, _const(ctx, "index", np.asarray(indices, np.int64)),
                 axis=axis)


def _affine_parts(ctx, matrix: str) -> tuple[str, str]:
    """A [1, 4, 4] matrix's 2x2 part, transposed (for ``points @ it``), and its shift [1, 2]."""
    rows = _node(ctx, "Reshape", matrix, _i64(ctx, 4, 4))
    linear = _node(ctx, "Slice", rows, _i64(ctx, 0, 0), _i64(ctx, 2, 2))
    shift = _node(ctx, "Slice", rows, _i64(ctx, 0, 3), _i64(ctx, 2, 4))
    return _node(ctx, "Transpose", linear, perm=[1, 0]), _node(ctx, "Transpose", shift, perm=[1, 0])


def _box(ctx, values: str) -> tuple[str, str]:
    """The least and the greatest of a 1-D tensor, each [1]."""
    return (_node(ctx, "ReduceMin", values, axes=[0], keepdims=1),
            _node(ctx, "ReduceMax", values, axes=[0], keepdims=1))


def lower_landmarks_to_transform_matrix(ctx, node, opts: dict) -> None:
    """The angle never appears: cos and sin of ``target - atan2(dy, dx)`` from dx and dy
    normalised (a zero length reads as angle 0, as atan2(0, 0)); ReduceMin/Max give the box."""
    def op(kind, *values):
        return _node(ctx, kind, *values)

    shape = _input_shape(ctx, node)
    points = op("Reshape", node.input[0], _i64(ctx, -1, shape[-1]))
    x, y = _gather(ctx, points, 0, 1), _gather(ctx, points, 1, 1)  # [N]
    left, right = opts["left_rotation_idx"], opts["right_rotation_idx"]
    dx = op("Sub", _gather(ctx, x, [right], 0), _gather(ctx, x, [left], 0))
    dy = op("Sub", _gather(ctx, y, [right], 0), _gather(ctx, y, [left], 0))
    length = op("Sqrt", op("Add", op("Mul", dx, dx), op("Mul", dy, dy)))
    zero = op("Equal", length, _f32(ctx, 0.0))
    safe = op("Where", zero, _f32(ctx, 1.0), length)
    cos_a = op("Where", zero, _f32(ctx, 1.0), op("Div", dx, safe))
    sin_a = op("Where", zero, _f32(ctx, 0.0), op("Div", dy, safe))
    t = float(opts.get("target_rotation_radians") or 0.0)
    ct, st = _f32(ctx, np.cos(t)), _f32(ctx, np.sin(t))
    cos_r = op("Add", op("Mul", ct, cos_a), op("Mul", st, sin_a))  # cos(t - a)
    sin_r = op("Sub", op("Mul", st, cos_a), op("Mul", ct, sin_a))  # sin(t - a)
    subset = np.asarray(opts["subset_idxs"], np.int64)
    sx, sy = _gather(ctx, x, subset, 0), _gather(ctx, y, subset, 0)
    turned_x = op("Sub", op("Mul", cos_r, sx), op("Mul", sin_r, sy))
    turned_y = op("Add", op("Mul", sin_r, sx), op("Mul", cos_r, sy))
    low_x, high_x = _box(ctx, turned_x)
    low_y, high_y = _box(ctx, turned_y)
    half = _f32(ctx, 0.5)
    mx, my = op("Mul", op("Add", low_x, high_x), half), op("Mul", op("Add", low_y, high_y), half)
    cx = op("Add", op("Mul", cos_r, mx), op("Mul", sin_r, my))  # R(-r) @ middle
    cy = op("Sub", op("Mul", cos_r, my), op("Mul", sin_r, mx))
    width, height = opts["output_width"], opts["output_height"]
    scale_x = op("Mul", op("Sub", high_x, low_x), _f32(ctx, opts["scale_x"] / width))
    scale_y = op("Mul", op("Sub", high_y, low_y), _f32(ctx, opts["scale_y"] / height))
    a00, a01 = op("Mul", cos_r, scale_x), op("Mul", sin_r, scale_y)
    a10, a11 = op("Neg", op("Mul", sin_r, scale_x)), op("Mul", cos_r, scale_y)
    w2, h2 = _f32(ctx, width / 2), _f32(ctx, height / 2)
    t0 = op("Sub", cx, op("Add", op("Mul", a00, w2), op("Mul", a01, h2)))
    t1 = op("Sub", cy, op("Add", op("Mul", a10, w2), op("Mul", a11, h2)))
    o, i = _f32(ctx, 0.0), _f32(ctx, 1.0)
    flat = _node(ctx, "Concat", a00, a01, o, t0, a10, a11, o, t1, o, o, i, o, o, o, o, i, axis=0)
    _replace(ctx, node, [op("Reshape", flat, _i64(ctx, 1, 4, 4))])


def lower_transform_tensor_bilinear(ctx, node, opts: dict) -> None:
    """GridSample (bilinear, align_corners: pixel i at -1 + 2i/(size-1)) at the matrix's image
    of each output pixel's centre less half a pixel, times a mask of the points inside the input
    (MediaPipe zeroes a pixel whose point falls outside; GridSample would blend the border in)."""
    _, height, width, _ = _input_shape(ctx, node)
    out_h, out_w = opts["output_height"], opts["output_width"]
    linear, shift = _affine_parts(ctx, node.input[1])
    py, px = np.mgrid[0:out_h, 0:out_w].astype(np.float32)
    centres = _const(ctx, "px", np.stack([px.ravel() + 0.5, py.ravel() + 0.5], 1))  # [P, 2]
    points = _node(ctx, "Add", _node(ctx, "MatMul", centres, linear), shift)
    points = _node(ctx, "Sub", points, _f32(ctx, 0.5))  # [P, 2] as (x, y)
    inside = _node(ctx, "And", _node(ctx, "GreaterOrEqual", points, _f32(ctx, 0.0, 0.0)),
                   _node(ctx, "LessOrEqual", points, _f32(ctx, width - 1, height - 1)))
    inside = _node(ctx, "Cast", inside, to=1)  # FLOAT
    inside = _node(ctx, "ReduceMin", inside, axes=[1], keepdims=1)  # [P, 1]: both inside
    to_grid = _f32(ctx, 2.0 / max(width - 1, 1), 2.0 / max(height - 1, 1))
    grid = _node(ctx, "Sub", _node(ctx, "Mul", points, to_grid), _f32(ctx, 1.0))
    grid = _node(ctx, "Reshape", grid, _i64(ctx, 1, out_h, out_w, 2))
    sampled = _node(ctx, "GridSample", _nchw(ctx, node.input[0]), grid, mode="bilinear",
                    padding_mode="zeros", align_corners=1)
    mask = _node(ctx, "Reshape", inside, _i64(ctx, 1, out_h, out_w, 1))
    _replace(ctx, node, [_node(ctx, "Mul", _nhwc(ctx, sampled), mask)])


def lower_transform_landmarks(ctx, node, opts: dict) -> None:
    """(x, y) @ the matrix's 2x2 part, transposed, plus its shift; a third coordinate as it was."""
    shape = _input_shape(ctx, node)
    linear, shift = _affine_parts(ctx, node.input[1])
    last = _i64(ctx, len(shape) - 1)
    xy = node.input[0]
    if shape[-1] > 2:
        xy = _node(ctx, "Slice", xy, _i64(ctx, 0), _i64(ctx, 2), last)
    moved = _node(ctx, "Add", _node(ctx, "MatMul", xy, linear), shift)
    if shape[-1] > 2:
        rest = _node(ctx, "Slice", node.input[0], _i64(ctx, 2), _i64(ctx, shape[-1]), last)
        moved = _node(ctx, "Concat", moved, rest, axis=len(shape) - 1)
    _replace(ctx, node, [moved])


CUSTOM_OPS: dict[str, CustomOp] = {op.name: op for op in (
    CustomOp("Convolution2DTransposeBias", TRANSPOSE_CONV_PARAMS, transpose_conv_bias,
             lower_transpose_conv_bias),
    CustomOp("MaxPoolingWithArgmax2D", POOL_PARAMS, max_pool_with_argmax,
             lower_max_pool_with_argmax),
    CustomOp("MaxUnpooling2D", POOL_PARAMS, max_unpooling, lower_max_unpooling),
    CustomOp("Landmarks2TransformMatrix", LANDMARKS_TO_MATRIX_PARAMS,
             landmarks_to_transform_matrix, lower_landmarks_to_transform_matrix, flexbuffer=True,
             defaults=(("target_rotation_radians", 0.0),)),
    CustomOp("TransformTensorBilinear", ("output_height", "output_width"),
             transform_tensor_bilinear, lower_transform_tensor_bilinear, flexbuffer=True),
    CustomOp("TransformLandmarks", (), transform_landmarks, lower_transform_landmarks,
             flexbuffer=True),
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
        defaults = dict(op.defaults)
        op.lower(ctx, node, {name: node.get_attr_value(name, defaults.get(name))
                             for name in op.fields})

    return type(f"Tfl{op.name}", (), {"version_1": classmethod(version_1)})
