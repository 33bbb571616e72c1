"""``conv_bn``: fold an inference-mode BatchNormalization into the Conv before it.

    W' = W * s,  b' = (b - mean) * s + beta,  s = gamma / sqrt(var + epsilon)   (per channel)

A real rewrite, not a function: a plain Conv with new weight and bias initializers remains and
writes the BatchNormalization's output tensor. Computed in float64 and rounded once, so outputs
move by float rounding only. Needs constant weights and statistics (initializers, Constant or
ConstantOfShape) and a Conv output nothing else reads.
"""

from __future__ import annotations

import lazy_loader as lazy

from npubuild.fusions import fusion_rule
from npubuild.fusions.graph import GraphView, attribute
from npubuild.fusions.pattern import Const, Match, Op, pattern
from npubuild.fusions.rules import Edit, apply_rule

np = lazy.load("numpy")
onnx = lazy.load("onnx")

CONV_BN = pattern(
    Op("Conv", ("x", Const("w"), Const("b", optional=True)), id="conv"),
    Op("BatchNormalization", ("conv", Const("scale"), Const("beta"), Const("mean"), Const("var")),
       id="bn", attrs={"training_mode": lambda v: not v, "spatial": lambda v: v in (None, 1)}))


def _check(view: GraphView, match: Match) -> str | None:
    bn = view.nodes[match.nodes["bn"]]
    if any(view.consumers.get(t) or t in view.outputs for t in bn.output[1:] if t):
        return "BatchNormalization's running statistics are used (training mode)"
    weight = view.constant(match.consts["w"])
    channels = {np.size(view.constant(match.consts[k])) for k in ("scale", "beta", "mean", "var")}
    if channels != {weight.shape[0]}:
        return f"BatchNormalization has {sorted(channels)} channels, the Conv outputs {weight.shape[0]}"
    if not np.issubdtype(weight.dtype, np.floating):
        return f"the Conv weight is {weight.dtype}, not a float"
    return None


def _fold(edit: Edit, match: Match) -> list[onnx.NodeProto]:
    view, consts = edit.view, match.consts
    conv, bn = edit.node(match.nodes["conv"]), edit.node(match.nodes["bn"])
    value = {k: view.constant(t).astype(np.float64) for k, t in consts.items() if t}
    weight = view.constant(consts["w"])
    factor = value["scale"].ravel() / np.sqrt(value["var"].ravel() + attribute(bn, "epsilon", 1e-5))
    bias = value["b"].ravel() if "b" in value else np.zeros_like(factor)
    folded_w = value["w"] * factor.reshape(-1, *[1] * (weight.ndim - 1))
    folded_b = (bias - value["mean"].ravel()) * factor + value["beta"].ravel()
    base = conv.input[1] or conv.name
    folded = onnx.NodeProto()
    folded.CopyFrom(conv)
    del folded.input[:]
    folded.input.extend([conv.input[0], edit.initializer(folded_w.astype(weight.dtype), f"{base}_bn"),
                         edit.initializer(folded_b.astype(weight.dtype), f"{base}_bn_bias")])
    folded.output[0] = bn.output[0]
    return [folded]


@fusion_rule("conv_bn")
def conv_bn(model):
    """Fold BatchNormalization into the preceding Conv's weights and bias (a plain Conv remains)."""
    return apply_rule(model, "conv_bn", [CONV_BN], _fold, _check)

