"""``layer_norm``: the decomposed layer normalisation exporters write → ``LayerNorm``.

    mean = ReduceMean(x); d = x - mean; var = ReduceMean(d²)   (d² as Pow(d, 2) or d * d)
    y = d / Sqrt(var + epsilon) [* scale [+ bias]]              (PyTorch, Paddle)
    y = d * Reciprocal(Sqrt(var + epsilon)) [* scale [+ bias]]  (tf2onnx of TFLite: Rsqrt)
    g = Reciprocal(Sqrt(var + epsilon)) [* scale]
    y = x * g + (bias - mean * g)                                (Keras 2: batch_normalization)
    var = Max(E[x²] - E[x]², 0); y = (x - mean) * (Reciprocal(Sqrt(var + epsilon)) [* scale])
          [+ bias]                                               (Flax through jax2tf: moments)

Both means reduce the same trailing axes with keepdims: a ReduceMean, or a GlobalAveragePool
(tf2onnx writes a mean over the last axes so: every axis from 2 on). The moments form (Flax's
``LayerNorm``) computes E[x] and E[x²] as ReduceMean or as ReduceSum times 1/N, with or
without keepdims: without, the mean and the variance are broadcast back through a Reshape to
the kept shape (and an Expand to it, as jax2tf writes ``broadcast_in_dim``). The fused node carries
``axis`` (the first normalised axis, negative, as in ONNX LayerNormalization) and ``epsilon``;
overloads: ``Affine`` (scale and bias), ``Scale``, ``Plain``, with ``MulSquare`` appended when
d² is written d * d, ``Reciprocal`` when the division is, ``Folded`` for Keras's form and
``Pooled`` when the means are GlobalAveragePools.

``RMS_NORM``: the RMS normalisation T5 exports (no mean subtracted), which import writes as one
ONNX ``RMSNormalization`` (`frontends.onnx.rms_norms_as_op`)::

    y = x · (1 / Sqrt(ReduceMean(x²) + epsilon)) [· scale]   (x² as Pow(x, 2) or x · x; the
                                                                division as Div(1, ·),
                                                                Reciprocal or Div(x, ·))
"""

from __future__ import annotations

import itertools

import lazy_loader as lazy

from npubuild.fusions import fusion_rule
from npubuild.fusions.functions import Fused
from npubuild.fusions.graph import GraphView, attribute
from npubuild.fusions.pattern import Const, Lit, Match, Op, pattern
from npubuild.fusions.reductions import (BROADCASTS, broadcast_back, broadcast_wrong, reduced_axes,
                                       reduction)
from npubuild.fusions.rules import fuse_as_function

np = lazy.load("numpy")

_KEEPDIMS = {"keepdims": 1}
POOLED = "GlobalAveragePool"


def _mean(source: str, op_id: str, axes: str, mean: str) -> Op:
    if mean == POOLED:
        return Op(POOLED, (source,), id=op_id, expose=None)
    return reduction("ReduceMean", source, op_id, axes, **_KEEPDIMS)


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


def _moment(source: str, op_id: str, axes: str, summed: bool) -> list[Op]:
    """E[source] over ``axes``: ReduceMean, or ReduceSum then a product by 1/N (id ``op_id``
    either way, its reduction ``op_id``_reduce when summed); keepdims is checked by `describe`."""
    if not summed:
        return [reduction("ReduceMean", source, op_id, axes)]
    return [reduction("ReduceSum", source, f"{op_id}_reduce", axes),
            Op("Mul", (f"{op_id}_reduce", Const(f"{op_id}_inverse_count")), id=op_id, expose=None)]


def _moments_layer_norm(summed: bool, clamped: bool, broadcast: str, affine: str):
    """var = E[x²] - E[x]² (clamped at 0); y = (x - mean) · Reciprocal(Sqrt(var + eps)) [· scale]
    [+ bias]: Flax's LayerNorm as jax2tf and tf2onnx write it."""
    ops = [*_moment("x", "mean", "axes", summed),
           Op("Mul", ("x", "x"), id="x_square", expose=None),
           *_moment("x_square", "var", "var_axes", summed),
           Op("Mul", ("mean", "mean"), id="mean_square", expose=None),
           Op("Sub", ("var", "mean_square"), id="moments", expose=None)]
    variance = "moments"
    if clamped:
        ops.append(Op("Max", ("moments", Lit(0.0)), id="clamped", expose=None))
        variance = "clamped"
    spread = broadcast_back(variance, "variance", broadcast)
    centre = broadcast_back("mean", "centre", broadcast)
    variance, mean = spread[-1].id if spread else variance, centre[-1].id if centre else "mean"
    ops += [*spread, Op("Add", (variance, Const("epsilon")), id="add", expose=None),
            Op("Sqrt", ("add",), id="std", expose=None),
            Op("Reciprocal", ("std",), id="inverse", expose=None)]
    gain = "inverse"
    if affine in ("Affine", "Scale"):
        ops.append(Op("Mul", ("inverse", "scale"), id="gain", expose=None))
        gain = "gain"
    ops += [*centre, Op("Sub", ("x", mean), id="sub", expose=None),
            Op("Mul", ("sub", gain), id="norm", expose=None)]
    if affine == "Affine":
        ops.append(Op("Add", ("norm", "bias"), id="shifted", expose=None))
    tag = ("Moments" + affine + ("Summed" if summed else "") + ("Clamped" if clamped else "")
           + ("" if broadcast == "Kept" else broadcast))
    return pattern(*ops, tag=tag)


def _moments_forms():
    yield from itertools.product((True, False), (True, False), BROADCASTS, ("Affine", "Scale", "Plain"))


LAYER_NORM = (tuple(_layer_norm(*form) for form in _forms())
              + tuple(_moments_layer_norm(*form) for form in _moments_forms()))


def _axes(view: GraphView, match: Match, op_id: str, const: str) -> list[int] | None:
    node = view.nodes[match.nodes[op_id]]
    if node.op_type == POOLED:  # every axis from 2 on
        rank = len(view.shape(node.input[0]) or [])
        return list(range(2, rank)) if rank > 2 else None
    return reduced_axes(view, match, op_id, const)


def describe(view: GraphView, match: Match, any_axes: bool = False) -> Fused | str:
    """The fused node's overload and attributes (``axis``, ``epsilon``), or why the match is
    not a layer normalisation. ``any_axes``: the means may reduce axes that are not the
    trailing ones (Flax normalises over any); then ``perm`` is the transpose that makes them
    trailing, and ``axis`` is the first of them after it."""
    mean, var = (f"{m}_reduce" if f"{m}_reduce" in match.nodes else m for m in ("mean", "var"))
    axes, var_axes = _axes(view, match, mean, "axes"), _axes(view, match, var, "var_axes")
    if not axes or axes != var_axes:
        return f"the two means reduce axes {axes} and {var_axes}, not the same axes"
    shape = view.shape(match.inputs["x"]) or []
    rank = len(shape)
    reduced = sorted(a - rank if a >= 0 and rank else a for a in axes)
    perm = None
    if reduced != list(range(-len(axes), 0)):
        if not any_axes or not rank or len(set(reduced)) != len(reduced):
            return f"the mean's axes {axes} are not the trailing axes of the input"
        perm = [k for k in range(rank) if k - rank not in reduced] + [a + rank for a in reduced]
    if match.pattern.tag.startswith("Moments"):
        wrong = _moments_wrong(view, match, shape, reduced, (mean, var))
        if wrong:
            return wrong
    epsilon = view.constant(match.consts["epsilon"])
    if np.size(epsilon) != 1:
        return "epsilon is not a scalar"
    attrs = {"axis": -len(reduced), "epsilon": float(np.ravel(epsilon)[0])}
    return Fused(match.pattern.tag, {**attrs, "perm": perm} if perm else attrs)


def _moments_wrong(view: GraphView, match: Match, shape: list, axes: list[int],
                   reductions: tuple[str, str]) -> str | None:
    """Why a moments-form match is not E[x] and E[x²] broadcast back over ``axes``, or None."""
    if not all(isinstance(d, int) and d > 0 for d in shape):
        return "the input's shape is not static"
    kept = [1 if k - len(shape) in axes else d for k, d in enumerate(shape)]
    count = int(np.prod([shape[a] for a in axes]))
    for name in ("mean_inverse_count", "var_inverse_count"):
        if name in match.consts:
            value = np.ravel(view.constant(match.consts[name]))
            if value.size != 1 or not np.isclose(float(value[0]), 1.0 / count, rtol=1e-6, atol=0.0):
                return f"the sum is scaled by {value[:2].tolist()}, not 1/{count}"
    return broadcast_wrong(view, match, list(reductions), kept)


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


def _rms_norm(square: str, divide: str, scaled: bool):
    """y = x / sqrt(mean(x²) + epsilon) [· scale] over the last axis, as T5 writes its layer
    norm (and Llama-style exports): x² as Pow(x, 2) or x · x; the division as Div(x, ·), or a
    product by Reciprocal(·) or Div(1, ·)."""
    ops = [(Op("Pow", ("x", Lit(2.0)), id="square", expose=None) if square == "Pow" else
            Op("Mul", ("x", "x"), id="square", expose=None)),
           reduction("ReduceMean", "square", "var", "var_axes", **_KEEPDIMS),
           Op("Add", ("var", Const("epsilon")), id="add", expose=None),
           Op("Sqrt", ("add",), id="std", expose=None)]
    if divide == "Div":
        ops.append(Op("Div", ("x", "std"), id="norm", expose=None))
    else:
        ops.append(Op("Reciprocal", ("std",), id="inverse", expose=None) if divide == "Reciprocal"
                   else Op("Div", (Lit(1.0), "std"), id="inverse", expose=None))
        ops.append(Op("Mul", ("x", "inverse"), id="norm", expose=None))
    if scaled:
        ops.append(Op("Mul", ("norm", Const("scale")), id="scaled", expose=None))
    tag = ("RmsScale" if scaled else "RmsPlain") + ("" if square == "Pow" else "MulSquare") + (
        "" if divide == "Div" else divide)
    return pattern(*ops, tag=tag)


#: RMS normalisation (no mean subtracted), longest forms first so the scale joins the match.
RMS_NORM = tuple(_rms_norm(square, divide, scaled) for scaled in (True, False)
                 for square in ("Pow", "Mul") for divide in ("Div", "Reciprocal", "One"))


def describe_rms(view: GraphView, match: Match) -> Fused | str:
    """An RMS-norm match's overload and attributes (``axis`` -1, ``epsilon``), or why it is not
    one: the mean must reduce the last axis only, epsilon be a scalar and the scale vary only
    along the last axis."""
    shape = view.shape(match.inputs["x"]) or []
    axes = _axes(view, match, "var", "var_axes")
    if not shape or axes is None or [a - len(shape) if a >= 0 else a for a in axes] != [-1]:
        return f"the mean reduces axes {axes}, not the last axis of a rank-{len(shape)} input"
    epsilon = view.constant(match.consts["epsilon"])
    if np.size(epsilon) != 1:
        return "epsilon is not a scalar"
    if "scale" in match.consts:
        scale = view.constant(match.consts["scale"])
        if scale.ndim > len(shape) or any(d != 1 for d in scale.shape[:-1]):
            return f"the scale {list(scale.shape)} varies along axes before the last"
    return Fused(match.pattern.tag, {"axis": -1, "epsilon": float(np.ravel(epsilon)[0])})
