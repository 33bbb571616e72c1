"""``reshape_to_4d``: keep NPU-bound tensors 4-D (seed 002's YOLOv8 head rewrite).

Two moves, both pure data movement:

1. ``split_concats`` (optional): each named Concat moves to the graph outputs — everything after
   it runs once per concatenated input (see ``distribute``). For YOLOv8 this is the Concat of the
   three scales' flattened maps: each scale then decodes its own boxes and classes, and the
   outputs come out per scale.
2. Every tensor of rank < 4 in the chosen nodes is carried as 4-D, with leading 1s: Reshape,
   Flatten, Squeeze, Unsqueeze and Expand get 4-D targets; Transpose perms, Softmax/Concat/
   Split/Slice/Reduce axes shift; constants read by elementwise ops gain leading 1s. Tensors
   entering from outside the chosen nodes are reshaped on the way in, and reshaped back for
   readers outside them.

Graph outputs become 4-D (``graph_outputs: 4d``; a split output becomes one output per part,
named ``<output>_<i>`` unless ``output_names`` says otherwise), or keep their names and shapes
through a final Concat/Reshape (``original``). Either way the recorded origins let the proof —
and later stages — rebuild the original outputs.
"""

from __future__ import annotations

from typing import Literal

import lazy_loader as lazy
from pydantic import Field, model_validator

from npubuild.surgery import StepArgs, SurgeryError, rewrite
from npubuild.surgery import origins as org
from npubuild.surgery.distribute import ELEMENTWISE, Parted, distribute
from npubuild.surgery.graph import Editor, node_label
from npubuild.surgery.opsets import (attr, axes_of, make_axes_node, make_reshape, make_slice,
                                     set_attr, slice_spec)

np = lazy.load("numpy")
onnx = lazy.load("onnx")


class ReshapeTo4dArgs(StepArgs):
    """Arguments of ``reshape_to_4d``."""

    nodes: list[str] = Field(
        default_factory=list,
        description="Nodes to rewrite (names or globs, e.g. '/model.22/*'); default: every node "
                    "that reads or writes a tensor of rank other than 4.")
    split_concats: list[str] = Field(
        default_factory=list,
        description="Concat nodes to move to the graph outputs: what follows each runs once per "
                    "input (e.g. YOLOv8's '/model.22/Concat_6' joining the three scales).")
    graph_outputs: Literal["4d", "original"] = Field(
        "4d", description="'4d': outputs become 4-D, and an output split by split_concats becomes "
                          "one output per part; 'original': outputs keep their names and shapes "
                          "through a final Concat/Reshape (left for the CPU).")
    output_names: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Names of the parts of a split output, e.g. {output0: [p3, p4, p5]} "
                    "(default: <output>_0, <output>_1, ...).")

    @model_validator(mode="after")
    def _names_need_4d_outputs(self):
        if self.output_names and self.graph_outputs != "4d":
            raise ValueError("output_names names the parts of split outputs, which exist only "
                             "with graph_outputs: 4d")
        return self


@rewrite("reshape_to_4d", ReshapeTo4dArgs, data_movement=True)
def reshape_to_4d(model: onnx.ModelProto, args: ReshapeTo4dArgs) -> onnx.ModelProto:
    """Carry non-4-D tensors as 4-D; optionally run per part what follows a Concat."""
    ed = Editor(model, "reshape_to_4d")
    shapes = {name: ed.shape(name) for name in ed.output_names}
    unknown = [name for name, shape in shapes.items() if shape is None]
    if unknown:
        raise SurgeryError(f"the shape of output {unknown[0]!r} is not known",
                           hint="fix the input shapes in model.inputs and run fold_constants first")
    split = {}
    for name in args.split_concats:
        split.update(distribute(ed, name))
    origins = _expose_parts(ed, split, args, shapes) if args.graph_outputs == "4d" else {}
    region = ed.select(args.nodes) if args.nodes else None
    sink_reshapes(ed, region)
    lift(ed, region)
    origins.update(_finish_outputs(ed, shapes, args.graph_outputs))
    merge_reshapes(ed)
    _drop_noop_reshapes(ed)
    result = ed.finish()
    org.write(result, {"outputs": origins})
    return result


def _expose_parts(ed: Editor, split: dict[str, Parted], args: ReshapeTo4dArgs,
                  shapes: dict[str, list[int]]) -> dict:
    """Split outputs become one graph output per part (the parts' Concat is dropped)."""
    origins = {}
    stray = sorted(set(args.output_names) - set(split))
    if stray:
        raise SurgeryError(f"output_names names {stray[0]!r}, which split_concats does not "
                           f"split (split outputs: {', '.join(split) or 'none'})")
    for output, part in split.items():
        names = args.output_names.get(output) or [f"{output}_{i}" for i in range(len(part.names))]
        if len(names) != len(part.names):
            raise SurgeryError(f"output_names gives {len(names)} names for {output!r}, which "
                               f"is split into {len(part.names)} parts")
        taken = sorted(set(names) & (ed.tensor_names() - set(part.names)))
        if taken or len(set(names)) != len(names):
            raise SurgeryError(f"output_names for {output!r}: {taken[0] if taken else names!r} "
                               "is already a tensor name (or repeated)")
        ed.remove(ed.producer(output))
        for old, new in zip(part.names, names):
            ed.rename(old, new)
        values = list(ed.graph.output)
        index = [v.name for v in values].index(output)
        elem = values[index].type.tensor_type.elem_type
        parts = [onnx.helper.make_tensor_value_info(n, elem, None) for n in names]
        ed.graph.ClearField("output")
        ed.graph.output.extend(values[:index] + parts + values[index + 1:])
        rank = len(shapes[output])
        origins[output] = org.parts(names, part.axis + max(0, 4 - rank), shapes[output])
    ed.touch()
    return origins


def _finish_outputs(ed: Editor, shapes: dict[str, list[int]], mode: str) -> dict:
    """Graph outputs after lifting: 4-D as they are, or reshaped back to their old shapes."""
    for name in ed.output_names:
        ed.set_output_shape(name, None)  # the declared shapes are the old ones
    ed.touch()
    found = {}
    for name in list(ed.output_names):
        old, now = shapes.get(name), ed.shape(name)
        if now is None:
            raise SurgeryError(f"the shape of output {name!r} is not known after the rewrite")
        if mode == "original" and old is not None and now != old:
            carrier = ed.unique_tensor(f"{name}_4d")
            ed.rename(name, carrier, graph_output=False)
            make_reshape(ed, carrier, name, old, f"{name}_restore")
            ed.set_output_shape(name, old)
        else:
            ed.set_output_shape(name, now)
            if old is not None and now != old:
                found[name] = org.parts([name], None, old)
    return found


RESHAPES = ("Reshape", "Flatten", "Squeeze", "Unsqueeze")


def sink_reshapes(ed: Editor, region: list[onnx.NodeProto] | None) -> None:
    """An elementwise op on a reshaped 4-D tensor runs on the 4-D tensor, before the reshape."""
    allowed = None if region is None else {id(n) for n in region}
    moved = True
    while moved:
        moved = False
        for node in list(ed.graph.node):
            if (allowed is None or id(node) in allowed) and _sink_one(ed, node):
                moved = True
    ed.prune()


def _sink_one(ed: Editor, node: onnx.NodeProto) -> bool:
    if node.op_type not in ELEMENTWISE or len(node.output) != 1:
        return False
    data = [i for i, name in enumerate(node.input) if name and not ed.is_constant(name)]
    scalars = all(ed.constant(name).size == 1 for i, name in enumerate(node.input)
                  if name and i not in data)
    if len(data) != 1 or not scalars:
        return False
    t = node.input[data[0]]
    reshape = ed.producer(t)
    if reshape is None or reshape.op_type not in RESHAPES or len(ed.consumers(t)) != 1 \
            or ed.is_graph_output(t):
        return False
    source, out = reshape.input[0], node.output[0]
    source_shape, out_shape = ed.shape(source), ed.shape(out)
    if source_shape is None or len(source_shape) != 4 or out_shape is None:
        return False
    moved = ed.unique_tensor(f"{out}_4d")
    node.input[data[0]] = source
    node.output[0] = moved
    make_reshape(ed, moved, out, out_shape, f"{node.name or node.op_type}_reshape")
    return True


def merge_reshapes(ed: Editor) -> None:
    """Reshape of a Reshape (read by nothing else) becomes one Reshape."""
    for node in list(ed.graph.node):
        if node.op_type != "Reshape":
            continue
        inner = ed.producer(node.input[0])
        target = ed.shape(node.output[0])
        if inner is None or inner.op_type not in RESHAPES or target is None \
                or len(ed.consumers(node.input[0])) != 1 or ed.is_graph_output(node.input[0]):
            continue
        source, out, name = inner.input[0], node.output[0], node.name or "Reshape"
        ed.remove(node, inner)
        make_reshape(ed, source, out, target, name)
    ed.touch()


def _drop_noop_reshapes(ed: Editor) -> None:
    for node in list(ed.graph.node):
        if node.op_type == "Reshape":
            before, after = ed.shape(node.input[0]), ed.shape(node.output[0])
            if before is not None and before == after:
                try:
                    ed.bypass(node)
                except SurgeryError:
                    continue


# -- lifting -------------------------------------------------------------------------------------

def lift(ed: Editor, region: list[onnx.NodeProto] | None) -> None:
    """Carry every rank < 4 tensor of ``region`` (default: all nodes that touch one) as 4-D."""
    ed.touch()
    ed.freeze_shapes()
    nodes = region if region is not None else [n for n in ed.graph.node if _touches_non4d(ed, n)]
    inside = {id(n) for n in nodes}
    outside_nodes = [n for n in ed.graph.node if id(n) not in inside]  # held: ids stay unique
    outside = {id(n) for n in outside_nodes}
    produced = {o for n in nodes for o in n.output}
    entries: dict[str, str] = {}
    lifted: set[str] = set()
    for node in nodes:
        if not _touches_non4d(ed, node):
            continue
        originals = list(node.input)
        for new in _lift_node(ed, node):
            _substitute_entries(ed, new, originals, produced, entries)
        lifted.update(o for o in node.output if o and _rank(ed, o, node) < 4)
    for name in sorted(lifted):
        readers = [r for r in ed.consumers(name) if id(r) in outside]
        if readers:
            back = ed.unique_tensor(f"{name}_{_rank(ed, name, None)}d")
            ed.replace_uses(name, back, only=readers)
            make_reshape(ed, name, back, ed.shape(name), f"{name}_back")
    ed.thaw_shapes()


def _rank(ed: Editor, name: str, node: onnx.NodeProto | None) -> int:
    shape = ed.shape(name)
    if shape is None:
        where = f" (at node {node_label(node)!r})" if node is not None else ""
        raise SurgeryError(f"the shape of {name!r}{where} is not known",
                           hint="fix the input shapes in model.inputs and run fold_constants first")
    return len(shape)


def _touches_non4d(ed: Editor, node: onnx.NodeProto) -> bool:
    names = [n for n in list(node.input) + list(node.output) if n and not ed.is_constant(n)]
    return any(_rank(ed, n, node) != 4 for n in names)


def _substitute_entries(ed, node, originals, produced, entries) -> None:
    """Inputs coming from outside the region with rank < 4 are reshaped to 4-D on the way in."""
    for i, name in enumerate(node.input):
        if not name or name in produced or name not in originals or ed.is_constant(name):
            continue
        if node.op_type == "Reshape" and i == 0:  # reads any rank already
            continue
        shape = ed.shape(name)
        if shape is None or len(shape) >= 4:
            continue
        if name not in entries:
            entries[name] = ed.unique_tensor(f"{name}_4d")
            make_reshape(ed, name, entries[name], _lifted(shape), f"{name}_to_4d")
        node.input[i] = entries[name]
    ed.touch()


def _lifted(shape: list[int]) -> list[int]:
    return [1] * (4 - len(shape)) + list(shape)


def _lift_node(ed: Editor, node: onnx.NodeProto) -> list[onnx.NodeProto]:
    for name in list(node.input) + list(node.output):
        if name and not ed.is_constant(name) and _rank(ed, name, node) > 4:
            raise SurgeryError(f"{node.op_type} node {node_label(node)!r}: tensor {name!r} has "
                               f"shape {ed.shape(name)}; only tensors of rank <= 4 can be "
                               "carried as 4-D", hint="rewrite this node first, or leave it out "
                                                      "of nodes")
    rule = _LIFT.get(node.op_type) or (_lift_elementwise if node.op_type in ELEMENTWISE else None)
    if rule is None:
        raise SurgeryError(f"{node.op_type} node {node_label(node)!r} reads or writes a tensor of "
                           f"rank {[_rank(ed, n, node) for n in node.output if n]} and has no 4-D "
                           "form here", hint="rewrite it first (e.g. rewrite_gemm_as_conv, "
                                             "fold_constants) or leave it out of nodes")
    return rule(ed, node)


def _shift(ed: Editor, node: onnx.NodeProto, axis: int, tensor: str | None = None) -> int:
    rank = _rank(ed, tensor or node.input[0], node)
    return axis % rank + 4 - rank if rank else axis


def _lift_elementwise(ed, node):
    for i, name in enumerate(node.input):
        value = ed.constant(name) if name else None
        if value is not None and 0 < value.ndim < 4 and not (node.op_type == "Clip" and i > 0):
            node.input[i] = ed.add_initializer(value.reshape(_lifted(list(value.shape))), f"{name}_4d")
    ed.touch()
    return [node]


def _lift_as_reshape(ed, node):
    """Reshape/Flatten/Squeeze/Unsqueeze: one Reshape to the 4-D form of the output."""
    out, data, name = node.output[0], node.input[0], node.name or f"{node.op_type}_{node.output[0]}"
    target = _lifted(ed.static_shape(out, node))
    ed.remove(node)
    return [make_reshape(ed, data, out, target, name)]


def _lift_expand(ed, node):
    target = _lifted(ed.static_shape(node.output[0], node))
    node.input[1] = ed.add_initializer(np.array(target, np.int64), f"{node.name}_shape")
    ed.touch()
    return [node]


def _lift_transpose(ed, node):
    rank = _rank(ed, node.input[0], node)
    perm = attr(node, "perm") or list(reversed(range(rank)))
    k = 4 - rank
    set_attr(node, "perm", list(range(k)) + [p + k for p in perm])
    return [node]


def _lift_axis(default_axis: int | None):
    def rule(ed, node):
        axis = attr(node, "axis", default_axis)
        if axis is None:
            axis = -1 if ed.opset >= 13 else 1
        like = node.output[0] if node.op_type == "Concat" else None
        set_attr(node, "axis", _shift(ed, node, axis, like))
        if node.op_type == "Concat":
            _lift_elementwise(ed, node)
        return [node]
    return rule


def _lift_slice(ed, node):
    rank = _rank(ed, node.input[0], node)
    spec = slice_spec(ed, node, rank)
    if spec is None:
        raise SurgeryError(f"Slice node {node_label(node)!r}: its starts/ends/axes are not constant")
    k = 4 - rank
    data, out, name = node.input[0], node.output[0], node.name or f"Slice_{node.output[0]}"
    ed.remove(node)
    return [make_slice(ed, data, out, [(a + k, s, e, st) for a, s, e, st in spec], name)]


def _lift_reduce(ed, node):
    rank = _rank(ed, node.input[0], node)
    k = 4 - rank
    keep = attr(node, "keepdims", 1)
    if node.op_type in ("ArgMax", "ArgMin"):
        set_attr(node, "axis", attr(node, "axis", 0) % rank + k)
        axes = None
    else:
        axes = axes_of(ed, node)
        axes = list(range(rank)) if axes is None else [a % rank for a in axes]
    out, data, op, name = node.output[0], node.input[0], node.op_type, node.name or node.op_type
    target = _lifted(ed.static_shape(out, node))
    mid = out if keep else ed.unique_tensor(f"{out}_keepdims")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute
             if a.name not in ("axes", "keepdims")}
    ed.remove(node)
    if axes is None:
        new = [ed.make_node(op, [data], [mid], name, keepdims=1, **attrs)]
    else:
        new = [make_axes_node(ed, op, [data], [mid], [a + k for a in axes], name, keepdims=1, **attrs)]
    if not keep:
        new.append(make_reshape(ed, mid, out, target, f"{name}_reshape"))
    return new


def _lift_matmul(ed, node):
    for name in node.input:
        if _rank(ed, name, node) < 2:
            raise SurgeryError(f"MatMul node {node_label(node)!r}: operand {name!r} is 1-D")
    return [node]


def _lift_tile(ed, node):
    repeats = ed.constant(node.input[1])
    if repeats is None:
        raise SurgeryError(f"Tile node {node_label(node)!r}: its repeats are not constant")
    node.input[1] = ed.add_initializer(np.array(_lifted([int(r) for r in repeats]), np.int64),
                                       f"{node.name}_repeats")
    ed.touch()
    return [node]


def _lift_4d_only(ed, node):
    raise SurgeryError(f"{node.op_type} node {node_label(node)!r} works on a tensor of rank "
                       f"{_rank(ed, node.input[0], node)}; leading 1s would change its meaning",
                       hint="leave it out of nodes, or rewrite it first")


_LIFT = {
    "Reshape": _lift_as_reshape, "Flatten": _lift_as_reshape, "Squeeze": _lift_as_reshape,
    "Unsqueeze": _lift_as_reshape, "Expand": _lift_expand, "Transpose": _lift_transpose,
    "Softmax": _lift_axis(None), "LogSoftmax": _lift_axis(None), "Hardmax": _lift_axis(None),
    "Concat": _lift_axis(0), "Split": _lift_axis(0), "Slice": _lift_slice, "MatMul": _lift_matmul,
    "Tile": _lift_tile,
    **{op: _lift_reduce for op in ("ReduceMean", "ReduceSum", "ReduceMax", "ReduceMin", "ReduceProd",
                                   "ReduceL1", "ReduceL2", "ReduceLogSumExp", "ArgMax", "ArgMin")},
    **{op: _lift_4d_only for op in ("Conv", "ConvTranspose", "MaxPool", "AveragePool",
                                    "BatchNormalization", "InstanceNormalization", "Resize",
                                    "GlobalAveragePool", "GlobalMaxPool", "LRN", "DepthToSpace",
                                    "SpaceToDepth")},
}
