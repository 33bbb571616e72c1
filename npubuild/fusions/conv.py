"""Conv followed by its activation, as one fused op.

- ``conv_act``: Conv → Relu / Clip (``Relu6`` when it clips to [0, 6]) / Sigmoid / HardSigmoid /
  LeakyRelu → ``ConvAct``, overload = the activation (``NoBias`` appended without a bias).
- ``conv_silu``: Conv → ``x * Sigmoid(x)`` → ``ConvSilu``. It must see the Sigmoid and Mul
  themselves, so it runs before ``silu`` (which would turn them into a ``Silu`` node).

Both fused nodes carry the Conv's attributes made explicit — ``kernel_shape`` (from the weight
when the Conv left it out), ``strides``, ``dilations``, ``pads`` (unless ``auto_pad`` is set),
``group``, ``auto_pad`` — and ``activation`` (+ its parameters, see `activation`), so the split
stage can check a chip's constraints without opening the body.
"""

from __future__ import annotations

from npubuild.fusions import fusion_rule
from npubuild.fusions.activation import activation_attrs, activation_ops
from npubuild.fusions.functions import Fused
from npubuild.fusions.graph import GraphView, attribute
from npubuild.fusions.pattern import Match, Op, Opt, pattern
from npubuild.fusions.rules import fuse_as_function

CONV = Op("Conv", ("x", "w", Opt("b")), id="conv")


def conv_attrs(view: GraphView, conv) -> dict:
    """The Conv's geometry with every default made explicit."""
    attrs = {"group": attribute(conv, "group", 1)}
    kernel = attribute(conv, "kernel_shape") or _kernel_from_weight(view, conv.input[1])
    if kernel:
        n = len(kernel)
        attrs.update(kernel_shape=list(kernel), strides=list(attribute(conv, "strides", [1] * n)),
                     dilations=list(attribute(conv, "dilations", [1] * n)))
        if attribute(conv, "auto_pad", "NOTSET") == "NOTSET":
            attrs["pads"] = list(attribute(conv, "pads", [0] * (2 * n)))
    return attrs


def _kernel_from_weight(view: GraphView, weight: str) -> list[int] | None:
    value = view.constant(weight)
    shape = list(value.shape) if value is not None else view.shape(weight)
    if not shape or len(shape) < 3 or any(d is None for d in shape[2:]):
        return None
    return [int(d) for d in shape[2:]]


def _bias_tag(match: Match) -> str:
    return "" if match.inputs.get("b") else "NoBias"


CONV_ACT = tuple(pattern(CONV, act, tag=act.op) for act in activation_ops("conv"))


def _describe_conv_act(view: GraphView, match: Match) -> Fused:
    attrs = {**conv_attrs(view, view.nodes[match.nodes["conv"]]),
             **activation_attrs(view, view.nodes[match.nodes["act"]])}
    return Fused(attrs["activation"] + _bias_tag(match), attrs)


@fusion_rule("conv_act")
def conv_act(model):
    """Conv + Relu / Clip (Relu6) / Sigmoid / HardSigmoid / LeakyRelu -> npubuild.fused.ConvAct."""
    return fuse_as_function(model, "conv_act", CONV_ACT, _describe_conv_act)


CONV_SILU = pattern(CONV, Op("Sigmoid", ("conv",), id="sigmoid"),
                    Op("Mul", ("conv", "sigmoid"), id="mul"), tag="Silu")


def _describe_conv_silu(view: GraphView, match: Match) -> Fused:
    attrs = {**conv_attrs(view, view.nodes[match.nodes["conv"]]), "activation": "Silu"}
    return Fused("Silu" + _bias_tag(match), attrs)


@fusion_rule("conv_silu")
def conv_silu(model):
    """Conv + x * Sigmoid(x) -> npubuild.fused.ConvSilu (list it before silu)."""
    return fuse_as_function(model, "conv_silu", [CONV_SILU], _describe_conv_silu)
