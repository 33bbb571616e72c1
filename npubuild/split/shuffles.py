"""Channel shuffles on the NPU of every chip npubuild compiles for, listed in its table or not.

ShuffleNet's channel shuffle (a Reshape to ``(N, g, C/g, H, W)``, a Transpose of the two
channel axes, a Reshape back; or the same through rank-4 tensors) permutes the channels of a
4-D tensor and keeps every row. Compile runs such a chain as one ``channel_permute`` layer in
the layer groups around it (`npubuild.npu.from_qgraph.fold_channel_permutations`), or, where
LMEM cannot hold a row of every channel, as a strided copy by the DMA engine between groups:
data movement every NPU does, whatever the chip's op table says of rank-5 tensors or of
Transpose (npu-tiny lists ranks 1 to 4, npu-strict neither Reshape nor Transpose: each shuffle
was a CPU round trip). `channel_permutations` finds the chains by compile's own search and
test (`permutation_chains`, `moved_channel_order`) on the ONNX nodes, so split places on the
NPU what compile folds, and only that: a Reshape and Transpose that do not permute the
channels keep the table's answer.

A vendor's compiler takes the nodes one by one: on its chip the op table stands.
"""

from __future__ import annotations

import numpy as np

from npubuild import backends
from npubuild.npu.from_qgraph import moved_channel_order, permutation_chains
from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.split.graph import OpGraph
from npubuild.targets.constraints import moves_no_data, unlisted_reasons
from npubuild.targets.model import Chip
from npubuild.targets.view import GraphFacts, NodeView

def channel_permutations(og: OpGraph, facts: GraphFacts, chip: Chip) -> list[list[int]]:
    """The chains of Transposes and layout ops (Reshape, Flatten, Squeeze, Unsqueeze, Identity,
    a float Cast: what quantize lowers as a reshape; node indices, in order) that compile folds
    into one channel permutation each; none on a chip whose compiler is a vendor's."""
    if not backends.of(chip).plans_lmem:
        return []
    nodes, outputs = og.nodes, set(og.outputs)

    def permuting(i: int) -> bool:  # what quantize lowers as a reshape or a transpose
        view = NodeView(nodes[i], facts)
        return (view.node.domain in STANDARD_DOMAINS and len(view.node.output) == 1
                and (view.op == "Transpose" or moves_no_data(view))
                and not unlisted_reasons(view, chip))

    def only_reader(i: int) -> int | None:
        out = nodes[i].output[0]
        readers = [j for j in og.succs[i] if out in og.uses[j]]
        return None if out in outputs or len(readers) != 1 else readers[0]

    def permutes(chain: list[int]) -> bool:
        def move(index: np.ndarray) -> np.ndarray:
            for i in chain:
                view = NodeView(nodes[i], facts)
                if view.op == "Transpose":
                    index = np.transpose(index, view.attr("perm"))
                else:
                    index = index.reshape(_static(facts.shape(view.node.output[0])))
            return index

        first = _static(facts.shape(nodes[chain[0]].input[0]))
        last = _static(facts.shape(nodes[chain[-1]].output[0]))
        return moved_channel_order(first, last, move) is not None

    return permutation_chains(len(nodes), only_reader, permuting, permutes)


def _static(shape) -> tuple[int, ...]:
    return tuple(int(d) for d in shape)
