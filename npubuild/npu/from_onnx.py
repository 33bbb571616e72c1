"""`LayerSpec`s from a float ONNX graph with inferred shapes, to tile real models today.

Every node whose op has a converter here, whose weights are constants and whose activations are
static 4-D tensors becomes a layer; every other node is skipped with its reason, and the tensors
crossing into or out of skipped nodes become the layer graph's inputs and outputs (so skipped
nodes break groups). Activations are counted as int8, weights as int8 with int32 biases.
"""

from __future__ import annotations

from math import prod
from typing import Callable

import numpy as np
import onnx
from onnx import numpy_helper

from npubuild.npu.layers import LayerGraph, LayerSpec, Shape


class Unmodelled(Exception):
    """The node is not something the tiler models; the message says why."""


LUT_OPS = ("Sigmoid", "Tanh", "HardSigmoid", "HardSwish", "Elu", "Selu",
           "Softplus", "Exp", "Log", "Erf", "Gelu")
LUT_BYTES = 256  # one int8 → int8 table


def layers_from_onnx(model: onnx.ModelProto, *, infer: bool = True) -> LayerGraph:
    """The NPU layers of ``model`` in node order, with the skipped nodes and their reasons."""
    if infer:
        model = onnx.shape_inference.infer_shapes(model)
    graph = model.graph
    shapes = _static_shapes(graph)
    consts = _constants(graph)
    layers, skipped = [], []
    for node in graph.node:
        if node.op_type == "Constant":
            continue
        try:
            layers.append(_convert(node, shapes, consts))
        except Unmodelled as exc:
            skipped.append((node.name or node.output[0], str(exc)))
    return _assemble(layers, graph, shapes, tuple(skipped))


def _assemble(layers: list[LayerSpec], graph, shapes, skipped) -> LayerGraph:
    produced = {t for layer in layers for t in layer.outputs}
    inputs = dict.fromkeys(t for layer in layers for t in layer.inputs if t not in produced)
    read_inside = {t for layer in layers for t in layer.inputs}
    read_outside = {t for node in graph.node for t in node.input} - read_inside
    model_outputs = {o.name for o in graph.output}
    outputs = [t for layer in layers for t in layer.outputs
               if t in model_outputs or t in read_outside or t not in read_inside]
    used = {t: shapes[t] for layer in layers for t in layer.inputs + layer.outputs}
    return LayerGraph(tuple(layers), tuple(inputs), tuple(dict.fromkeys(outputs)), used, skipped)


def _static_shapes(graph) -> dict[str, tuple[int, ...]]:
    shapes = {}
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        dims = value.type.tensor_type.shape.dim
        if value.type.HasField("tensor_type") and all(d.HasField("dim_value") for d in dims):
            shapes[value.name] = tuple(d.dim_value for d in dims)
    return shapes


def _constants(graph) -> dict[str, np.ndarray]:
    consts = {t.name: numpy_helper.to_array(t) for t in graph.initializer}
    for node in graph.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].name == "value":
            consts[node.output[0]] = numpy_helper.to_array(node.attribute[0].t)
    return consts


def node_layer(node, shapes, consts) -> LayerSpec:
    """One node as a `LayerSpec` (``shapes`` and ``consts`` by tensor name); `Unmodelled`
    when the tiler does not model it."""
    return _convert(node, shapes, consts)


def _convert(node, shapes, consts) -> LayerSpec:
    convert = CONVERTERS.get(node.op_type)
    if convert is None:
        raise Unmodelled(f"{node.op_type} is not an op the NPU tiler models")
    acts = [t for t in node.input if t and t not in consts]
    outs = [t for t in node.output if t]
    for t in acts + outs:
        shape = shapes.get(t)
        if shape is None or len(shape) != 4:
            raise Unmodelled(f"tensor {t!r} is not a static 4-D tensor (shape {shape})")
    base = dict(name=node.name or outs[0], inputs=tuple(acts), outputs=tuple(outs),
                in_shapes=tuple(shapes[t] for t in acts),
                out_shapes=tuple(shapes[t] for t in outs))
    return convert(node, base, consts)


def _attrs(node) -> dict:
    return {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}


def _elements(shape: Shape) -> int:
    return prod(shape)


def _window(node, base, kernel: list[int], has_dilation: bool) -> dict:
    a = _attrs(node)
    strides = list(a.get("strides", [1, 1]))
    dil = list(a.get("dilations", [1, 1])) if has_dilation else [1, 1]
    pads = list(a.get("pads", [0, 0, 0, 0]))
    auto = a.get("auto_pad", b"NOTSET").decode()
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        pads = _same_pads(base["in_shapes"][0][2:], base["out_shapes"][0][2:], kernel, strides,
                          dil, upper=auto == "SAME_UPPER")
    geometry = (("kernel", tuple(kernel)), ("stride", tuple(strides)), ("pads", tuple(pads)),
                ("dilation", tuple(dil)))
    return dict(kernel_h=kernel[0], stride_h=strides[0], pad_top=pads[0], pad_bottom=pads[2],
                dilation_h=dil[0], attrs=geometry)


def _same_pads(in_hw, out_hw, kernel, strides, dil, upper: bool) -> list[int]:
    total = [max(0, (o - 1) * s + (k - 1) * d + 1 - i)
             for i, o, k, s, d in zip(in_hw, out_hw, kernel, strides, dil)]
    first = [t // 2 if upper else t - t // 2 for t in total]
    return [first[0], first[1], total[0] - first[0], total[1] - first[1]]


def _conv(node, base, consts) -> LayerSpec:
    if len(node.input) < 2 or node.input[1] not in consts:
        raise Unmodelled("Conv weights are not constant")
    w = consts[node.input[1]]
    if w.ndim != 4:
        raise Unmodelled("only 2-D convolutions are modelled")
    group = _attrs(node).get("group", 1)
    c_out, c_in_g, kh, kw = w.shape
    c_in = base["in_shapes"][0][1]
    has_bias = len(node.input) > 2 and bool(node.input[2])
    n, _, ho, wo = base["out_shapes"][0]
    geo = _window(node, base, [kh, kw], has_dilation=True)
    op = "dwconv" if group > 1 and group == c_in == c_out else "conv"
    geo["attrs"] += (("group", group), ("bias", has_bias))
    return LayerSpec(op=op, weight_bytes=w.size + 4 * c_out * has_bias,
                     macs=n * c_out * ho * wo * c_in_g * kh * kw, **base, **geo)


def _pool(node, base, consts) -> LayerSpec:
    a = _attrs(node)
    kernel = list(a["kernel_shape"])
    avg = node.op_type == "AveragePool"
    geo = _window(node, base, kernel, has_dilation=not avg)
    geo["attrs"] += (("mode", "avg" if avg else "max"), ("ceil_mode", a.get("ceil_mode", 0)),
                     ("count_include_pad", a.get("count_include_pad", 0)))
    out = base["out_shapes"][0]
    return LayerSpec(op="pool", macs=_elements(out) * prod(kernel), scratch_elem_bytes=2 * avg,
                     **base, **geo)


def _global_pool(node, base, consts) -> LayerSpec:
    _, _, h, w = base["in_shapes"][0]
    avg = node.op_type == "GlobalAveragePool"
    attrs = (("kernel", (h, w)), ("stride", (1, 1)), ("pads", (0, 0, 0, 0)), ("dilation", (1, 1)),
             ("mode", "avg" if avg else "max"), ("global", True))
    return LayerSpec(op="pool", macs=_elements(base["in_shapes"][0]), kernel_h=h,
                     scratch_elem_bytes=2 * avg, attrs=attrs, **base)


def _binary(node, base, consts) -> LayerSpec:
    out = base["out_shapes"][0]
    fn = node.op_type.lower()
    const = [consts[t] for t in node.input if t in consts]
    if not base["inputs"]:
        raise Unmodelled(f"{node.op_type} of two constants (fold it first)")
    for shape in base["in_shapes"]:
        if any(d not in (1, o) for d, o in zip(shape, out)):
            raise Unmodelled(f"{node.op_type} broadcast {shape} → {out} is not modelled")
    if const:
        return LayerSpec(op="eltwise", weight_bytes=int(const[0].size), macs=_elements(out),
                         attrs=(("fn", fn), ("const", node.input[1] in consts)), **base)
    op = "add" if fn in ("add", "sub") else "eltwise"
    return LayerSpec(op=op, macs=_elements(out), scratch_elem_bytes=2 * (fn == "mul"),
                     attrs=(("fn", fn),), **base)


def _lut(node, base, consts) -> LayerSpec:
    attrs = tuple((k, v) for k, v in _attrs(node).items() if isinstance(v, (int, float)))
    return LayerSpec(op="lut", weight_bytes=LUT_BYTES, macs=_elements(base["out_shapes"][0]),
                     attrs=(("fn", node.op_type),) + attrs, **base)


def _unary(node, base, consts) -> LayerSpec:
    return LayerSpec(op="eltwise", macs=_elements(base["out_shapes"][0]),
                     attrs=(("fn", node.op_type.lower()),), **base)


def _channel_axis(node, base) -> None:
    axis = _attrs(node).get("axis", 1)
    if axis not in (1, -3):
        raise Unmodelled(f"{node.op_type} along axis {axis}: only channels (axis 1) are modelled")


def _concat(node, base, consts) -> LayerSpec:
    _channel_axis(node, base)
    if len(base["inputs"]) != len([t for t in node.input if t]):
        raise Unmodelled("Concat with a constant input is not modelled")
    return LayerSpec(op="concat", macs=_elements(base["out_shapes"][0]), attrs=(("axis", 1),),
                     **base)


def _split(node, base, consts) -> LayerSpec:
    _channel_axis(node, base)
    sizes = tuple(s[1] for s in base["out_shapes"])
    return LayerSpec(op="split", macs=_elements(base["in_shapes"][0]),
                     attrs=(("axis", 1), ("split", sizes)), **base)


def _resize(node, base, consts) -> LayerSpec:
    a = _attrs(node)
    if a.get("mode", b"nearest").decode() != "nearest":
        raise Unmodelled("only nearest-neighbour Resize is modelled")
    mode = a.get("coordinate_transformation_mode", b"half_pixel").decode()
    (n, c, h, w), (no, co, ho, wo) = base["in_shapes"][0], base["out_shapes"][0]
    if (n, c) != (no, co) or ho % h or wo % w:
        raise Unmodelled(f"Resize {base['in_shapes'][0]} → {base['out_shapes'][0]} is not an "
                         "integer spatial upscale")
    if mode not in ("asymmetric", "half_pixel", "pytorch_half_pixel"):
        raise Unmodelled(f"Resize coordinate mode {mode!r} is not modelled")
    base = dict(base, inputs=base["inputs"][:1], in_shapes=base["in_shapes"][:1])
    return LayerSpec(op="resize", scale_h=ho // h, macs=_elements(base["out_shapes"][0]),
                     attrs=(("scale", (ho // h, wo // w)), ("mode", "nearest")), **base)


def _move(node, base, consts) -> LayerSpec:
    return LayerSpec(op="move", macs=_elements(base["out_shapes"][0]), **base)


CONVERTERS: dict[str, Callable[..., LayerSpec]] = {
    "Conv": _conv, "MaxPool": _pool, "AveragePool": _pool,
    "GlobalAveragePool": _global_pool, "GlobalMaxPool": _global_pool,
    "Add": _binary, "Sub": _binary, "Mul": _binary,
    "Relu": _unary, "Clip": _unary, "LeakyRelu": _unary,
    "PRelu": _binary,  # piecewise linear: a multiplier per side (per channel), no table
    **{op: _lut for op in LUT_OPS},
    "Concat": _concat, "Split": _split, "Resize": _resize, "Identity": _move,
}
