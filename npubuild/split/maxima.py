"""Maxima the chip has no kernel for, written as the MaxPool it runs.

Two spellings of "the larger of several values" reach the split without an NPU kernel:

- ``Max`` of two or more tensors (Keras' ``Maximum`` layer: DeepCut's chain of eleven, each
  the running maximum of the conv branches). The chip's table names Max, but the quantizer
  lowers only a Max of one tensor and constants (a lookup table).
- ``ReduceMax`` over some axes (PyTorch's ``torch.max(torch.stack([a, b, c], -1), -1)``:
  AttaCut's maximum of three conv branches), not in the chip's table at all.

Both are a MaxPool along one axis of a 4-D view of the data. A ``Max`` of ``k`` tensors of
one shape ``S`` (no constant, no broadcast): each Reshaped to ``[1, C, 1, H]`` (``C`` the
product of all but the last dim, ``H`` the last), Concatenated along axis 2 to
``[1, C, k, H]``, one MaxPool of kernel ``[k, 1]`` and a Reshape back to ``S``. A
``ReduceMax`` over consecutive axes ``a..b`` of ``S``: Reshaped to ``[1, C, W, H]`` (``C`` the
product before ``a``, ``W`` of ``a..b``, ``H`` after ``b``: no data moves), one MaxPool of kernel
``[W, 1]`` and a Reshape to the output's shape (``keepdims`` either way).

A maximum of int8 values is exact: the Concat puts the operands on one scale (the one a
kernel for the maximum of two tensors would choose) and the pool picks among them, so the
rewrite adds no rounding beyond that requantization. It is kept only where the chip runs every
node it made (`legalize._passing`, the LMEM fit included); otherwise the node stays whole with
its reasons. `split_model` proves the rewritten model against the original.
"""

from __future__ import annotations

import math

import onnx

from npubuild.surgery.graph import Editor
from npubuild.surgery.opsets import attr, axes_of, make_reshape
from npubuild.targets.constraints import node_reasons
from npubuild.targets.model import Chip
from npubuild.targets.view import GraphFacts, NodeView

REWRITE = "legal_maxima"


def legal_maxima(model: onnx.ModelProto, chip: Chip, keep: set[str] = frozenset()
                 ) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with every Max of tensors and ReduceMax the chip refuses (but those whose
    output is in ``keep``) written as a MaxPool where the chip runs all of it (module
    docstring); the names of the MaxPools made, in graph order ([] and ``model`` itself when
    none is)."""
    from npubuild.split.legalize import _passing
    from npubuild.split.plan import infer

    inferred = infer(model)
    facts = GraphFacts.from_model(inferred)
    ed = Editor(model, REWRITE)
    plans = {}
    for node in inferred.graph.node:
        if node.op_type not in ("Max", "ReduceMax") or not node.output or \
                node.output[0] in keep or not node_reasons(NodeView(node, facts), chip):
            continue
        plan = _views(ed, node)
        if plan is not None:
            plans[node.output[0]] = plan
    if not plans:
        return model, []
    rewritten, made = _rewrite(model, plans)
    legal = _passing(rewritten, made, chip)
    if legal != list(plans):
        rewritten, made = _rewrite(model, {out: plans[out] for out in legal}) \
            if legal else (model, {})
    pools = {made[out][-2] for out in legal}
    order = {n.name: i for i, n in enumerate(rewritten.graph.node)}
    return rewritten, sorted(pools, key=lambda n: order.get(n, len(order)))


def _views(ed: Editor, node: onnx.NodeProto) -> tuple[list[int], list[int]] | None:
    """The 4-D view each operand is read as and the pool's kernel, for a Max of tensors of one
    static shape or a ReduceMax over consecutive axes of a static shape; None otherwise."""
    out = ed.shape(node.output[0])
    if out is None:
        return None
    if node.op_type == "Max":
        operands = [i for i in node.input if i]
        shapes = [ed.shape(i) for i in operands]
        if len(operands) < 2 or any(ed.is_constant(i) for i in operands) or \
                any(s != out for s in shapes) or not out:
            return None
        return [1, math.prod(out[:-1]), 1, out[-1]], [len(operands), 1]
    shape = ed.shape(node.input[0])
    axes = axes_of(ed, node)
    if shape is None or not shape or (axes is None and len(node.input) > 1 and node.input[1]):
        return None
    if not axes:
        if attr(node, "noop_with_empty_axes", 0):
            return None
        axes = list(range(len(shape)))
    axes = sorted(a % len(shape) for a in axes)
    if axes != list(range(axes[0], axes[-1] + 1)):
        return None
    window = math.prod(shape[axes[0]:axes[-1] + 1])
    return [1, math.prod(shape[:axes[0]]), window, math.prod(shape[axes[-1] + 1:])], [window, 1]


def _rewrite(model: onnx.ModelProto, plans: dict[str, tuple[list[int], list[int]]]
             ) -> tuple[onnx.ModelProto, dict[str, list[str]]]:
    """``model`` with the maxima computing the outputs of ``plans`` written as Reshapes, a
    Concat (a Max of tensors), a MaxPool and a Reshape; per output the names of the nodes
    made (the MaxPool last but one)."""
    ed = Editor(model, REWRITE)
    ed.freeze_shapes()
    made = {}
    for output, (view, kernel) in plans.items():
        node = ed.producer(output)
        label = node.name or output
        out_shape = ed.shape(output)
        ed.remove(node)
        names, viewed = [], []
        operands = [i for i in node.input if i] if node.op_type == "Max" else node.input[:1]
        for i, operand in enumerate(operands):
            tensor = ed.unique_tensor(f"{output}/view{i}")
            names.append(make_reshape(ed, operand, tensor, view, f"{label}/view{i}").name)
            viewed.append(tensor)
        stacked = viewed[0]
        if node.op_type == "Max":
            stacked = ed.unique_tensor(f"{output}/stacked")
            names.append(ed.make_node("Concat", viewed, [stacked], f"{label}/stack",
                                      axis=2).name)
        pooled = ed.unique_tensor(f"{output}/pooled")
        names.append(ed.make_node("MaxPool", [stacked], [pooled], f"{label}/pool",
                                  kernel_shape=kernel, strides=[1, 1]).name)
        names.append(make_reshape(ed, pooled, output, out_shape, f"{label}/unview").name)
        made[output] = names
    ed.thaw_shapes()
    return ed.finish(), made
