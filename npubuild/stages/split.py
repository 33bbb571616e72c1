"""Stage ``split``: the fused model → NPU and CPU submodels, ``graph_infos.json`` and proof.

Reads ``model.onnx`` from the upstream stage's directory, the chip and the recipe's ``split:``
section; writes ``graph_<i>.onnx``, ``graph_infos.json``, ``support.json`` and
``segments.svg`` into ``ctx.out``. Running the submodels in order on the proof inputs
(``fusion/proof_inputs.npz``, `npubuild.proofs`; saved again as ``split/proof_inputs.npz`` for
the stages after it) must reproduce the unsplit model (ONNX Runtime on both sides, within 1e-5)
or the stage fails naming the tensor.
"""

from __future__ import annotations

from npubuild import proofs
from npubuild.errors import BuildError
from npubuild.onnx_io import load_model
from npubuild.split import SelectorError, split_model
from npubuild.stages import StageContext


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
    proofs.save(ctx.out, feeds)  # the submodels keep the model's inputs: the same proof inputs
    ctx.log.info("split: %d NPU + %d CPU submodels", report["npu_segments"], report["cpu_segments"])
    return {"split": report}
