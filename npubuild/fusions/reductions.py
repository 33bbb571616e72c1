"""Reductions as exporters write them, for the patterns of written-out normalisations
(`layer_norm`, `softmax`): a reduction that keeps the reduced axes, or one that drops them and
whose result is broadcast back through a Reshape to the kept shape, and an Expand to it (as
jax2tf writes ``broadcast_in_dim``).
"""

from __future__ import annotations

import lazy_loader as lazy

from npubuild.fusions.graph import GraphView, attribute
from npubuild.fusions.pattern import Const, Match, Op

np = lazy.load("numpy")

BROADCASTS = ("ReshapeExpand", "Reshape", "Kept")  # how a reduction's result comes back
_BACK = ("_reshaped", "_expanded")


def reduction(op: str, source: str, op_id: str, axes: str, **attrs) -> Op:
    """A pattern op reducing ``source`` over the axes bound to ``axes`` (an input from opset 18
    on, else an attribute: optional either way); ``attrs`` required values (e.g. keepdims)."""
    return Op(op, (source, Const(axes, True)), id=op_id, attrs=attrs, expose=None)


def broadcast_back(source: str, op_id: str, how: str) -> list[Op]:
    """The ops that bring ``source`` back to the kept shape (``how`` one of `BROADCASTS`; none
    for "Kept"); the last one's id is ``op_id``_reshaped or ``op_id``_expanded."""
    if how == "Kept":
        return []
    ops = [Op("Reshape", (source, Const(f"{op_id}_shape")), id=f"{op_id}_reshaped", expose=None)]
    if how == "ReshapeExpand":
        ops.append(Op("Expand", (f"{op_id}_reshaped", Const(f"{op_id}_expand")),
                      id=f"{op_id}_expanded", expose=None))
    return ops


def reduced_axes(view: GraphView, match: Match, op_id: str, const: str) -> list[int] | None:
    """The axes the match's reduction ``op_id`` reduces: its axes input (the constant bound
    to ``const``) or attribute; None when neither gives them."""
    if match.consts.get(const):
        return [int(a) for a in np.ravel(view.constant(match.consts[const]))]
    axes = attribute(view.nodes[match.nodes[op_id]], "axes")
    return None if axes is None else list(axes)


def broadcast_wrong(view: GraphView, match: Match, reductions: list[str], kept: list[int]) -> str | None:
    """Why the match's ``reductions`` and their broadcasts back do not give values of the
    ``kept`` shape (the input's, the reduced axes 1), or None: a reduction that drops its axes
    is reshaped back, one that keeps them is not."""
    keepdims = {int(attribute(view.nodes[match.nodes[r]], "keepdims", 1)) for r in reductions}
    back = sorted(k for k in match.nodes if k.endswith(_BACK))
    if keepdims != {0 if back else 1}:
        return ("the reductions keep the reduced axes and are reshaped again" if back else
                "the reductions drop the reduced axes and nothing broadcasts them back")
    for op_id in back:
        out = view.shape(view.nodes[match.nodes[op_id]].output[0])
        if list(out or []) != kept:
            return f"{op_id.replace('_', ' ')} is {out}, not the kept shape {kept}"
    return None
