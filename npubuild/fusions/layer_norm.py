"""``layer_norm``: the decomposed layer normalisation exporters write → ``LayerNorm``.

    mean = ReduceMean(x); d = x - mean; var = ReduceMean(d²)   (d² as Pow(d, 2) or d * d)
    y = d / Sqrt(var + epsilon) [* scale [+ bias]]

Both ReduceMeans must reduce the same trailing axes with keepdims. The fused node carries
``axis`` (the first normalised axis, negative, as in ONNX LayerNormalization) and ``epsilon``;
overloads: ``Affine`` (scale and bias), ``Scale``, ``Plain``, with ``MulSquare`` appended
when d² is written d * d.
"""

from __future__ import annotations

import lazy_loader as lazy

from npubuild.fusions import fusion_rule
from npubuild.fusions.functions import Fused
from npubuild.fusions.graph import GraphView, attribute
from npubuild.fusions.pattern import Const, Lit, Match, Op, pattern
from npubuild.fusions.rules import fuse_as_function

np = lazy.load("numpy")

_KEEPDIMS = {"keepdims": 1}


def _layer_norm(square: str, affine: str):
    ops = [Op("ReduceMean", ("x", Const("axes", True)), id="mean", attrs=_KEEPDIMS, expose=None),
           Op("Sub", ("x", "mean"), id="sub", expose=None),
           (Op("Pow", ("sub", Lit(2.0)), id="square", expose=None) if square == "Pow" else
            Op("Mul", ("sub", "sub"), id="square", expose=None)),
           Op("ReduceMean", ("square", Const("var_axes", True)), id="var", attrs=_KEEPDIMS,
              expose=None),
           Op("Add", ("var", Const("epsilon")), id="add", expose=None),
           Op("Sqrt", ("add",), id="std", expose=None),
           Op("Div", ("sub", "std"), id="norm", expose=None)]
    if affine in ("Affine", "Scale"):
        ops.append(Op("Mul", ("norm", "scale"), id="scaled", expose=None))
    if affine == "Affine":
        ops.append(Op("Add", ("scaled", "bias"), id="shifted", expose=None))
    return pattern(*ops, tag=affine + ("" if square == "Pow" else "MulSquare"))


LAYER_NORM = tuple(_layer_norm(square, affine) for affine in ("Affine", "Scale", "Plain")
                   for square in ("Pow", "Mul"))


def _axes(view: GraphView, match: Match, op_id: str, const: str) -> list[int] | None:
    node = view.nodes[match.nodes[op_id]]
    if match.consts.get(const):
        return [int(a) for a in np.ravel(view.constant(match.consts[const]))]
    axes = attribute(node, "axes")
    return None if axes is None else list(axes)


def describe(view: GraphView, match: Match) -> Fused | str:
    """The fused node's overload and attributes (``axis``, ``epsilon``), or why the match is
    not a layer normalisation."""
    axes, var_axes = _axes(view, match, "mean", "axes"), _axes(view, match, "var", "var_axes")
    if not axes or axes != var_axes:
        return f"the two ReduceMeans reduce axes {axes} and {var_axes}, not the same axes"
    rank = len(view.shape(match.inputs["x"]) or [])
    trailing = sorted(a - rank if a >= 0 and rank else a for a in axes)
    if trailing != list(range(-len(axes), 0)):
        return f"ReduceMean axes {axes} are not the trailing axes of the input"
    epsilon = view.constant(match.consts["epsilon"])
    if np.size(epsilon) != 1:
        return "epsilon is not a scalar"
    attrs = {"axis": trailing[0], "epsilon": float(np.ravel(epsilon)[0])}
    return Fused(match.pattern.tag, attrs)


@fusion_rule("layer_norm")
def layer_norm(model):
    """ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div[/Mul/Add] -> npubuild.fused.LayerNorm."""
    return fuse_as_function(model, "layer_norm", LAYER_NORM, describe)
