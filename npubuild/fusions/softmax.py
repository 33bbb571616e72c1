"""The softmax exporters write out in primitives, for import to write as one ONNX ``Softmax``
(`npubuild.frontends.onnx.softmaxes_as_op`):

    m = ReduceMax(x) [then Max(m, -inf)]                  (jax.nn.softmax: its ``initial``)
    e = Exp(x - m); y = e / ReduceSum(e)  or  e · Reciprocal(ReduceSum(e))
    e = Exp(x);     y = e / ReduceSum(e)                  (no shift: the same where it does not
                                                           overflow, which Softmax cannot)

Both reductions take one and the same axis; with keepdims, or without and broadcast back
through a Reshape to the kept shape (and an Expand to it, as jax2tf writes it). Not a fusion
rule: chips run the ONNX op, so import writes it for every recipe.
"""

from __future__ import annotations

import itertools

import lazy_loader as lazy

from npubuild.fusions.graph import GraphView
from npubuild.fusions.pattern import Const, Match, Op, pattern
from npubuild.fusions.reductions import (BROADCASTS, broadcast_back, broadcast_wrong, reduced_axes,
                                       reduction)

np = lazy.load("numpy")


def _softmax(shift: str, broadcast: str, divide: str):
    ops, exponent = [], "x"
    if shift != "Unshifted":
        ops.append(reduction("ReduceMax", "x", "max", "max_axes"))
        peak = "max"
        if shift == "Clamped":
            ops.append(Op("Max", ("max", Const("floor")), id="clamped", expose=None))
            peak = "clamped"
        ops += broadcast_back(peak, "peak", broadcast)
        ops.append(Op("Sub", ("x", ops[-1].id), id="shifted", expose=None))
        exponent = "shifted"
    ops += [Op("Exp", (exponent,), id="exp", expose=None),
            reduction("ReduceSum", "exp", "sum", "sum_axes"), *broadcast_back("sum", "total", broadcast)]
    total = ops[-1].id
    if divide == "Div":
        ops.append(Op("Div", ("exp", total), id="softmax", expose=None))
    else:
        ops += [Op("Reciprocal", (total,), id="inverse", expose=None),
                Op("Mul", ("exp", "inverse"), id="softmax", expose=None)]
    return pattern(*ops, tag=shift + broadcast + divide)


SOFTMAX = tuple(_softmax(*form) for form in itertools.product(
    ("Shifted", "Clamped", "Unshifted"), BROADCASTS, ("Div", "Reciprocal")))


def softmax_axis(view: GraphView, match: Match) -> int | str:
    """The axis the match's softmax normalises (non-negative), or why it is not a softmax."""
    shape = view.shape(match.inputs["x"]) or []
    if not shape:
        return "the input's rank is not known"
    reductions = [r for r in (("max", "max_axes"), ("sum", "sum_axes")) if r[0] in match.nodes]
    axes = [reduced_axes(view, match, *r) for r in reductions]
    if any(a is None or len(a) != 1 for a in axes):
        return f"the reductions take axes {axes}, not one axis"
    axis = {a[0] % len(shape) for a in axes}
    if len(axis) != 1:
        return f"the maximum and the sum reduce different axes {axes}"
    (axis,) = axis
    if "clamped" in match.nodes:
        floor = np.ravel(view.constant(match.consts["floor"]))
        if floor.size != 1 or not floor[0] < -1e38:
            return f"the maximum is clamped at {floor[:2].tolist()}, not at -inf"
    wrong = broadcast_wrong(view, match, [r for r, _ in reductions],
                            [1 if k == axis else d for k, d in enumerate(shape)])
    if wrong:
        return wrong
    return axis
