"""Linear layers written as an Einsum, as the convolution or MatMul the chip runs.

The chip's table has no Einsum. PyTorch exports a grouped linear layer (DeepFilterNet3's
``GroupedLinearEinsum``: ``torch.einsum("...gi,gih->...gh", x, w)``) as one Einsum of the
activations and a constant weight; DFN3's encoder has three, each a CPU part between NPU parts.
Two forms are rewritten, where the second operand is a constant and the labels of the first
before its last one (or two) are the output's too (``P``, any number of them):

- ``Pi,ih->Ph`` (a plain linear layer): one MatMul (ONNX broadcasts ``P``).
- ``Pgi,gih->Pgh`` (``G`` groups of ``I`` inputs and ``H`` outputs): the activations viewed as
  ``[1, N, G·I, 1]`` (``N`` the product of ``P``: no data moves), Transposed to
  ``[1, G·I, N, 1]`` (channels first), one 1x1 Conv of ``G`` groups (weights ``[G·H, I, 1, 1]``,
  the group's ``I x H`` block transposed), Transposed back and viewed as ``P + [G, H]``. The
  conv does the layer's own multiply-adds; a MatMul by the block-diagonal ``[G·I, G·H]`` weight
  would do ``G`` times as many.

Both compute what the Einsum computes up to the order of a float sum. A rewrite is kept only
where the chip runs every node of it (`legalize.runs_whole`); otherwise the Einsum stays whole
with its reason. `split_model` proves the rewritten model against the original.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from npubuild.surgery.graph import Editor
from npubuild.surgery.opsets import attr, make_reshape
from npubuild.targets.constraints import node_reasons
from npubuild.targets.model import Chip
from npubuild.targets.view import GraphFacts, NodeView

REWRITE = "legal_einsums"


def linear_form(equation: str) -> tuple[int, int] | None:
    """``(P, grouped)`` for an Einsum equation of the forms the module docstring names (``P``
    the number of leading labels, ``grouped`` 1 or 0), or None."""
    parts = equation.replace(" ", "").split("->")
    if len(parts) != 2 or "." in equation:
        return None
    operands, out = parts[0].split(","), parts[1]
    if len(operands) != 2 or any(len(set(s)) != len(s) for s in (*operands, out)):
        return None
    x, w = operands
    grouped = len(w) == 3
    if len(w) not in (2, 3) or len(x) < len(w):
        return None
    lead = x[:len(x) - len(w) + 1]
    if (w[:-1] != x[len(lead):] or out != lead + w[:-2] + w[-1] or
            set(lead) & set(w)):
        return None
    return len(lead), int(grouped)


def legal_einsums(model: onnx.ModelProto, chip: Chip, keep: set[str] = frozenset()
                  ) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with every Einsum the chip refuses (but those whose output is in ``keep``)
    that is a linear layer of a constant weight written as a MatMul or a grouped Conv where the
    chip runs all of it (module docstring); the names of the MatMuls and Convs made, in graph
    order ([] and ``model`` itself when none is)."""
    from npubuild.split.legalize import kept_rewrite
    from npubuild.split.plan import infer

    if not any(n.op_type == "Einsum" for n in model.graph.node):
        return model, []
    inferred = infer(model)
    facts = GraphFacts.from_model(inferred)
    ed = Editor(model, REWRITE)
    chosen = []
    for node in inferred.graph.node:
        if node.op_type != "Einsum" or len(node.input) != 2 or not node.output or \
                node.output[0] in keep or not node_reasons(NodeView(node, facts), chip):
            continue
        form = linear_form(attr(node, "equation", b"").decode()
                           if isinstance(attr(node, "equation", b""), bytes)
                           else str(attr(node, "equation", "")))
        weight = ed.constant(node.input[1])
        shape = ed.shape(node.input[0])
        if form is not None and weight is not None and shape is not None and \
                all(isinstance(d, int) and d > 0 for d in shape):
            chosen.append(node.output[0])
    if not chosen:
        return model, []
    rewritten, made, legal = kept_rewrite(model, chosen, _rewrite, chip)
    kernels = {made[out][-3 if len(made[out]) > 1 else 0] for out in legal}
    order = {n.name: i for i, n in enumerate(rewritten.graph.node)}
    return rewritten, sorted(kernels, key=lambda n: order.get(n, len(order)))


def _rewrite(model: onnx.ModelProto, outputs: list[str]
             ) -> tuple[onnx.ModelProto, dict[str, list[str]]]:
    """``model`` with the Einsums computing ``outputs`` written as the module docstring says;
    per output the names of the nodes made."""
    ed = Editor(model, REWRITE)
    ed.freeze_shapes()
    made = {}
    for output in outputs:
        node = ed.producer(output)
        label = node.name or output
        equation = attr(node, "equation", b"")
        equation = equation.decode() if isinstance(equation, bytes) else str(equation)
        _, grouped = linear_form(equation)
        x, weight = node.input[0], ed.constant(node.input[1]).astype(np.float32)
        ed.remove(node)
        if not grouped:
            w = ed.add_initializer(weight, f"{output}/weight")
            made[output] = [ed.make_node("MatMul", [x, w], [output], f"{label}/matmul").name]
            continue
        groups, inputs, hidden = weight.shape
        lead = ed.shape(x)[:-2]
        rows = math.prod(lead)
        names = []
        viewed, first, conv, back = (ed.unique_tensor(f"{output}/{s}")
                                     for s in ("view", "channels_first", "conv", "channels_last"))
        names.append(make_reshape(ed, x, viewed, [1, rows, groups * inputs, 1],
                                  f"{label}/view").name)
        names.append(ed.make_node("Transpose", [viewed], [first], f"{label}/to_channels",
                                  perm=[0, 2, 1, 3]).name)
        kernel = weight.transpose(0, 2, 1).reshape(groups * hidden, inputs, 1, 1)
        w = ed.add_initializer(np.ascontiguousarray(kernel), f"{output}/weight")
        names.append(ed.make_node("Conv", [first, w], [conv], f"{label}/grouped_conv",
                                  kernel_shape=[1, 1], group=groups).name)
        names.append(ed.make_node("Transpose", [conv], [back], f"{label}/to_rows",
                                  perm=[0, 2, 1, 3]).name)
        names.append(make_reshape(ed, back, output, [*lead, groups, hidden],
                                  f"{label}/unview").name)
        made[output] = names
    ed.thaw_shapes()
    return ed.finish(), made
