"""``pad_conv``: fold a zero constant Pad into the Conv that reads it (``pads`` grow).

A real rewrite, bit-identical: a Conv pads with zeros itself, so an explicit Pad of zeros on
the spatial axes only (not batch, not channels), with non-negative amounts, in front of a Conv
without ``auto_pad``, disappears into the Conv's ``pads``. Reflect/edge padding, a non-zero
fill value or cropping (negative pads) stay as they are, with the reason logged.
"""

from __future__ import annotations

import lazy_loader as lazy

from npubuild.fusions import fusion_rule
from npubuild.fusions.graph import GraphView, attribute
from npubuild.fusions.pattern import Const, Match, Op, Opt, pattern
from npubuild.fusions.rules import Edit, apply_rule

np = lazy.load("numpy")
onnx = lazy.load("onnx")

PAD_CONV = pattern(
    Op("Pad", ("x", Const("pads", True), Const("value", True), Const("axes", True)), id="pad",
       attrs={"mode": "constant"}),
    Op("Conv", ("pad", "w", Opt("b")), id="conv"))


def _full_pads(view: GraphView, match: Match, rank: int) -> list[int]:
    """Pad's amounts as [begin per axis..., end per axis...] over all ``rank`` axes."""
    pad = view.nodes[match.nodes["pad"]]
    if match.consts.get("pads"):
        pads = [int(p) for p in np.ravel(view.constant(match.consts["pads"]))]
    else:
        pads = list(attribute(pad, "pads", []))
    axes = (list(range(rank)) if not match.consts.get("axes")
            else [int(a) % rank for a in np.ravel(view.constant(match.consts["axes"]))])
    full = [0] * (2 * rank)
    for k, axis in enumerate(axes):
        full[axis], full[axis + rank] = pads[k], pads[k + len(axes)]
    return full


def _check(view: GraphView, match: Match) -> list[int] | str:
    pad, conv = view.nodes[match.nodes["pad"]], view.nodes[match.nodes["conv"]]
    fill = (view.constant(match.consts["value"]) if match.consts.get("value")
            else attribute(pad, "value", 0.0))
    if np.any(np.asarray(fill) != 0):
        return f"the Pad fills with {np.ravel(fill)[0]:g}; a Conv pads with 0"
    if attribute(conv, "auto_pad", "NOTSET") != "NOTSET":
        return f"the Conv uses auto_pad={attribute(conv, 'auto_pad')}"
    weight = view.constant(conv.input[1])
    rank = weight.ndim if weight is not None else len(view.shape(conv.input[1]) or [])
    if rank < 3:
        return "cannot tell the Conv's rank (its weight has no known shape)"
    full = _full_pads(view, match, rank)
    if any(p < 0 for p in full):
        return f"the Pad crops (negative pads {full})"
    if any(full[:2] + full[rank:rank + 2]):
        return f"the Pad pads the batch or channel axis (pads {full})"
    return full[2:rank] + full[rank + 2:]


def _fold(edit: Edit, match: Match) -> list[onnx.NodeProto]:
    conv = edit.node(match.nodes["conv"])
    extra = match.info
    pads = [a + b for a, b in zip(attribute(conv, "pads", [0] * len(extra)), extra)]
    folded = onnx.NodeProto()
    folded.CopyFrom(conv)
    folded.input[0] = match.inputs["x"]
    kept = [a for a in folded.attribute if a.name != "pads"]
    del folded.attribute[:]
    folded.attribute.extend([*kept, onnx.helper.make_attribute("pads", pads)])
    return [folded]


@fusion_rule("pad_conv")
def pad_conv(model):
    """Fold a zero constant Pad of the spatial axes into the next Conv's pads."""
    return apply_rule(model, "pad_conv", [PAD_CONV], _fold, _check)
