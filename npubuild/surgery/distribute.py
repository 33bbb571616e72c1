"""Push a Concat to the graph outputs: what follows it runs once per concatenated part.

Seed 002's YOLOv8 rewrite: the head concatenates the three scales' flattened maps
``(1, C, H*W)`` on the anchor axis and then decodes boxes; each decode step is per anchor, so
it can run per scale and the Concat can move to the very end (or disappear, the parts becoming
separate outputs). Every node downstream of the Concat must be separable along the concatenated
axis: elementwise ops (constants are sliced per part), Reshape/Transpose/Squeeze/Unsqueeze that
keep that axis whole, Softmax/Split/Slice/Concat/Reduce on other axes, Conv/pooling with a
kernel of 1 along it, MatMul on a row axis. Anything else is reported with the reason.
"""

from __future__ import annotations

from dataclasses import dataclass

import lazy_loader as lazy

from npubuild.surgery import SurgeryError
from npubuild.surgery.graph import Editor, node_label, toposort
from npubuild.surgery.opsets import attr, axes_of, make_reshape, slice_spec, split_sizes

np = lazy.load("numpy")
onnx = lazy.load("onnx")

ELEMENTWISE = {
    "Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Sum", "Mean", "Where", "Equal", "Less",
    "Greater", "LessOrEqual", "GreaterOrEqual", "And", "Or", "Xor", "Not", "Mod", "PRelu",
    "Sigmoid", "Relu", "Tanh", "Exp", "Log", "Sqrt", "Abs", "Neg", "Reciprocal", "Floor", "Ceil",
    "Round", "Sign", "Erf", "Sin", "Cos", "HardSigmoid", "HardSwish", "LeakyRelu", "Elu", "Selu",
    "Celu", "Softplus", "Softsign", "Mish", "Gelu", "Clip", "Cast", "Identity", "IsNaN", "IsInf",
}
RESHAPES = {"Reshape", "Flatten", "Squeeze", "Unsqueeze"}
SOFTMAXES = {"Softmax", "LogSoftmax", "Hardmax"}
WINDOWED = {"Conv", "MaxPool", "AveragePool", "LpPool"}


@dataclass
class Parted:
    """A tensor computed as parts concatenated on ``axis``."""

    names: list[str]
    axis: int
    sizes: list[int]


def distribute(ed: Editor, concat_name: str) -> dict[str, Parted]:
    """Run everything after the Concat once per input; return the graph outputs now in parts.

    The graph outputs keep their names through a Concat of their parts (the caller may remove
    it and expose the parts instead).
    """
    toposort(ed.graph)  # consumers must come after producers below
    ed.touch()
    concat = ed.node(concat_name, "Concat")
    ed.freeze_shapes()  # the original graph's shapes, read while its nodes are replaced
    rank = len(_shape(ed, concat.output[0], concat))
    axis = attr(concat, "axis") % rank
    sizes = [_shape(ed, p, concat)[axis] for p in concat.input]
    parted = {concat.output[0]: Parted(list(concat.input), axis, sizes)}
    ed.remove(concat)
    for node in list(ed.graph.node):
        if any(name in parted for name in node.input):
            _split_node(ed, node, parted)
    outputs = {}
    for name in ed.output_names:
        if name in parted:
            part = parted[name]
            ed.make_node("Concat", part.names, [name], f"{name}_Concat", axis=part.axis)
            outputs[name] = part
    ed.thaw_shapes()
    return outputs


def _split_node(ed: Editor, node: onnx.NodeProto, parted: dict[str, Parted]) -> None:
    first = next(parted[n] for n in node.input if n in parted)
    rule = _rule(node.op_type)
    if rule is None:
        raise SurgeryError(f"{node.op_type} node {node_label(node)!r} follows the distributed "
                           f"Concat and cannot run per part (not supported for this op)")
    axis = None
    for i in range(len(first.sizes)):
        axis = rule(ed, node, parted, i)
    for name in node.output:
        if name:
            parted[name] = Parted([_part_name(ed, name, i) for i in range(len(first.sizes))],
                                  axis, first.sizes)
    ed.remove(node)


def _part_name(ed: Editor, name: str, i: int) -> str:
    return f"{name}__part{i}"


def _shape(ed: Editor, name: str, node: onnx.NodeProto) -> list[int]:
    return ed.static_shape(name, node)


def _rule(op: str):
    if op in ELEMENTWISE:
        return _elementwise
    return {"Transpose": _transpose, "Concat": _concat, "Split": _split, "Slice": _slice,
            "BatchNormalization": _batchnorm, "MatMul": _matmul,
            **{o: _reshape for o in RESHAPES}, **{o: _softmax for o in SOFTMAXES},
            **{o: _windowed for o in WINDOWED},
            **{o: _reduce for o in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin",
                                    "ReduceProd", "ReduceL1", "ReduceL2", "ArgMax", "ArgMin")}}.get(op)


def _emit(ed: Editor, node: onnx.NodeProto, inputs: list[str], i: int, axis: int, **override) -> int:
    """The part-``i`` copy of ``node`` reading ``inputs``; returns the parts' axis."""
    outputs = [_part_name(ed, o, i) if o else "" for o in node.output]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    attrs.update(override)
    ed.make_node(node.op_type, inputs, outputs, f"{node.name or node.op_type}_part{i}",
                 domain=node.domain, **attrs)
    return axis


def _part_input(ed: Editor, node, name: str, parted, i: int, out_axis: int, out_rank: int) -> str:
    """Part ``i`` of input ``name``: its part, a slice of a constant, or the tensor itself."""
    if not name:
        return name
    if name in parted:
        return parted[name].names[i]
    shape = _shape(ed, name, node)
    aligned = out_axis - (out_rank - len(shape))
    if aligned < 0 or shape[aligned] == 1:
        return name
    value = ed.constant(name)
    sizes = next(parted[n] for n in node.input if n in parted).sizes
    if value is None or shape[aligned] != sum(sizes):
        raise SurgeryError(f"{node.op_type} node {node_label(node)!r}: its input {name!r} "
                           f"(shape {shape}) spans the distributed axis but is not a constant "
                           f"of the concatenated size {sum(sizes)}")
    start = int(np.sum(sizes[:i]))
    return ed.add_initializer(np.take(value, range(start, start + sizes[i]), axis=aligned),
                              f"{name}_part{i}")


def _elementwise(ed, node, parted, i):
    out_rank = len(_shape(ed, node.output[0], node))
    axes = {out_rank - len(_shape(ed, n, node)) + parted[n].axis for n in node.input if n in parted}
    if len(axes) != 1:
        raise SurgeryError(f"{node.op_type} node {node_label(node)!r} combines parts cut on "
                           "different axes")
    axis = axes.pop()
    inputs = [_part_input(ed, node, n, parted, i, axis, out_rank) for n in node.input]
    return _emit(ed, node, inputs, i, axis)


def _reshape(ed, node, parted, i):
    src = parted[node.input[0]]
    before, after = _shape(ed, node.input[0], node), _shape(ed, node.output[0], node)
    lead = int(np.prod(before[:src.axis]))
    total = before[src.axis]
    for axis in range(len(after)):
        if int(np.prod(after[:axis])) == lead and after[axis] == total:
            shape = list(after)
            shape[axis] = src.sizes[i]
            out = _part_name(ed, node.output[0], i)
            make_reshape(ed, src.names[i], out, shape, f"{node.name or node.op_type}_part{i}")
            return axis
    raise SurgeryError(f"{node.op_type} node {node_label(node)!r} merges or splits the "
                       f"distributed axis ({before} -> {after}); it cannot run per part")


def _transpose(ed, node, parted, i):
    src = parted[node.input[0]]
    perm = list(attr(node, "perm") or reversed(range(len(_shape(ed, node.input[0], node)))))
    return _emit(ed, node, [src.names[i]], i, perm.index(src.axis))


def _softmax(ed, node, parted, i):
    src = parted[node.input[0]]
    rank = len(_shape(ed, node.input[0], node))
    axis = attr(node, "axis", -1 if ed.opset >= 13 else 1) % rank
    clash = axis == src.axis if ed.opset >= 13 else src.axis >= axis
    if clash:
        raise SurgeryError(f"{node.op_type} node {node_label(node)!r} normalises over the "
                           f"distributed axis {src.axis}; it cannot run per part")
    return _emit(ed, node, [src.names[i]], i, src.axis)


def _concat(ed, node, parted, i):
    rank = len(_shape(ed, node.output[0], node))
    axis = attr(node, "axis") % rank
    src = next(parted[n] for n in node.input if n in parted)
    if axis == src.axis:
        raise SurgeryError(f"Concat node {node_label(node)!r} joins on the distributed axis too; "
                           "list it in split_concats instead")
    inputs = [_part_input(ed, node, n, parted, i, src.axis, rank) for n in node.input]
    return _emit(ed, node, inputs, i, src.axis)


def _split(ed, node, parted, i):
    src = parted[node.input[0]]
    rank = len(_shape(ed, node.input[0], node))
    axis = attr(node, "axis", 0) % rank
    if axis == src.axis:
        raise SurgeryError(f"Split node {node_label(node)!r} cuts the distributed axis")
    return _emit(ed, node, [src.names[i]] + list(node.input[1:]), i, src.axis)
    if split_sizes(ed, node, _shape(ed, node.input[0], node)[axis]) is None:
        raise SurgeryError(f"Split node {node_label(node)!r}: its sizes are not constant")


def _slice(ed, node, parted, i):
    src = parted[node.input[0]]
    shape = _shape(ed, node.input[0], node)
    spec = slice_spec(ed, node, len(shape))
    if spec is None:
        raise SurgeryError(f"Slice node {node_label(node)!r}: its starts/ends are not constant")
    for axis, start, end, step in spec:
        full = (start in (0,) or start <= -shape[axis]) and end >= shape[axis] and step == 1
        if axis == src.axis and not full:
            raise SurgeryError(f"Slice node {node_label(node)!r} cuts the distributed axis")
    return _emit(ed, node, [src.names[i]] + list(node.input[1:]), i, src.axis)


def _batchnorm(ed, node, parted, i):
    src = parted[node.input[0]]
    if src.axis == 1:
        raise SurgeryError(f"BatchNormalization node {node_label(node)!r}: the distributed axis "
                           "is its channel axis")
    return _emit(ed, node, [src.names[i]] + list(node.input[1:]), i, src.axis)


def _windowed(ed, node, parted, i):
    src = parted[node.input[0]]
    if any(n in parted for n in node.input[1:]):
        raise SurgeryError(f"{node.op_type} node {node_label(node)!r}: its weights are distributed")
    ok = src.axis == 0
    if src.axis >= 2:
        d = src.axis - 2
        kernel = attr(node, "kernel_shape") or _shape(ed, node.input[1], node)[2:]
        strides = attr(node, "strides") or [1] * len(kernel)
        pads = attr(node, "pads") or [0] * (2 * len(kernel))
        auto = attr(node, "auto_pad", b"NOTSET")
        ok = kernel[d] == 1 and strides[d] == 1 and pads[d] == 0 and pads[d + len(kernel)] == 0 \
            and auto in (b"NOTSET", "NOTSET", b"VALID", "VALID")
    if not ok:
        raise SurgeryError(f"{node.op_type} node {node_label(node)!r} mixes values along the "
                           f"distributed axis {src.axis} (kernel, stride or padding > 1 on it)")
    return _emit(ed, node, [src.names[i]] + list(node.input[1:]), i, src.axis)


def _reduce(ed, node, parted, i):
    src = parted[node.input[0]]
    rank = len(_shape(ed, node.input[0], node))
    if node.op_type in ("ArgMax", "ArgMin"):
        axes = [attr(node, "axis", 0) % rank]
    else:
        axes = axes_of(ed, node)
        axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    if src.axis in axes:
        raise SurgeryError(f"{node.op_type} node {node_label(node)!r} reduces the distributed axis")
    keep = attr(node, "keepdims", 1)
    axis = src.axis if keep else src.axis - sum(a < src.axis for a in axes)
    return _emit(ed, node, [src.names[i]] + list(node.input[1:]), i, axis)


def _matmul(ed, node, parted, i):
    a, b = node.input
    rank_a = len(_shape(ed, a, node))
    out_rank = len(_shape(ed, node.output[0], node))
    if b in parted or a not in parted or rank_a < 2 or parted[a].axis >= rank_a - 1:
        raise SurgeryError(f"MatMul node {node_label(node)!r}: only a left operand cut on a row "
                           "or batch axis can be distributed")
    return _emit(ed, node, [parted[a].names[i], b], i, parted[a].axis + out_rank - rank_a)
