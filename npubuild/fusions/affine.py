"""``fold_affine``: fold a per-channel constant Mul or Add into the Conv or BatchNormalization
that produces its input — the scale-and-shift layers Caffe-style exports put after a
BatchNormalization (BatchNormalization → Mul → Add) or a Conv.

    Conv → Mul(c):  W' = W·c, b' = b·c        Conv → Add(c):  b' = b + c
    BN   → Mul(c):  γ' = γ·c, β' = β·c        BN   → Add(c):  β' = β + c

A real rewrite, like ``conv_bn``: the Conv or BatchNormalization remains with new constants and
writes the Mul/Add's output. ``c`` must be a scalar or hold one value per channel on axis 1
(shape ``[C, 1, ...]`` or ``[1, C, 1, ...]``). The rule repeats until nothing folds, so a
whole Mul → Add chain disappears. Computed in float64 and rounded once.
"""

from __future__ import annotations

import lazy_loader as lazy

from npubuild.fusions import FusionReport, fusion_rule
from npubuild.fusions.graph import GraphView
from npubuild.fusions.pattern import Const, Match, Op, pattern
from npubuild.fusions.rules import Edit, apply_rule

np = lazy.load("numpy")
onnx = lazy.load("onnx")

PRODUCERS = {"Conv": ("x", Const("w"), Const("b", optional=True)),
             "BatchNormalization": ("x", Const("scale"), Const("beta"), Const("mean"), Const("var"))}
PATTERNS = [pattern(Op(producer, inputs, id="producer"), Op(op, ("producer", Const("c")), id="affine"),
                    tag=f"{producer}+{op}")
            for producer, inputs in PRODUCERS.items() for op in ("Mul", "Add")]


def _channels(view: GraphView, match: Match) -> int:
    producer = view.nodes[match.nodes["producer"]]
    key = "w" if producer.op_type == "Conv" else "scale"
    value = view.constant(match.consts[key])
    return value.shape[0] if producer.op_type == "Conv" else value.size


def per_channel(c: np.ndarray, channels: int, rank: int | None) -> np.ndarray | None:
    """``c`` as one value per channel, or None when it broadcasts along another axis."""
    if c.size == 1:
        return np.full(channels, c.ravel()[0])
    shape = list(c.shape)
    while shape and shape[0] == 1 and len(shape) > (rank or 0) - 1:
        shape.pop(0)
    if shape and shape[0] == channels and all(d == 1 for d in shape[1:]) and len(shape) >= 2:
        return c.reshape(channels)
    return None


def _check(view: GraphView, match: Match) -> str | None:
    producer = view.nodes[match.nodes["producer"]]
    if producer.op_type == "BatchNormalization" and any(
            view.consumers.get(t) or t in view.outputs for t in producer.output[1:] if t):
        return "BatchNormalization's running statistics are used (training mode)"
    c = view.constant(match.consts["c"])
    if not np.issubdtype(c.dtype, np.floating):
        return f"the {view.nodes[match.nodes['affine']].op_type} constant is {c.dtype}, not a float"
    if per_channel(c, _channels(view, match), None) is None:
        return f"the constant's shape {list(c.shape)} is not one value per channel on axis 1"
    return None


def _fold(edit: Edit, match: Match) -> list[onnx.NodeProto]:
    view, consts = edit.view, match.consts
    producer, affine = edit.node(match.nodes["producer"]), edit.node(match.nodes["affine"])
    c = per_channel(view.constant(consts["c"]).astype(np.float64), _channels(view, match), None)
    is_mul = affine.op_type == "Mul"
    folded = onnx.NodeProto()
    folded.CopyFrom(producer)
    base = producer.name or producer.output[0]
    if producer.op_type == "Conv":
        weight = view.constant(consts["w"])
        w = weight.astype(np.float64)
        b = view.constant(consts["b"]).astype(np.float64) if consts.get("b") else np.zeros(len(c))
        w = w * c.reshape(-1, *[1] * (w.ndim - 1)) if is_mul else w
        b = b * c if is_mul else b + c
        del folded.input[:]
        folded.input.extend([producer.input[0], edit.initializer(w.astype(weight.dtype), f"{base}_w_affine"),
                             edit.initializer(b.astype(weight.dtype), f"{base}_b_affine")])
    else:
        gamma = view.constant(consts["scale"])
        g, beta = gamma.astype(np.float64).ravel(), view.constant(consts["beta"]).astype(np.float64).ravel()
        g, beta = (g * c, beta * c) if is_mul else (g, beta + c)
        folded.input[1] = edit.initializer(g.astype(gamma.dtype), f"{base}_scale_affine")
        folded.input[2] = edit.initializer(beta.astype(gamma.dtype), f"{base}_beta_affine")
    folded.output[0] = affine.output[0]
    return [folded]


@fusion_rule("fold_affine")
def fold_affine(model):
    """Fold per-channel constant Mul/Add into the Conv or BatchNormalization before it."""
    total = FusionReport()
    while True:
        model, report = apply_rule(model, "fold_affine", PATTERNS, _fold, _check)
        total.fired += report.fired
        total.fused_nodes += report.fused_nodes
        if not report.fired:
            total.near_misses = report.near_misses
            return model, total
