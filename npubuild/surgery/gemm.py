"""Fully connected layers as convolutions: ``rewrite_gemm_as_conv``, ``split_gemm_slices``.

Seed 002's UFLD case: ``Conv -> Reshape(1, -1) -> Gemm`` becomes one Conv whose kernel covers
the whole (H, W) map of the 4-D tensor the Reshape flattened (weights ``(K, C, H, W)``, output
``(N, K, 1, 1)``); a Gemm on a 1x1 map becomes a 1x1 Conv. A Gemm whose output is cut by Slices
(or a Split) on the feature axis becomes one Conv per slice, with the Gemm's rows for weights.
Consumers that still expect the 2-D tensor read it through a Reshape (which the next rewrite of
the chain absorbs); a graph output becomes 4-D (``graph_outputs: 4d``) or keeps its shape.
"""

from __future__ import annotations

from typing import Literal

import lazy_loader as lazy
from pydantic import Field

from npubuild.surgery import StepArgs, SurgeryError, rewrite
from npubuild.surgery.graph import Editor, node_label
from npubuild.surgery.opsets import attr, make_reshape, slice_spec, split_sizes

np = lazy.load("numpy")
onnx = lazy.load("onnx")

GraphOutputs = Literal["4d", "original"]


class GemmAsConvArgs(StepArgs):
    """Arguments of ``rewrite_gemm_as_conv``."""

    nodes: list[str] = Field(default_factory=list, description="Gemm nodes (names or globs); "
                                                               "default: every Gemm.")
    graph_outputs: GraphOutputs = Field(
        "4d", description="A Gemm output that is a graph output becomes the 4-D (N, K, 1, 1) "
                          "tensor ('4d'), or keeps its 2-D shape through a Reshape ('original').")


@rewrite("rewrite_gemm_as_conv", GemmAsConvArgs)
def rewrite_gemm_as_conv(model: onnx.ModelProto, args: GemmAsConvArgs) -> onnx.ModelProto:
    """Gemm on a flattened 4-D tensor -> Conv with kernel (H, W); on a 1x1 map -> 1x1 Conv."""
    ed = Editor(model, "rewrite_gemm_as_conv")
    gemms = ed.select(args.nodes, [] if args.nodes else ["Gemm"], required_op="Gemm")
    for gemm in gemms:
        weights, bias = gemm_weights(ed, gemm)
        source, (n, c, h, w) = conv_source(ed, gemm)
        if weights.shape[1] != c * h * w:
            raise SurgeryError(f"Gemm {node_label(gemm)!r}: its weights take {weights.shape[1]} "
                               f"features, the 4-D input {source!r} has {c}x{h}x{w}")
        out = gemm.output[0]
        _emit_conv(ed, gemm, source, weights.reshape(-1, c, h, w), bias, out, [n, weights.shape[0]],
                   args.graph_outputs, f"{gemm.name or 'Gemm'}_Conv")
        ed.remove(gemm)
    return ed.finish()


class SplitGemmSlicesArgs(StepArgs):
    """Arguments of ``split_gemm_slices``."""

    nodes: list[str] = Field(default_factory=list, description="Gemm nodes (names or globs) whose "
                                                               "output only Slices/Splits read; "
                                                               "default: every such Gemm.")
    graph_outputs: GraphOutputs = Field(
        "4d", description="A slice that is a graph output becomes the 4-D (N, k, 1, 1) tensor "
                          "('4d'), or keeps its 2-D shape through a Reshape ('original').")


@rewrite("split_gemm_slices", SplitGemmSlicesArgs)
def split_gemm_slices(model: onnx.ModelProto, args: SplitGemmSlicesArgs) -> onnx.ModelProto:
    """Gemm whose output is cut by Slices on the feature axis -> one Conv per slice."""
    ed = Editor(model, "split_gemm_slices")
    if args.nodes:
        gemms = ed.select(args.nodes, required_op="Gemm")
    else:
        gemms = [g for g in ed.select(op_types=["Gemm"]) if _only_cut(ed, g)]
        if not gemms:
            raise SurgeryError("no Gemm has an output read only by Slice or Split nodes")
    for gemm in gemms:
        weights, bias = gemm_weights(ed, gemm)
        source, (n, c, h, w) = conv_source(ed, gemm)
        kernel = weights.reshape(-1, c, h, w)
        cuts = _cuts(ed, gemm, weights.shape[0])
        for k, (cut, output, start, stop) in enumerate(cuts):
            _emit_conv(ed, gemm, source, kernel[start:stop],
                       None if bias is None else bias[start:stop], output, [n, stop - start],
                       args.graph_outputs, f"{gemm.name or 'Gemm'}_Conv_{k}")
        ed.remove(gemm, *{id(cut): cut for cut, *_ in cuts}.values())
    return ed.finish()


def _only_cut(ed: Editor, gemm: onnx.NodeProto) -> bool:
    readers = ed.consumers(gemm.output[0])
    return bool(readers) and not ed.is_graph_output(gemm.output[0]) and \
        all(r.op_type in ("Slice", "Split") for r in readers)


def _cuts(ed: Editor, gemm: onnx.NodeProto, features: int) -> list[tuple]:
    """(node, output, start, stop) for every Slice/Split output cut from the Gemm's output."""
    y = gemm.output[0]
    if ed.is_graph_output(y):
        raise SurgeryError(f"Gemm {node_label(gemm)!r}: its output {y!r} is a graph output")
    rows = ed.static_shape(y, gemm)[0]
    cuts = []
    for reader in ed.consumers(y):
        if reader.op_type == "Slice" and reader.input[0] == y:
            start, stop = _slice_range(ed, reader, rows, features)
            cuts.append((reader, reader.output[0], start, stop))
        elif reader.op_type == "Split" and attr(reader, "axis", 0) in (1, -1):
            sizes = split_sizes(ed, reader, features)
            if sizes is None:
                raise SurgeryError(f"Split {node_label(reader)!r}: its sizes are not constant")
            bounds = np.cumsum([0] + sizes)
            cuts += [(reader, o, int(a), int(b)) for o, a, b in zip(reader.output, bounds, bounds[1:])]
        else:
            raise SurgeryError(f"Gemm {node_label(gemm)!r}: its output is also read by "
                               f"{reader.op_type} {node_label(reader)!r}; only Slices on the feature "
                               "axis (or a Split on it) may read it")
    return cuts


def _slice_range(ed: Editor, node: onnx.NodeProto, rows: int, features: int) -> tuple[int, int]:
    spec = slice_spec(ed, node, rank=2)
    if spec is None:
        raise SurgeryError(f"Slice {node_label(node)!r}: its starts/ends/axes are not constant")
    start, stop = 0, features
    for axis, begin, end, step in spec:
        size = rows if axis == 0 else features
        lo, hi = (max(0, min(size, v + size if v < 0 else v)) for v in (begin, end))
        if axis == 0 and (lo, hi) != (0, size):
            raise SurgeryError(f"Slice {node_label(node)!r} cuts the batch axis; only the feature "
                               "axis can become separate convolutions")
        if step != 1:
            raise SurgeryError(f"Slice {node_label(node)!r} has step {step}; only step 1 is supported")
        if axis == 1:
            start, stop = lo, hi
    if stop <= start:
        raise SurgeryError(f"Slice {node_label(node)!r} is empty")
    return start, stop


def gemm_weights(ed: Editor, gemm: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray | None]:
    """The Gemm as ``y = x @ W.T + b``: W of shape (K_out, K_in) and b of shape (K_out,)."""
    label = node_label(gemm)
    if attr(gemm, "transA", 0):
        raise SurgeryError(f"Gemm {label!r} transposes its input (transA=1); it has no Conv form")
    matrix = ed.constant(gemm.input[1])
    if matrix is None:
        raise SurgeryError(f"Gemm {label!r}: its weights {gemm.input[1]!r} are not constant")
    weights = (matrix if attr(gemm, "transB", 0) else matrix.T) * attr(gemm, "alpha", 1.0)
    if len(gemm.input) < 3 or not gemm.input[2]:
        return weights.astype(matrix.dtype), None
    c = ed.constant(gemm.input[2])
    if c is None:
        raise SurgeryError(f"Gemm {label!r}: its bias {gemm.input[2]!r} is not constant")
    c = np.asarray(c) * attr(gemm, "beta", 1.0)
    if c.ndim == 2 and c.shape[0] != 1:
        raise SurgeryError(f"Gemm {label!r}: its bias has shape {list(c.shape)}, different per "
                           "row; a Conv bias is one value per output channel")
    bias = np.broadcast_to(c.reshape(-1) if c.ndim else c, (weights.shape[0],))
    return weights.astype(matrix.dtype), np.ascontiguousarray(bias, dtype=matrix.dtype)


def conv_source(ed: Editor, gemm: onnx.NodeProto) -> tuple[str, tuple[int, int, int, int]]:
    """The 4-D tensor a Gemm's input flattens (inserting a (N, K, 1, 1) Reshape if none)."""
    a = gemm.input[0]
    shape = ed.static_shape(a, gemm)
    producer = ed.producer(a)
    if producer is not None and producer.op_type in ("Reshape", "Flatten"):
        src = producer.input[0]
        src_shape = ed.shape(src)
        flattened = src_shape is not None and len(src_shape) == 4 and \
            shape == [src_shape[0], int(np.prod(src_shape[1:]))]
        if flattened:
            return src, tuple(src_shape)
    if len(shape) != 2:
        raise SurgeryError(f"Gemm {node_label(gemm)!r}: its input {a!r} has shape {shape}, not 2-D")
    reshaped = ed.unique_tensor(f"{a}_4d")
    make_reshape(ed, a, reshaped, [shape[0], shape[1], 1, 1], f"{gemm.name or 'Gemm'}_to_4d")
    return reshaped, (shape[0], shape[1], 1, 1)


def _emit_conv(ed: Editor, gemm: onnx.NodeProto, source: str, kernel: np.ndarray,
               bias: np.ndarray | None, output: str, shape_2d: list[int], graph_outputs: str,
               name: str) -> None:
    """A Conv computing ``output``; 2-D readers read it through a Reshape."""
    weight = ed.add_initializer(np.ascontiguousarray(kernel), f"{name}_weight")
    inputs = [source, weight] + ([ed.add_initializer(bias, f"{name}_bias")] if bias is not None else [])
    h, w = kernel.shape[2:]
    as_output = ed.is_graph_output(output) and graph_outputs == "4d"
    readers = [r for r in ed.consumers(output) if r is not gemm]
    conv_out = output if as_output else ed.unique_tensor(f"{output}_4d")
    _detach(ed, output)
    ed.make_node("Conv", inputs, [conv_out], name, kernel_shape=[int(h), int(w)],
                 strides=[1, 1], pads=[0, 0, 0, 0], dilations=[1, 1], group=1)
    if as_output:
        ed.set_output_shape(output, shape_2d + [1, 1])
        if readers:
            flat = ed.unique_tensor(f"{output}_2d")
            ed.replace_uses(output, flat, only=readers)
            make_reshape(ed, conv_out, flat, shape_2d, f"{name}_to_2d")
        return
    make_reshape(ed, conv_out, output, shape_2d, f"{name}_to_2d")


def _detach(ed: Editor, tensor: str) -> None:
    """Drop ``tensor`` from its producer's outputs, so a new node can produce it."""
    producer = ed.producer(tensor)
    if producer is not None:
        for i, name in enumerate(producer.output):
            if name == tensor:
                producer.output[i] = ""
        ed.touch()
