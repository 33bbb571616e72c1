"""Model outputs a CPU part *selects* from what the NPU hands over.

An end-to-end detector's head (isbnx's Ultralytics YOLO: ``TopK`` over the best class score of
33,600 anchors, then ``GatherElements`` of the boxes and scores by its indices, the class as
the index modulo the class count) outputs its top 300 rows in score order. Which rows, and in
which order, is a step function of the scores: anchors whose scores tie or nearly tie (most of
the 300 score 0.00) swap places under any change at all, so the output's element-wise cosine
measures the tie-breaking, not the accuracy (1e-4 of relative noise on the NPU's tensors puts
isbnx's output at 0.89). What the deployed model can get wrong is in what the selection reads:
the NPU's tensors, which the CPU part then selects from in float exactly as the float model
does. `selected_outputs` names, for each model output computed through such an index, the NPU
hand-over tensors it is computed from: verify judges those with the output's thresholds and
reports the output's own figures (`npubuild.verify.verdict`).
"""

from __future__ import annotations

from typing import Collection, Iterable, Sequence

import onnx

from npubuild import onnx_io
from npubuild.onnx_io import STANDARD_DOMAINS

# The outputs of these ops that are indices chosen by comparing values (a TopK's values are
# the sorted inputs themselves, continuous in them: not an index). A TopK ranks many
# candidates, most of them near-ties (isbnx: 300 of 33,600 anchors, most scoring 0.00). An
# ArgMax over one clear peak is stable, and its output is judged as it is: SwiftF0's pitch,
# read at its best bin, keeps cosine 1.0000 in the zoo, and judged through its hand-overs
# instead its search chose a pipeline at 0.90 and 35 fps where it had 1.0000 and 396.
INDEX_OUTPUTS = {"TopK": 1}


def selected_outputs(cpu_graphs: Iterable[onnx.GraphProto], outputs: Sequence[str],
                     handed_over: Collection[str]) -> dict[str, list[str]]:
    """Model output -> the NPU hand-over tensors it is computed from, for each output that
    depends on the indices a TopK of the CPU graphs chooses (`INDEX_OUTPUTS`) and on at
    least one hand-over tensor; other outputs are absent. The walk stops at the hand-over
    tensors (the NPU computed them) and at the model's inputs."""
    producers: dict[str, onnx.NodeProto] = {}
    for graph in cpu_graphs:
        for node in graph.node:
            for name in node.output:
                if name:
                    producers[name] = node
    handed = set(handed_over)
    selected = {}
    for output in outputs:
        boundary, chosen = _ancestry(output, producers, handed)
        if chosen and boundary:
            selected[output] = sorted(boundary)
    return selected


def _ancestry(tensor: str, producers: dict, handed: set[str]) -> tuple[set[str], bool]:
    """(hand-over tensors among ``tensor``'s ancestors, whether an index output is one)."""
    reached = onnx_io.upstream([tensor], producers, stop=handed)
    return reached & handed, any(_is_index_output(producers.get(name), name)
                                 for name in reached - handed)


def _is_index_output(node: onnx.NodeProto | None, name: str) -> bool:
    index = INDEX_OUTPUTS.get(node.op_type) if node is not None \
        and node.domain in STANDARD_DOMAINS else None
    return index is not None and index < len(node.output) and node.output[index] == name
