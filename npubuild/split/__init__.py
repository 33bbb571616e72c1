"""The NPU/CPU split: which node runs where and why, the cut, the submodels and their proof.

    plan = plan_split(model, chip, spec)          # decide (no files)
    report = split_model(model, chip, spec, out)  # decide, write, prove

Modules, in the order the work happens: `graph` (index the ONNX graph), `einsum` (a linear
layer written as an Einsum of a constant weight, as a MatMul or a grouped 1x1 conv), `reductions` (a Max
of tensors, a ReduceMax or a ReduceSum, which the chip has no kernel for, as a MaxPool or a
conv), `aliases` (an op the chip lacks as the op it lists that computes the same: a Sum of
two tensors as an Add), `batchnorms` (an inference BatchNormalization the chip refuses as a
depthwise 1x1 conv, or a Mul and an Add), `groups` (a grouped conv the chip refuses for its groups as a conv per group), `legalize`
(convs the chip refuses for their stride, kernel, dilation or padding, and pools it refuses
for their kernel or stride, rewritten as ones it runs), `shuffles` (channel shuffles, which
compile runs as one channel permutation: on the NPU of every chip npubuild compiles for),
`plan` (support check + policy), `partition` (convex segments), `cost` (min_cost), `extract` (submodels),
`graph_infos` (the AutoSplit file), `outputs` (write + prove), `draw` (segments.svg).
"""

from __future__ import annotations

from pathlib import Path

import onnx

from npubuild.recipe.model import SplitSpec
from npubuild.split.plan import NodePlacement, SelectorError, SplitPlan, check_placement, plan_split
from npubuild.targets.model import Chip


def split_model(model: onnx.ModelProto, chip: Chip, spec: SplitSpec | None, out: str | Path,
                layout: str | None = None, feeds: dict | None = None) -> dict:
    """Split ``model`` for ``chip`` into ``out`` and prove, on the proof inputs ``feeds``
    (default: `npubuild.proofs.make_feeds`), that the submodels reproduce it.

    Returns the report fragment (segments, node counts, the proof's max difference).
    """
    from npubuild import proofs
    from npubuild.split.outputs import default_layout, prove, prove_rewrite, write_split

    out = Path(out)
    plan = plan_split(model, chip, spec)
    feeds = feeds if feeds is not None else proofs.make_feeds(model)
    summary = plan.summary()
    if plan.legal_convs:
        summary["legal_convs"].update(prove_rewrite(model, plan.model, feeds))
    _, reference = write_split(plan, out, feeds, layout or default_layout(model))
    return {**summary, "proof": prove(out, feeds, reference)}


__all__ = ["NodePlacement", "SelectorError", "SplitPlan", "check_placement", "plan_split",
           "split_model"]
