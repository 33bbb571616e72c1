"""Grouped convolutions the chip refuses, written as one convolution per group.

A Conv with ``1 < group`` that is not depthwise (ShuffleNet's grouped 1x1 convs: group 4;
ResNeXt's) is refused by a chip whose ``Conv`` table entry says ``groups: one`` or
``one_or_depthwise`` (npu-tiny and npu-strict, as Vela's Ethos-U checks). `legal_groups`
writes it as a Split of the input along the channels into ``group`` parts, one Conv of
``group = 1`` per part (the original's weights and bias of that group's output channels, its
geometry) and a Concat of their outputs along the channels. A fused ``ConvAct`` or ``ConvSilu``
stays fused: one per part, its activation applied per channel as before.

With per-channel weight scales it is exact in int8: each output channel sums the same
products in one accumulator, a Split keeps its input's scale, and the quantizer writes each
conv's output at the Concat's scale (`npubuild.quant.quantizer.SHARES_CONCAT_SCALE`), so
nothing is rounded twice; with one weight scale per tensor, each group's weights get their
own, no coarser than the whole conv's. A rewrite is
kept only where the chip runs every node of it (`legalize.runs_whole`, the LMEM fit included);
otherwise the conv stays whole with its reasons. `split_model` proves the rewritten model
against the original.
"""

from __future__ import annotations

import onnx

from npubuild.fusions import FUSED_DOMAIN
from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.surgery.graph import Editor
from npubuild.surgery.opsets import attr, make_split
from npubuild.targets.constraints import effective_spec
from npubuild.targets.model import Chip

REWRITE = "legal_groups"
FUSED_CONVS = ("ConvAct", "ConvSilu")  # npubuild.fusions.conv: a Conv's inputs and attributes


def legal_groups(model: onnx.ModelProto, chip: Chip, keep: set[str] = frozenset()
                 ) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with every grouped Conv the chip refuses for its groups (but those whose
    output is in ``keep``) written as a conv per group where the chip runs all of it (module
    docstring); the names of the convs made, in graph order ([] and ``model`` itself when none
    is)."""
    from npubuild.split.legalize import kept_rewrite

    spec = effective_spec(chip, "Conv")
    if spec is None or spec.groups not in ("one", "one_or_depthwise"):
        return model, []
    ed = Editor(model, REWRITE)
    candidates = [n.output[0] for n in ed.graph.node
                  if n.output and n.output[0] not in keep and _refused_group(ed, n)]
    if not candidates:
        return model, []
    rewritten, made, legal = kept_rewrite(model, candidates, _rewrite, chip)
    return (rewritten, [name for out in legal for name in made[out][1:-1]]) if legal \
        else (model, [])


def _is_conv(node: onnx.NodeProto) -> bool:
    return ((node.op_type == "Conv" and node.domain in STANDARD_DOMAINS)
            or (node.op_type in FUSED_CONVS and node.domain == FUSED_DOMAIN))


def _refused_group(ed: Editor, node: onnx.NodeProto) -> bool:
    """A grouped, not depthwise conv of a constant weight (and bias) and static 4-D shapes."""
    if not _is_conv(node) or len(node.input) < 2:
        return False
    if len(node.input) > 2 and node.input[2] and ed.constant(node.input[2]) is None:
        return False  # a bias computed at run time: its parts would need Slices of their own
    group = int(attr(node, "group", 1))
    x, y = ed.shape(node.input[0]), ed.shape(node.output[0])
    weight = ed.constant(node.input[1])
    if (group <= 1 or weight is None or weight.ndim != 4 or x is None or y is None
            or len(x) != 4 or not all(isinstance(d, int) and d > 0 for d in (*x, *y))):
        return False
    return group != x[1] and x[1] % group == 0 and weight.shape[0] % group == 0


def _rewrite(model: onnx.ModelProto, outputs: list[str]
             ) -> tuple[onnx.ModelProto, dict[str, list[str]]]:
    """``model`` with the convs computing ``outputs`` rewritten; per output, the names of the
    nodes made (the Split first, the Concat last)."""
    ed = Editor(model, REWRITE)
    ed.freeze_shapes()
    made = {output: _rewrite_one(ed, ed.producer(output)) for output in outputs}
    ed.thaw_shapes()
    return ed.finish(), made


def _rewrite_one(ed: Editor, conv: onnx.NodeProto) -> list[str]:
    group = int(attr(conv, "group", 1))
    weight = ed.constant(conv.input[1])
    bias = ed.constant(conv.input[2]) if len(conv.input) > 2 and conv.input[2] else None
    cin, cout = ed.shape(conv.input[0])[1], weight.shape[0]
    label = conv.name or conv.output[0]
    parts = [ed.unique_tensor(f"{conv.output[0]}/in{k}") for k in range(group)]
    split = make_split(ed, conv.input[0], parts, [cin // group] * group, 1, f"{label}/split")
    made, outs = [split.name], []
    per = cout // group
    for k in range(group):
        node = onnx.NodeProto()
        node.CopyFrom(conv)
        del node.input[:], node.output[:]
        inputs = [parts[k], ed.add_initializer(weight[k * per:(k + 1) * per],
                                               f"{conv.input[1]}/group{k}")]
        if bias is not None:
            inputs.append(ed.add_initializer(bias[k * per:(k + 1) * per],
                                             f"{conv.input[2]}/group{k}"))
        out = ed.unique_tensor(f"{conv.output[0]}/group{k}")
        node.input.extend(inputs)
        node.output.append(out)
        node.name = ed.unique_node(f"{label}/group{k}")
        for a in node.attribute:
            if a.name == "group":
                a.i = 1
        node.doc_string = f"npubuild surgery: {REWRITE}"
        ed.graph.node.append(node)
        ed.touch()
        made.append(node.name)
        outs.append(out)
    output = conv.output[0]
    ed.remove(conv)
    concat = ed.make_node("Concat", outs, [output], f"{label}/concat", axis=1)
    return [*made, concat.name]
