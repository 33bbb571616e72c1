"""Maxima and sums the chip has no kernel for, written as the MaxPool or the conv it runs.

Three nodes reach the split without an NPU kernel:

- ``Max`` of two or more tensors (Keras' ``Maximum`` layer: DeepCut's chain of eleven, each
  the running maximum of the conv branches). The chip's table names Max, but the quantizer
  lowers only a Max of one tensor and constants (a lookup table).
- ``ReduceMax`` over some axes (PyTorch's ``torch.max(torch.stack([a, b, c], -1), -1)``:
  AttaCut's maximum of three conv branches), not in the chip's table at all.
- ``ReduceSum`` over some axes (a Keras attention layer's weighted sum over time: OSKut's),
  not in the table either; and ``ReduceMean`` over axes the quantizer has no kernel for (only
  H and W of a 4-D tensor: GTCRN's temporal attention averages its subbands over the last
  axis of a [1, 8, 1, 33] tensor), the same Conv with weights ``1/W`` (one value per channel:
  exact in int8 as 1 is).

Each is a pool along one axis of a 4-D view of the data. A ``Max`` of ``k`` tensors of one
shape ``S`` (no constant, no broadcast): each Reshaped to ``[1, C, 1, H]`` (``C`` the product
of all but the last dim, ``H`` the last), Concatenated along axis 2 to ``[1, C, k, H]``, one
MaxPool of kernel ``[k, 1]`` and a Reshape back to ``S``. A ``ReduceMax`` or ``ReduceSum`` over
consecutive axes ``a..b`` of ``S``: Reshaped to ``[1, C, W, H]`` (``C`` the product before
``a``, ``W`` of ``a..b``, ``H`` after ``b``: no data moves), one MaxPool of kernel ``[W, 1]`` or
one depthwise Conv of weights 1 and kernel ``[W, 1]``, and a Reshape to the output's shape
(``keepdims`` either way). A kernel past the chip's ``max_kernel`` is then cut by
`legalize.legal_convs` as any long kernel is. A sum of the whole tensor stays whole, as a mean
of the whole input does (`legalize._legal_pools`): its thousands of values, cut into groups of
taps, would be added in another order than the float model's, past the split's proof.

Both are exact in int8 up to one rounding: the Concat puts the operands on one scale (the one
a kernel for the maximum of two tensors would choose) and the pool picks among them; the conv
sums every value in one accumulator (weights of 1 quantize exactly) and rounds once. A rewrite
is kept only where the chip runs every node of it, after `legal_convs` (`legalize.runs_whole`,
the LMEM fit included); otherwise the node stays whole with its reasons. `split_model` proves
the rewritten model against the original.
"""

from __future__ import annotations

import math

import numpy as np
import onnx

from npubuild.surgery.graph import Editor
from npubuild.surgery.opsets import attr, axes_of, make_reshape
from npubuild.targets.constraints import node_reasons
from npubuild.targets.model import Chip
from npubuild.targets.view import GraphFacts, NodeView

REWRITE = "legal_reductions"
REDUCTIONS = ("Max", "ReduceMax", "ReduceSum", "ReduceMean")
SUMS = {"ReduceSum": "sum", "ReduceMean": "mean"}  # a depthwise Conv of weights 1 (1/W for a mean)


def legal_reductions(model: onnx.ModelProto, chip: Chip, keep: set[str] = frozenset()
                     ) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with every Max of tensors, ReduceMax and ReduceSum the chip refuses (but those
    whose output is in ``keep``) written as a MaxPool or a Conv where the chip runs all of it
    (module docstring); the names of the pools and convs made, in graph order ([] and
    ``model`` itself when none is)."""
    from npubuild.split.legalize import legal_convs, runs_whole
    from npubuild.split.plan import infer

    if not any(n.op_type in REDUCTIONS for n in model.graph.node):
        return model, []  # most models: no second shape inference
    inferred = infer(model)
    facts = GraphFacts.from_model(inferred)
    ed = Editor(model, REWRITE)
    plans = {}
    for node in inferred.graph.node:
        if node.op_type not in REDUCTIONS or not node.output or \
                node.output[0] in keep or not node_reasons(NodeView(node, facts), chip):
            continue
        view = _view(ed, node)
        if view is not None:
            plans[node.output[0]] = view
    if not plans:
        return model, []
    rewritten, made = _rewrite(model, plans)
    legal = runs_whole(legal_convs(rewritten, chip, keep)[0], made, chip)
    if legal != list(plans):
        rewritten, made = _rewrite(model, {out: plans[out] for out in legal}) \
            if legal else (model, {})
    kernels = {made[out][-2] for out in legal}
    order = {n.name: i for i, n in enumerate(rewritten.graph.node)}
    return rewritten, sorted(kernels, key=lambda n: order.get(n, len(order)))


def _view(ed: Editor, node: onnx.NodeProto) -> list[int] | None:
    """The 4-D view ``[1, C, W, H]`` the reduction pools along ``W`` (for a Max of tensors of
    one static shape, ``W`` = 1 per operand, stacked), or None where the node is not one of
    those the module docstring names."""
    out = ed.shape(node.output[0])
    if out is None:
        return None
    if node.op_type == "Max":
        operands = [i for i in node.input if i]
        if len(operands) < 2 or any(ed.is_constant(i) for i in operands) or \
                any(ed.shape(i) != out for i in operands) or not out:
            return None
        return [1, math.prod(out[:-1]), 1, out[-1]]
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
    view = [1, math.prod(shape[:axes[0]]), math.prod(shape[axes[0]:axes[-1] + 1]),
            math.prod(shape[axes[-1] + 1:])]
    if node.op_type in SUMS and view[1] == view[3] == 1:
        return None  # the whole tensor: see the module docstring
    return view


def _rewrite(model: onnx.ModelProto, views: dict[str, list[int]]
             ) -> tuple[onnx.ModelProto, dict[str, list[str]]]:
    """``model`` with the reductions computing the outputs of ``views`` written as Reshapes, a
    Concat (a Max of tensors), a MaxPool or Conv and a Reshape; per output the names of the
    nodes made (the pool or conv last but one)."""
    ed = Editor(model, REWRITE)
    ed.freeze_shapes()
    made = {}
    for output, view in views.items():
        node = ed.producer(output)
        label = node.name or output
        out_shape = ed.shape(output)
        ed.remove(node)
        operands = [i for i in node.input if i] if node.op_type == "Max" else node.input[:1]
        names, viewed = [], []
        for i, operand in enumerate(operands):
            tensor = ed.unique_tensor(f"{output}/view{i}")
            names.append(make_reshape(ed, operand, tensor, view, f"{label}/view{i}").name)
            viewed.append(tensor)
        stacked, window = viewed[0], view[2]
        if node.op_type == "Max":
            stacked, window = ed.unique_tensor(f"{output}/stacked"), len(operands)
            names.append(ed.make_node("Concat", viewed, [stacked], f"{label}/stack",
                                      axis=2).name)
        reduced = ed.unique_tensor(f"{output}/reduced")
        if node.op_type in SUMS:
            weight = 1.0 if node.op_type == "ReduceSum" else 1.0 / window
            ones = ed.add_initializer(np.full((view[1], 1, window, 1), weight, np.float32),
                                      f"{output}/ones")
            names.append(ed.make_node("Conv", [stacked, ones], [reduced],
                                      f"{label}/{SUMS[node.op_type]}",
                                      kernel_shape=[window, 1], group=view[1]).name)
        else:
            names.append(ed.make_node("MaxPool", [stacked], [reduced], f"{label}/pool",
                                      kernel_shape=[window, 1], strides=[1, 1]).name)
        names.append(make_reshape(ed, reduced, output, out_shape, f"{label}/unview").name)
        made[output] = names
    ed.thaw_shapes()
    return ed.finish(), made
