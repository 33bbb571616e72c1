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

from npubuild import onnx_io, proofs
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
        report["note"] = why_all_cpu(json.loads((ctx.out / "support.json").read_text())["nodes"],
                                     deciding_inputs(model))
        ctx.log.warning("split: %s", report["note"])
    proofs.save(ctx.out, feeds)  # the submodels keep the model's inputs: the same proof inputs
    ctx.log.info("split: %d NPU + %d CPU submodels", report["npu_segments"], report["cpu_segments"])
    return {"split": report}


def why_all_cpu(nodes: list[dict], deciding: list[str] = ()) -> str:
    """Why a split put no node on the NPU: the commonest first reasons, counted (from
    ``support.json``'s nodes), and what to do where control flow decided by model inputs
    (``deciding``) or unknown shapes are among them (Silero VAD before import folded its
    constant pads: every tensor after them unshaped, 0 of 59 nodes on the NPU, and the warning
    said only that; its main model is one If on the sample-rate input)."""
    kinds = Counter(node["reasons"][0].split(":")[0] for node in nodes if node["reasons"])
    top = "; ".join(f"{count} of {len(nodes)} nodes: {kind}" for kind, count in kinds.most_common(3))
    text = f"the split placed every node on the CPU ({top}; every node's reasons: split/support.json)"
    if deciding:
        names = ", ".join(map(repr, deciding))
        text += (f". Control flow decided by input {names} runs on the CPU: to build the model "
                 f"for one value of it (a sample rate, a mode flag), give it in model.inputs: "
                 f"{{name: {deciding[0]}, value: ...}}")
    elif static_shapes.__doc__ in kinds:  # (an If's outputs are unshaped: the If is the cause)
        text += (". A tensor without a static shape cannot go to the NPU: fix every input's shape "
                 "in model.inputs, and add `- fold_constants: {}` to surgery to fold the "
                 "arithmetic that computes shapes")
    return text


def deciding_inputs(model) -> list[str]:
    """The model inputs an If's condition is computed from (in graph input order)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    seen = onnx_io.upstream([n.input[0] for n in model.graph.node if n.op_type == "If"], producers)
    return [v.name for v in model.graph.input if v.name in seen]
