"""Stage ``split``: the fused model → NPU and CPU submodels, ``graph_infos.json`` and proof.

Reads ``model.onnx`` from the upstream stage's directory, the chip and the recipe's ``split:``
section; writes ``graph_<i>.onnx``, ``graph_infos.json``, ``support.json`` and
``segments.svg`` into ``ctx.out``. Running the submodels in order on the proof inputs
(``fusion/proof_inputs.npz``, `npubuild.proofs`; saved again as ``split/proof_inputs.npz`` for
the stages after it) must reproduce the unsplit model (ONNX Runtime on both sides, within 1e-5)
or the stage fails naming the tensor.
"""

from __future__ import annotations

import json
from collections import Counter

from npubuild import proofs
from npubuild.errors import BuildError
from npubuild.onnx_io import load_model
from npubuild.split import SelectorError, split_model
from npubuild.stages import StageContext
from npubuild.targets.constraints import static_shapes


def run(ctx: StageContext) -> dict:
    if ctx.chip is None:
        raise BuildError("no target chip was given", stage="split")
    upstream = next(iter(ctx.upstream.values()))
    model = load_model(upstream / "model.onnx")
    layout = ctx.recipe.model.layout
    feeds = proofs.load(upstream, model)
    try:
        report = split_model(model, ctx.chip, ctx.recipe.split, ctx.out, layout=layout,
                             feeds=feeds)
    except SelectorError as exc:
        raise ctx.loaded.error(exc.message, *exc.path, hint=exc.hint) from None
    if report["npu_segments"] == 0 and ctx.recipe.split.policy != "cpu_only":
        report["note"] = why_all_cpu(json.loads((ctx.out / "support.json").read_text())["nodes"])
        ctx.log.warning("split: %s", report["note"])
    proofs.save(ctx.out, feeds)  # the submodels keep the model's inputs: the same proof inputs
    ctx.log.info("split: %d NPU + %d CPU submodels", report["npu_segments"], report["cpu_segments"])
    return {"split": report}


def why_all_cpu(nodes: list[dict]) -> str:
    """Why a split put no node on the NPU: the commonest first reasons, counted (from
    ``support.json``'s nodes), and what to do where unknown shapes are among them (Silero VAD
    before import folded its constant pads: every tensor after them unshaped, 0 of 59 nodes on
    the NPU, and the warning said only that)."""
    kinds = Counter(node["reasons"][0].split(":")[0] for node in nodes if node["reasons"])
    top = "; ".join(f"{count} of {len(nodes)} nodes: {kind}" for kind, count in kinds.most_common(3))
    text = f"the split placed every node on the CPU ({top}; every node's reasons: split/support.json)"
    if static_shapes.__doc__ in kinds:
        text += (". A tensor without a static shape cannot go to the NPU: fix every input's shape "
                 "in model.inputs, and add `- fold_constants: {}` to surgery to fold the "
                 "arithmetic that computes shapes")
    return text
