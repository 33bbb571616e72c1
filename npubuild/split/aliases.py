"""Ops the chip's table lacks, written as the op it lists that computes the same.

A ``Sum`` of two tensors is an ``Add``: ONNX defines both with multidirectional broadcasting,
and the quantizer lowers both to one integer add (`npubuild.quant.ops.add_sub`), so the
rewrite is exact in float and in int8. Caffe2's exports write residual additions as Sum
(light-shufflenet's 13), and npu-strict lists Add but not Sum: each was a CPU round trip.
`legal_aliases` renames the node's op where the chip lacks it and runs the alias
(`legalize.kept_rewrite`, the chip's checks and LMEM fit included); a Sum of more or fewer
operands, which the quantizer has no kernel for either, stays as it is.
"""

from __future__ import annotations

import onnx

from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.surgery.graph import Editor
from npubuild.targets.constraints import effective_spec
from npubuild.targets.model import Chip

REWRITE = "legal_aliases"
ALIASES = {"Sum": ("Add", 2)}  # op -> (the op it is, with that many operands)


def legal_aliases(model: onnx.ModelProto, chip: Chip, keep: set[str] = frozenset()
                  ) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with every node the chip lacks whose alias it runs (but those whose output is
    in ``keep``) written as that alias; the names of the nodes rewritten, in graph order ([]
    and ``model`` itself when none is)."""
    from npubuild.split.legalize import kept_rewrite

    candidates = [n.output[0] for n in model.graph.node
                  if n.output and n.output[0] not in keep and _aliased(n, chip)]
    if not candidates:
        return model, []
    rewritten, made, legal = kept_rewrite(model, candidates, _rewrite, chip)
    return (rewritten, [made[out][0] for out in legal]) if legal else (model, [])


def _aliased(node: onnx.NodeProto, chip: Chip) -> bool:
    if node.op_type not in ALIASES or node.domain not in STANDARD_DOMAINS:
        return False
    alias, operands = ALIASES[node.op_type]
    return (effective_spec(chip, node.op_type) is None and effective_spec(chip, alias) is not None
            and len([i for i in node.input if i]) == operands)


def _rewrite(model: onnx.ModelProto, outputs: list[str]
             ) -> tuple[onnx.ModelProto, dict[str, list[str]]]:
    """``model`` with the nodes computing ``outputs`` renamed to their alias; per output, the
    node's name."""
    ed = Editor(model, REWRITE)
    made = {}
    for output in outputs:
        node = ed.producer(output)
        node.op_type = ALIASES[node.op_type][0]
        node.name = node.name or ed.unique_node(output)
        node.doc_string = f"npubuild surgery: {REWRITE}"
        made[output] = [node.name]
    ed.touch()
    return ed.finish(), made
