"""Products by one constant weight of moved parts of one tensor, computed once.

A Gemm, or a MatMul by a constant 2-D right operand, multiplies along its input's last axis,
row by row; a move that leaves that axis alone (a Gather of constant indices on another axis,
a Slice of other axes, a Squeeze or an Unsqueeze of other axes) commutes with it. An unrolled
recurrence reads its sequence one step at a time and multiplies each step by the same input
weights: tf2onnx writes a Keras RNN it cannot map to an ONNX LSTM as a ``Loop``
(`npubuild.frontends.loops` unrolls it into one ``Gemm(Gather(x, t), W)`` per step), and a
PyTorch cell run in a Python loop traces the same way. On the NPU each step's product is a
layer of its own that loads the whole weight again for one row (nakdimon: 256 Gemms of
400x1600 weights, four weights in all). Computed once over the whole tensor and then moved,
the products are one layer per weight that reads it once, as `npubuild.frontends.recurrent`
writes an ONNX LSTM's input product; the moves run as Slices on the NPU.

Products are hoisted together when they share the tensor their moves start from and the
weight (and a Gemm's bias and attributes), and only where their moved parts together read at
least the whole tensor, so the hoisted product never multiplies more rows than the products
it replaces. The same sums in another order: the import stage proves the result within its
folding tolerance.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx

from npubuild.engine.hashing import sha256_array
from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.surgery.graph import Editor
from npubuild.surgery.opsets import attr, axes_of, slice_spec

MOVES = ("Gather", "Slice", "Squeeze", "Unsqueeze")


@dataclass
class _Group:
    """Products of one weight over moved parts of one tensor: (product, moves from the
    product's input up to the tensor), in graph order."""

    tensor: str
    members: list[tuple[onnx.NodeProto, list[onnx.NodeProto]]] = field(default_factory=list)


def hoisted_over_moves(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    """The model with each group of products the module's text describes written as one
    product of the whole tensor and each member's moves of it; the model unchanged when there
    is none. Also how many products became how many."""
    producers = {o: n for n in model.graph.node for o in n.output}
    if not any(n.op_type in ("MatMul", "Gemm") and n.input
               and getattr(producers.get(n.input[0]), "op_type", None) in MOVES
               for n in model.graph.node):
        return model, {}  # shape inference is the cost: not for models with nothing to do
    ed = Editor(model, "products_hoisted")
    ed.freeze_shapes()
    groups: dict[tuple, _Group] = {}
    digests: dict[str, str] = {}
    for node in ed.graph.node:
        key = _product_key(ed, node, digests)
        moves = _moves_to_root(ed, node.input[0]) if key else []
        if moves:
            root = moves[-1].input[0]
            groups.setdefault((root, *key), _Group(root)).members.append((node, moves))
    chosen = [(key, g) for key, g in groups.items() if len(g.members) > 1 and _covers(ed, g)]
    if not chosen:
        return model, {}
    for _, group in chosen:
        biases = [_bias(ed, product) for product, _ in group.members]
        shared = biases[0] is not None and all(
            b is not None and np.array_equal(b, biases[0]) for b in biases)
        whole = _whole_product(ed, group, biases[0] if shared else None)
        for (product, moves), bias in zip(group.members, biases):
            _read_moved(ed, product, moves, whole, None if shared else bias)
    ed.thaw_shapes()
    return ed.finish(), {"products": sum(len(g.members) for _, g in chosen),
                         "hoisted": len(chosen)}


def _product_key(ed: Editor, node: onnx.NodeProto, digests: dict[str, str]) -> tuple | None:
    """What makes two products the same function of their input rows, their bias aside (the
    weight by content: an unrolled loop may fold each iteration's copy under its own name), or
    None when ``node`` is not a product by a constant weight along its input's last axis."""
    if node.domain not in STANDARD_DOMAINS or node.op_type not in ("MatMul", "Gemm") \
            or len(node.input) < 2:
        return None
    weight = ed.constant(node.input[1])
    if weight is None or weight.ndim != 2 or ed.constant(node.input[0]) is not None:
        return None
    if node.op_type == "MatMul":
        return (_digest(ed, node.input[1], digests), 0, 1.0)
    if attr(node, "transA", 0):
        return None
    bias = node.input[2] if len(node.input) > 2 else ""
    if bias:  # import wrote a computed C as an Add (`computed_gemm_biases_as_add`) before
        value = ed.constant(bias)
        columns = weight.shape[0] if attr(node, "transB", 0) else weight.shape[1]
        if value is None or value.size not in (1, columns):  # a bias per row does not move
            return None
    return (_digest(ed, node.input[1], digests), int(attr(node, "transB", 0)),
            float(attr(node, "alpha", 1.0)))


def _bias(ed: Editor, product: onnx.NodeProto) -> np.ndarray | None:
    """A Gemm's C times beta, as one row (None: no C)."""
    if product.op_type != "Gemm" or len(product.input) < 3 or not product.input[2]:
        return None
    value = ed.constant(product.input[2])
    return np.ravel(value * np.asarray(attr(product, "beta", 1.0), value.dtype))


def _digest(ed: Editor, name: str, digests: dict[str, str]) -> str:
    """A constant's content as a key (its dtype, shape and bytes); "" for no input."""
    if not name:
        return ""
    if name not in digests:
        digests[name] = sha256_array(ed.constant(name)).hex()
    return digests[name]


def _moves_to_root(ed: Editor, tensor: str) -> list[onnx.NodeProto]:
    """The chain of moves that leave the last axis alone from ``tensor`` up (nearest first),
    as far as it goes; [] when ``tensor`` is not such a move's output."""
    chain: list[onnx.NodeProto] = []
    node = ed.producer(tensor)
    while node is not None and _keeps_last_axis(ed, node):
        chain.append(node)
        node = ed.producer(node.input[0])
    return chain


def _keeps_last_axis(ed: Editor, node: onnx.NodeProto) -> bool:
    if node.op_type not in MOVES or node.domain not in STANDARD_DOMAINS:
        return False
    shape = ed.shape(node.input[0])
    if shape is None or not shape or ed.constant(node.input[0]) is not None:
        return False
    last = len(shape) - 1
    if node.op_type == "Gather":
        return (ed.constant(node.input[1]) is not None
                and attr(node, "axis", 0) % len(shape) != last)
    if node.op_type == "Slice":
        spec = slice_spec(ed, node, len(shape))
        return spec is not None and all(axis != last for axis, *_ in spec)
    axes = axes_of(ed, node)
    if node.op_type == "Squeeze":
        if axes is None:
            if len(node.input) > 1 and node.input[1]:
                return False  # computed axes
            axes = [i for i, d in enumerate(shape) if d == 1]  # every axis of size 1
        return all(a % len(shape) != last for a in axes)
    if axes is None:  # Unsqueeze: axes of the output
        return False
    rank = len(shape) + len(axes)
    return all(a % rank != rank - 1 for a in axes)


def _covers(ed: Editor, group: _Group) -> bool:
    """Whether the members' moved parts together hold at least as many elements as the tensor:
    the hoisted product then multiplies no more rows than the members did."""
    whole = ed.shape(group.tensor)
    parts = [ed.shape(product.input[0]) for product, _ in group.members]
    if whole is None or any(p is None for p in parts):
        return False
    return sum(int(np.prod(p)) for p in parts) >= int(np.prod(whole))


def _whole_product(ed: Editor, group: _Group, bias: np.ndarray | None) -> str:
    """The members' function of rows applied to the whole tensor: a MatMul by the weight as the
    first member reads it (a Gemm's transposed and scaled), and ``bias`` added when given."""
    product = group.members[0][0]
    hint = f"{product.name or product.output[0]}/whole"
    weight_name = product.input[1]
    transposed = product.op_type == "Gemm" and attr(product, "transB", 0)
    alpha = float(attr(product, "alpha", 1.0)) if product.op_type == "Gemm" else 1.0
    if transposed or alpha != 1.0:
        weight = ed.constant(weight_name)
        weight = weight.T if transposed else weight
        weight_name = ed.add_initializer(
            np.ascontiguousarray(weight * np.asarray(alpha, weight.dtype)), f"{weight_name}/as_matmul")
    out = ed.unique_tensor(hint)
    if bias is None:
        ed.make_node("MatMul", [group.tensor, weight_name], [out], hint)
        return out
    rows = ed.unique_tensor(f"{hint}/product")
    ed.make_node("MatMul", [group.tensor, weight_name], [rows], f"{hint}/product")
    ed.make_node("Add", [rows, ed.add_initializer(bias, f"{hint}/bias")], [out], f"{hint}/bias")
    return out


def _read_moved(ed: Editor, product: onnx.NodeProto, moves: list[onnx.NodeProto],
                whole: str, bias: np.ndarray | None) -> None:
    """``product`` replaced by its moves (farthest first) applied to ``whole``, and ``bias``
    added when given: its output now comes from the last of them, under its own name."""
    source = whole
    for move in reversed(moves[1:]):
        out = ed.unique_tensor(f"{move.output[0]}/of_product")
        copy = ed.make_node(move.op_type, [source, *move.input[1:]], [out], move.name or out)
        copy.attribute.extend(move.attribute)
        source = out
    outputs = list(product.output)
    if bias is not None:
        moved = ed.unique_tensor(f"{outputs[0]}/without_bias")
        ed.make_node("Add", [moved, ed.add_initializer(bias, f"{product.name}/bias")], outputs,
                     f"{product.name or outputs[0]}/bias")
        outputs = [moved]
    nearest = onnx.NodeProto()
    nearest.CopyFrom(moves[0])
    nearest.input[0], nearest.name = source, product.name
    nearest.ClearField("output")
    nearest.output.extend(outputs)
    product.CopyFrom(nearest)
