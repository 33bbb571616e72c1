"""Inference BatchNormalizations the chip refuses, written as the per-channel affine step they are.

An inference ``BatchNormalization`` of constant parameters is ``y = x·s + t`` per channel, with
``s = scale / sqrt(var + eps)`` and ``t = bias - mean·s`` (folded in float64). The fusion
``conv_bn`` folds the ones a Conv writes; a DenseNet's (pre-activation: Concat -> BN -> Relu ->
Conv, light-densenet121's 58) have no conv before them, and a chip whose table lacks
BatchNormalization (npu-tiny, npu-strict) put each on the CPU: a round trip per dense layer.
`legal_batchnorms` writes such a node as

- a depthwise 1x1 Conv of weights ``s`` and bias ``t`` (a 4-D input): the layer the quantizer
  lowers a BatchNormalization to already (`npubuild.quant.ops.batchnorm`), so the int8 result
  is the same, rounded once, with per-channel weight scales; or, where the chip refuses that,
- a Mul by ``s`` and an Add of ``t``, both of shape ``[1, C, 1, ...]`` (any rank).

The last node made keeps the BatchNormalization's name and output. A rewrite is kept only where
the chip runs every node of it (`legalize.kept_rewrite`, the LMEM fit included); otherwise the
node stays whole with its reasons. `split_model` proves the rewritten model against the
original.
"""

from __future__ import annotations

import numpy as np
import onnx

from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.surgery.graph import Editor
from npubuild.surgery.opsets import attr
from npubuild.targets.model import Chip

REWRITE = "legal_batchnorms"
FORMS = ("conv", "affine")  # tried in this order


def legal_batchnorms(model: onnx.ModelProto, chip: Chip, keep: set[str] = frozenset()
                     ) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with every inference BatchNormalization the chip refuses (but those whose
    output is in ``keep``) written as a depthwise 1x1 Conv or a Mul and an Add where the chip
    runs all of it (module docstring); the names of the nodes that keep the BatchNormalizations'
    names, in graph order ([] and ``model`` itself when none is)."""
    from npubuild.split.legalize import kept_rewrite, runs_whole

    ed = Editor(model, REWRITE)
    affine = {n.output[0]: n.name or n.output[0] for n in ed.graph.node
              if n.output and n.output[0] not in keep and _affine(ed, n) is not None}
    if not affine:
        return model, []
    named = _named(model, list(affine))
    refused = [out for out in affine
               if out not in runs_whole(named, {out: [affine[out]] for out in affine}, chip)]
    names: list[str] = []
    for form in FORMS:
        candidates = [out for out in refused if form == "affine" or _rank(ed, out) == 4]
        if not candidates:
            continue
        rewritten, made, legal = kept_rewrite(
            model, candidates, lambda m, outs, form=form: _rewrite(m, outs, form), chip)
        if legal:
            model, names = rewritten, names + [made[out][-1] for out in legal]
            refused = [out for out in refused if out not in legal]
    if not names:
        return model, []
    order = {n.name: i for i, n in enumerate(model.graph.node)}
    return model, sorted(names, key=lambda n: order.get(n, len(order)))


def _rank(ed: Editor, tensor: str) -> int:
    shape = ed.shape(tensor)
    return len(shape) if shape is not None else 0


def _named(model: onnx.ModelProto, outputs: list[str]) -> onnx.ModelProto:
    """``model`` with the producers of ``outputs`` named (after their output) where unnamed, so
    the chip's checks can be asked about them by name."""
    if all(n.name for n in model.graph.node if n.output and n.output[0] in outputs):
        return model
    named = onnx.ModelProto()
    named.CopyFrom(model)
    wanted = set(outputs)
    for node in named.graph.node:
        if node.output and node.output[0] in wanted and not node.name:
            node.name = node.output[0]
    return named


def _affine(ed: Editor, node: onnx.NodeProto) -> tuple[np.ndarray, np.ndarray] | None:
    """An inference BatchNormalization of constant parameters over a static input of rank
    >= 2, as its per-channel (scale, shift) in float64; else None."""
    if node.op_type != "BatchNormalization" or node.domain not in STANDARD_DOMAINS \
            or len(node.input) < 5 or len([o for o in node.output if o]) != 1 \
            or int(attr(node, "training_mode", 0)):
        return None
    x = ed.shape(node.input[0])
    if x is None or len(x) < 2 or not all(isinstance(d, int) and d > 0 for d in x):
        return None
    params = [ed.constant(name) for name in node.input[1:5]]
    if any(p is None or p.size != x[1] for p in params):
        return None
    gamma, beta, mean, var = (np.asarray(p, np.float64).reshape(-1) for p in params)
    scale = gamma / np.sqrt(var + float(attr(node, "epsilon", 1e-5)))
    if not np.all(np.isfinite(scale)):
        return None
    return scale, beta - mean * scale


def _rewrite(model: onnx.ModelProto, outputs: list[str], form: str
             ) -> tuple[onnx.ModelProto, dict[str, list[str]]]:
    """``model`` with the BatchNormalizations computing ``outputs`` written in ``form``; per
    output, the names of the nodes made (the one keeping the BatchNormalization's name last)."""
    ed = Editor(model, REWRITE)
    ed.freeze_shapes()
    made = {}
    for output in outputs:
        node = ed.producer(output)
        scale, shift = _affine(ed, node)
        rank, channels = _rank(ed, node.input[0]), scale.size
        name, source = node.name or output, node.input[0]
        dtype = np.float32
        ed.remove(node)
        if form == "conv":
            weight = ed.add_initializer(scale.reshape(channels, 1, 1, 1).astype(dtype),
                                        f"{output}/scale")
            bias = ed.add_initializer(shift.astype(dtype), f"{output}/shift")
            made[output] = [ed.make_node("Conv", [source, weight, bias], [output], name,
                                         kernel_shape=[1, 1], group=channels).name]
            continue
        shape = (1, channels, *(1,) * (rank - 2))
        scaled = ed.unique_tensor(f"{output}/scaled")
        mul = ed.make_node("Mul", [source, ed.add_initializer(scale.reshape(shape).astype(dtype),
                                                             f"{output}/scale")],
                           [scaled], f"{name}/scale")
        add = ed.make_node("Add", [scaled, ed.add_initializer(shift.reshape(shape).astype(dtype),
                                                             f"{output}/shift")],
                           [output], name)
        made[output] = [mul.name, add.name]
    ed.thaw_shapes()
    return ed.finish(), made
