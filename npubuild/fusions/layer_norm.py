"""``layer_norm``: the decomposed layer normalisation exporters write → ``LayerNorm``.

    mean = ReduceMean(x); d = x - mean; var = ReduceMean(d²)   (d² as Pow(d, 2) or d * d)
    y = d / Sqrt(var + epsilon) [* scale [+ bias]]              (PyTorch, Paddle)
    y = d * Reciprocal(Sqrt(var + epsilon)) [* scale [+ bias]]  (tf2onnx of TFLite: Rsqrt)
    g = Reciprocal(Sqrt(var + epsilon)) [* scale]
    y = x * g + (bias - mean * g)                                (Keras 2: batch_normalization)

Both means reduce the same trailing axes with keepdims: a ReduceMean, or a GlobalAveragePool
(tf2onnx writes a mean over the last axes so: every axis from 2 on). The fused node carries
``axis`` (the first normalised axis, negative, as in ONNX LayerNormalization) and ``epsilon``;
overloads: ``Affine`` (scale and bias), ``Scale``, ``Plain``, with ``MulSquare`` appended when
d² is written d * d, ``Reciprocal`` when the division is, ``Folded`` for Keras's form and
``Pooled`` when the means are GlobalAveragePools.
"""

from __future__ import annotations

import itertools

import lazy_loader as lazy

from npubuild.fusions import fusion_rule
from npubuild.fusions.functions import Fused
from npubuild.fusions.graph import GraphView, attribute
from npubuild.fusions.pattern import Const, Lit, Match, Op, pattern
from npubuild.fusions.rules import fuse_as_function

np = lazy.load("numpy")

_KEEPDIMS = {"keepdims": 1}
POOLED = "GlobalAveragePool"


def _mean(source: str, op_id: str, axes: str, mean: str) -> Op:
    if mean == POOLED:
        return Op(POOLED, (source,), id=op_id, expose=None)
    return Op("ReduceMean", (source, Const(axes, True)), id=op_id, attrs=_KEEPDIMS, expose=None)


def _layer_norm(mean: str, square: str, divide: str, affine: str):
    ops = [_mean("x", "mean", "axes", mean),
           Op("Sub", ("x", "mean"), id="sub", expose=None),
           (Op("Pow", ("sub", Lit(2.0)), id="square", expose=None) if square == "Pow" else
            Op("Mul", ("sub", "sub"), id="square", expose=None)),
           _mean("square", "var", "var_axes", mean),
           Op("Add", ("var", Const("epsilon")), id="add", expose=None),
           Op("Sqrt", ("add",), id="std", expose=None)]
    if divide == "Div":
        ops.append(Op("Div", ("sub", "std"), id="norm", expose=None))
    else:
        ops.append(Op("Reciprocal", ("std",), id="inverse", expose=None))
    if divide == "Reciprocal":
        ops.append(Op("Mul", ("sub", "inverse"), id="norm", expose=None))
        if affine in ("Affine", "Scale"):
            ops.append(Op("Mul", ("norm", "scale"), id="scaled", expose=None))
        if affine == "Affine":
            ops.append(Op("Add", ("scaled", "bias"), id="shifted", expose=None))
    if divide == "Folded":  # x · g + (bias - mean · g), g = scale / std
        gain = "inverse"
        if affine == "Affine":
            ops.append(Op("Mul", ("inverse", "scale"), id="gain", expose=None))
            gain = "gain"
        ops += [Op("Mul", ("mean", gain), id="mean_gain", expose=None),
                Op("Sub", ("bias", "mean_gain"), id="offset", expose=None),
                Op("Mul", ("x", gain), id="scaled", expose=None),
                Op("Add", ("scaled", "offset"), id="shifted", expose=None)]
    if divide == "Div":
        if affine in ("Affine", "Scale"):
            ops.append(Op("Mul", ("norm", "scale"), id="scaled", expose=None))
        if affine == "Affine":
            ops.append(Op("Add", ("scaled", "bias"), id="shifted", expose=None))
    tag = (affine + ("" if square == "Pow" else "MulSquare") + ("" if divide == "Div" else divide)
           + ("Pooled" if mean == POOLED else ""))
    return pattern(*ops, tag=tag)


def _forms():
    for mean, divide, affine, square in itertools.product(
            ("ReduceMean", POOLED), ("Div", "Reciprocal", "Folded"), ("Affine", "Scale", "Plain"),
            ("Pow", "Mul")):
        if divide == "Folded" and affine != "Affine":
            continue  # Keras writes the offset as bias - mean · g: with a bias only
        yield mean, square, divide, affine


LAYER_NORM = tuple(_layer_norm(*form) for form in _forms())


def _axes(view: GraphView, match: Match, op_id: str, const: str) -> list[int] | None:
    node = view.nodes[match.nodes[op_id]]
    if node.op_type == POOLED:  # every axis from 2 on
        rank = len(view.shape(node.input[0]) or [])
        return list(range(2, rank)) if rank > 2 else None
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
    """ReduceMean/Sub/Pow/ReduceMean/Add/Sqrt/Div[/Mul/Add] (and the forms above) ->
    npubuild.fused.LayerNorm."""
    fused, report = fuse_as_function(model, "layer_norm", LAYER_NORM, describe)
    written = sum(n.op_type == "LayerNormalization" for n in model.graph.node)
    if not report.fired and written:  # import writes what it can as the ONNX op
        report.near_misses.insert(0, f"import already wrote {written} layer norm(s) as "
                                     "ONNX LayerNormalization, which chips run whole")
    return fused, report
