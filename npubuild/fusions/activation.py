"""Activations: the ones Conv and Gemm absorb, and the composite ones fused on their own.

- ``silu``: ``x * Sigmoid(x)`` → ``Silu`` (YOLOv8's activation; 58 in YOLOv8n).
- ``hard_swish``: ``x * HardSigmoid(x)`` with alpha 1/6, beta 1/2, or ``x * Relu6(x + 3) / 6``
  written with Clip(0, 6) and Div by 6 or Mul by 1/6 in either order → ``HardSwish``.

`activation_ops` and `activation_attrs` are shared by ``conv_act`` and ``gemm_act``: a fused
node names its activation in ``activation`` (``Relu``, ``Relu6`` (Clip to [0, 6]), ``Clip``,
``Sigmoid``, ``HardSigmoid``, ``LeakyRelu``) with ``activation_alpha``/``activation_beta``
(HardSigmoid, LeakyRelu) and ``activation_min``/``activation_max`` (Clip).
"""

from __future__ import annotations

import math

import lazy_loader as lazy

from npubuild.fusions import fusion_rule
from npubuild.fusions.graph import GraphView, attribute
from npubuild.fusions.pattern import Const, Lit, Match, Op, pattern
from npubuild.fusions.rules import fuse_as_function

np = lazy.load("numpy")

ACTIVATIONS = ("Relu", "Clip", "Sigmoid", "HardSigmoid", "LeakyRelu")
FLOAT_MAX = 3.4028234663852886e38  # float(np.finfo(np.float32).max), without loading numpy


def activation_ops(source: str) -> list[Op]:
    """The activations a producer op (id ``source``) may absorb, as pattern ops with id ``act``."""
    extra = {"Clip": (Const("min", optional=True), Const("max", optional=True))}
    return [Op(act, (source, *extra.get(act, ())), id="act", expose="activation_")
            for act in ACTIVATIONS]


def clip_bounds(view: GraphView, node) -> tuple[float, float] | None:
    """Clip's [min, max] from its inputs (opset ≥ 11) or attributes; None if not constant."""
    if view.opsets.get("", 1) < 11:
        return (float(attribute(node, "min", -FLOAT_MAX)), float(attribute(node, "max", FLOAT_MAX)))
    bounds = []
    for k, default in ((1, -FLOAT_MAX), (2, FLOAT_MAX)):
        name = node.input[k] if len(node.input) > k else ""
        value = view.constant(name) if name else np.float32(default)
        if value is None or np.size(value) != 1:
            return None
        bounds.append(float(np.ravel(value)[0]))
    return bounds[0], bounds[1]


def activation_attrs(view: GraphView, node) -> dict:
    """``activation`` and, for Clip, its bounds; alpha/beta come from the exposed attributes."""
    if node.op_type != "Clip":
        return {"activation": node.op_type}
    low, high = clip_bounds(view, node)
    name = "Relu6" if (low, high) == (0.0, 6.0) else "Clip"
    return {"activation": name, "activation_min": low, "activation_max": high}


SILU = pattern(Op("Sigmoid", ("x",), id="sigmoid"), Op("Mul", ("x", "sigmoid"), id="mul"))


@fusion_rule("silu")
def silu(model):
    """x * Sigmoid(x) -> npubuild.fused.Silu."""
    return fuse_as_function(model, "silu", [SILU])


def _relu6_of_x_plus_3() -> tuple[Op, Op]:
    return (Op("Add", ("x", Lit(3.0)), id="add", expose=None),
            Op("Clip", ("add", Const("min", True), Const("max", True)), id="clip", expose=None))


def _hard_swish_patterns():
    one_sixth = Lit(1.0 / 6.0)
    hard_sigmoid = Op("HardSigmoid", ("x",), id="hsig", expose=None, attrs={
        "alpha": lambda a: math.isclose(a, 1 / 6, rel_tol=1e-4), "beta": 0.5})
    yield pattern(hard_sigmoid, Op("Mul", ("x", "hsig"), id="mul"), tag="HardSigmoid")
    relu6 = _relu6_of_x_plus_3()
    yield pattern(*relu6, Op("Mul", ("x", "clip"), id="mul"), Op("Div", ("mul", Lit(6.0)), id="scale"),
                  tag="Relu6Div")
    yield pattern(*relu6, Op("Mul", ("x", "clip"), id="mul"), Op("Mul", ("mul", one_sixth), id="scale"),
                  tag="Relu6Mul")
    yield pattern(*relu6, Op("Div", ("clip", Lit(6.0)), id="scale"), Op("Mul", ("x", "scale"), id="mul"),
                  tag="Relu6DivFirst")
    yield pattern(*relu6, Op("Mul", ("clip", one_sixth), id="scale"), Op("Mul", ("x", "scale"), id="mul"),
                  tag="Relu6MulFirst")


HARD_SWISH = tuple(_hard_swish_patterns())


def _relu6_only(view: GraphView, match: Match):
    if "clip" not in match.nodes:
        return None
    bounds = clip_bounds(view, view.nodes[match.nodes["clip"]])
    if bounds != (0.0, 6.0):
        return f"Clip bounds are {bounds}, HardSwish needs (0, 6)"
    return None


@fusion_rule("hard_swish")
def hard_swish(model):
    """x * HardSigmoid(x) (alpha 1/6) or x * Relu6(x + 3) / 6 -> npubuild.fused.HardSwish."""
    return fuse_as_function(model, "hard_swish", HARD_SWISH, _relu6_only)
