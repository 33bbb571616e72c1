"""Additive attention masks written with a bounded value, so the scores they join quantize.

Transformer exports mask attention before its Softmax by adding a huge negative number to the
scores of the positions a query may not see: Hugging Face writes ``(1 - mask) ·
finfo(float32).min`` (-3.4e38) through Unsqueeze, Cast, Sub and Mul; older exports -10000 or
-1e9; others ``Where(mask, 0, NEG)``, a masked fill ``Where(masked, NEG, scores)``, or a
constant causal bias of 0 and NEG. The Softmax gives such a position ``exp(s + NEG - max) = 0``,
which any value far enough below the row's maximum gives too; but the tensor that carries NEG
spans 3.4e38, which no int8 or int16 scale can share with scores that need hundredths, so the
quantizer kept those Adds in float on the CPU (paraphrase-MiniLM-L3-v2: three, one per layer).

`bounded_masks` writes each such constant (each value 0 or below ``-MASK_BOUND``, at least one
of the latter) with ``-MASK_BOUND`` for those values, where it is the NEG operand of a Mul or
Where or the bias of an Add, and what that node computes reaches nothing but Softmax inputs:
through data movement (Reshape, Unsqueeze, Squeeze, Expand, Transpose, Flatten, Identity, a Cast
between float types), further Adds (a causal bias plus a padding bias, position biases), a
Where's value branch, or a Max (exports that clamp the sum at finfo.min). No Mul or Div may lie
between: a scale would shrink the bound. ONNX Runtime's transformer optimizer reads the same
Mul/Sub/Cast/Unsqueeze path as its fused Attention's mask input, whose kernel masks with -10000
(``mask_filter_value``) whatever constant the export wrote: the value is the export's choice,
not the model's.

``MASK_BOUND`` is 256 (a power of two, exact in float16 and bfloat16 too): float32's ``exp``
is 0 below -104, so a masked score still gets exactly 0 wherever the row's kept scores lie
within 152 of its maximum (attention scores span tens), and the rewritten model is equal to the
original there. The masked sum then spans 256 plus the scores, which int16 resolves to a few
thousandths. A row with no position kept differs: there ``finfo.min`` swamps every score and
the export gives each position 1/n, while the bounded mask shifts all scores alike and the
row attends as if unmasked (as ONNX Runtime's Attention kernel with its -10000 and Hugging
Face's SDPA path, `_unmask_unattended`, do). Import proves the result on its proof inputs and
keeps the model as it was where that proof fails.
"""

from __future__ import annotations

from collections import defaultdict

import numpy as np
import onnx

from npubuild.fusions.graph import GraphView, attribute
from npubuild.surgery.graph import Editor

MASK_BOUND = 256.0

# ops a mask's values pass through unchanged on their way to the Softmax, and the inputs that
# carry them (None: any)
PASSING = {"Reshape": (0,), "Unsqueeze": (0,), "Squeeze": (0,), "Expand": (0,), "Transpose": (0,),
           "Flatten": (0,), "Identity": (0,), "Cast": (0,), "Add": (0, 1), "Max": None,
           "Where": (1, 2)}
FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
               onnx.TensorProto.DOUBLE}


def bounded_masks(model: onnx.ModelProto) -> tuple[onnx.ModelProto, int]:
    """The model with each huge negative mask constant that reaches only Softmax inputs written
    as ``-MASK_BOUND`` (see the module docstring), and how many constants it wrote; the model
    itself when there is none."""
    if not any(n.op_type == "Softmax" for n in model.graph.node):
        return model, 0
    view = GraphView(model)
    uses = mask_uses(view)
    if not uses:
        return model, 0
    edit = Editor(model, "bounded_masks")
    for constant, places in uses.items():
        bounded = edit.add_initializer(bound(view.constant(constant)), constant + "/bounded")
        for index, slot in places:
            edit.graph.node[index].input[slot] = bounded
    edit.touch()
    return edit.finish(), len(uses)


def mask_uses(view: GraphView) -> dict[str, list[tuple[int, int]]]:
    """Each mask constant (by name, in graph order) and the (node index, input slot) pairs where
    a Mul, Where or Add reads it as a mask whose values reach only Softmax inputs."""
    uses: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for index, node in enumerate(view.nodes):
        if node.op_type not in ("Mul", "Where", "Add") or node.domain not in ("", "ai.onnx"):
            continue
        slots = (1, 2) if node.op_type == "Where" else (0, 1)
        for slot in slots:
            name = node.input[slot] if slot < len(node.input) else ""
            if name and is_mask_constant(view.constant(name)) and \
                    reaches_only_softmax(view, node.output[0]):
                uses[name].append((index, slot))
    return dict(uses)


def is_mask_constant(value: np.ndarray | None) -> bool:
    """A float constant whose values are each 0 or below ``-MASK_BOUND`` (at least one; -inf
    counts)."""
    if value is None or value.dtype.kind != "f" or value.size == 0 or np.isnan(value).any():
        return False
    masked = value < -MASK_BOUND
    return bool(masked.any()) and bool(np.all(masked | (value == 0)))


def bound(value: np.ndarray) -> np.ndarray:
    """``value`` with every entry below ``-MASK_BOUND`` written as ``-MASK_BOUND``, in its
    dtype."""
    return np.maximum(value, -MASK_BOUND).astype(value.dtype)


def reaches_only_softmax(view: GraphView, tensor: str) -> bool:
    """Whether every path from ``tensor`` ends at a Softmax's input through ops that pass its
    values on unchanged (`PASSING`), never at a graph output or another op."""
    seen: set[str] = set()
    pending = [tensor]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in view.outputs or not view.consumers.get(name):
            return False
        for index in view.consumers[name]:
            node = view.nodes[index]
            if node.domain not in ("", "ai.onnx") or has_subgraphs(node):
                return False
            if node.op_type == "Softmax" and list(node.input) == [name]:
                continue
            if not passes_on(node, name):
                return False
            pending.append(node.output[0])
    return True


def passes_on(node: onnx.NodeProto, name: str) -> bool:
    """Whether ``node`` hands the values it reads at ``name`` on unchanged (`PASSING`)."""
    if node.op_type not in PASSING:
        return False
    slots = PASSING[node.op_type]
    read_at = [i for i, t in enumerate(node.input) if t == name]
    if slots is not None and any(i not in slots for i in read_at):
        return False
    if node.op_type == "Cast":
        return attribute(node, "to") in FLOAT_TYPES
    return True


def has_subgraphs(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in node.attribute)
