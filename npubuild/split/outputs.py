"""Write a split plan out and prove it: submodels, graph_infos.json, support.json, the picture.

The unsplit model runs once in ONNX Runtime with every boundary tensor as an extra output;
those values give ``graph_infos.json`` its concrete shapes and are what the runner's results
are compared against, boundary by boundary, so a failure names the first tensor that differs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx

from npubuild import onnx_io
from npubuild.atomic import write_json, write_text
from npubuild.errors import BuildError
from npubuild.proofs import compare
from npubuild.split import graph_infos
from npubuild.split.draw import segments_svg
from npubuild.split.extract import SegmentIO, segment_io, submodel
from npubuild.split.plan import SplitPlan

TOLERANCE = 1e-5


def reference_values(plan: SplitPlan, feeds: dict[str, np.ndarray],
                     names: list[str]) -> dict[str, np.ndarray]:
    """The unsplit model's value of every tensor in ``names`` (inputs come from ``feeds``)."""
    model = onnx_io.clone(plan.model)
    infos = {v.name: v for v in [*model.graph.input, *model.graph.value_info]}
    present = {o.name for o in model.graph.output}
    for name in names:
        if name not in present and name not in feeds and name in infos:
            model.graph.output.append(infos[name])
            present.add(name)
    wanted = [n for n in names if n in present]
    values = onnx_io.run(model, feeds, wanted)
    values.update({n: np.asarray(feeds[n]) for n in names if n in feeds})
    return values


def write_split(plan: SplitPlan, out: Path, feeds: dict[str, np.ndarray],
                layout: str = "NCHW") -> tuple[list[SegmentIO], dict[str, np.ndarray]]:
    """Every split artifact in ``out``; returns the boundaries and the reference values."""
    og = plan.graph
    io = segment_io(og, plan.segments)
    names = list(dict.fromkeys([*og.inputs, *(t for s in io for t in (*s.inputs, *s.outputs)),
                                *og.outputs]))
    reference = reference_values(plan, feeds, names)
    shapes = {n: list(np.shape(v)) for n, v in reference.items()}
    for seg, seg_io in zip(plan.segments, io):
        onnx_io.save_model(submodel(plan.model, og, seg, seg_io, shapes), out / f"graph_{seg.index}.onnx")
    infos = graph_infos.build([(s.device, x.inputs, x.outputs) for s, x in zip(plan.segments, io)],
                              shapes, og.inputs, og.outputs, layout)
    graph_infos.write(out / graph_infos.FILE_NAME, infos)
    write_json(out / "support.json", {**plan.summary(),
                                      "nodes": [p.as_dict() for p in plan.placements]})
    write_text(out / "segments.svg", segments_svg(_cards(plan, io), _title(plan)))
    return io, reference


def _cards(plan: SplitPlan, io: list[SegmentIO]) -> list[dict]:
    return [{"device": s.device, "nodes": [plan.graph.nodes[i].op_type for i in s.nodes],
             "inputs": x.inputs, "outputs": x.outputs,
             "reasons": [r.split(":")[0] for i in s.nodes for r in plan.reasons[i][:1]]}
            for s, x in zip(plan.segments, io)]


def _title(plan: SplitPlan) -> str:
    s = plan.summary()
    return (f"{plan.model.graph.name or 'model'} on {plan.chip.name}: {s['npu_segments']} NPU + "
            f"{s['cpu_segments']} CPU submodels, {s['npu_nodes']} NPU / {s['cpu_nodes']} CPU nodes")


def prove(out: Path, feeds: dict[str, np.ndarray], reference: dict[str, np.ndarray]) -> dict:
    """Run the submodels in order and compare every boundary tensor with the unsplit model."""
    from npubuild.runtime.runner import Runner

    runner = Runner(out)
    got = runner.run(feeds, keep_intermediates=True)
    worst = 0.0
    for graph in runner.graphs:
        ref = {t: reference[t] for t in graph.outputs}
        sims, bad = compare(ref, got, tolerance=TOLERANCE)
        if bad:
            raise BuildError(f"running the submodels in order differs from the unsplit model: "
                             f"{graph.name} output {bad[0]}", stage="split",
                             hint="this is a bug in the split; support.json shows the cut")
        worst = max([worst, *(s.max_abs for s in sims.values())])
    return {"outputs_equal": True, "max_abs": worst, "tolerance": TOLERANCE}


def prove_rewrite(model: onnx.ModelProto, rewritten: onnx.ModelProto,
                  feeds: dict[str, np.ndarray]) -> dict:
    """The model the plan is about (convs rewritten for the chip, `legalize`) against the
    fused model on the proof inputs, within the split's tolerance of each output's scale."""
    from npubuild import proofs

    names = [o.name for o in model.graph.output]
    expected = proofs.run(model, feeds, names)
    got, scales = proofs.run_with_scales(rewritten, feeds, names)
    sims, bad = compare(expected, got, tolerance=TOLERANCE, scales=scales)
    if bad:
        raise BuildError(f"the convs rewritten for the chip change the model: {bad[0]}",
                         stage="split", hint="report this with the model; `split: {force_cpu: "
                                             "[<conv>]}` does not help, the rewrite is the chip's")
    return {"max_rel": max((s.max_rel for s in sims.values()), default=0.0)}


def default_layout(model: onnx.ModelProto) -> str:
    shapes = [onnx_io.value_shape(v) for v in onnx_io.graph_inputs(model)]
    return "NCHW" if shapes and len(shapes[0]) == 4 else "any"
