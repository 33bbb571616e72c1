"""Stage `verify`: the deployed pipeline against the float original, end to end.

The deployed pipeline is the split runner with CPU submodels in ONNX Runtime and NPU submodels
in the simulator, on the recipe's verify data. Every model output is compared with the imported
(float) model, every tensor an NPU submodel hands over (what the NPU itself produces, even when
a float CPU decode follows) with the float pipeline, by `npubuild.verify.judge`: similarity over
all samples, error relative to the range, the worst meaningful sample, the worst and the dead
channels. Model outputs are judged by ``verify``'s thresholds (``min_cosine`` ...), hand-over
tensors by ``verify.handover``, ``verify.slices`` (e.g. YOLOv8's class-score channels) by their
own, and ``verify.task`` adds top-1/top-5 agreement, box recall or text-map IoU
(`npubuild.verify.tasks`). When it fails, the stage bisects (`npubuild.verify.bisect`) and names
the stage, the tensor with the largest drop and the rewrite/rule/layer behind it. Writes
``verify/verify.json`` (and ``verify/detections.png`` with ``verify.detections``); a failed
verdict makes the run exit 1 (the artifacts are kept for the report).

The figures are gathered sample by sample (`gather`, `npubuild.verify.verdict.Streamed`):
each tensor's sums and extremes are taken as a sample comes, so verify holds one sample's
hand-over tensors at a time, and of every sample its model outputs (what the task, the
detections and the hints read) and each tensor's extremes (what ``unseen_values`` reads);
the figures are the bytes a judge of every sample's arrays gives. A failing verify's hints
run the samples once more, holding the tensors their verdicts read.

With ``--scheduler`` the samples run in batches on Dask workers (`npubuild.verify.fanout`),
which send back what `npubuild.verify.samples` keeps; the verdict is judged here, in sample
order, so the artifacts are the same bytes as a one-process build's.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from npubuild import onnx_io
from npubuild.atomic import write_json
from npubuild.errors import working_on
from npubuild.stages import StageContext
from npubuild.stages.files import calibration_files, verify_files
from npubuild.verify import readings, verdict
from npubuild.verify.bisect import RecipeFixes
from npubuild.verify.coverage import unseen_values
from npubuild.verify.samples import Observed, SampleRun, npu_handovers, npu_selections

NO_NPU_NOTE = ("no NPU graph: the deployed pipeline is the CPU submodels alone (ONNX Runtime), "
               "checked against the float original")
DIRS = ("import", "surgery", "fusion", "split", "quantize", "compile")


def run(ctx: StageContext) -> dict:
    from npubuild.quant import data, onnx_inputs

    spec, dirs = ctx.recipe.verify, ctx.upstream
    run_sample = SampleRun(dirs)
    pipeline, reference = run_sample.pipeline, run_sample.reference
    inputs = onnx_inputs.input_infos(pipeline, ctx.recipe.model.inputs, dirs.get("import"))
    files = verify_files(ctx.loaded)
    field = ("verify", "data") if spec.data else ("quantization", "calibration", "data")
    found = list(ctx.loaded.located(data.sources_and_samples(files, inputs, spec.samples), *field))
    sources, samples = [s for s, _ in found], [x for _, x in found]
    progress = ctx.progress(samples, total=len(samples), description="verify: samples")
    labels = [s.label(ctx.loaded.spelled) for s in sources]
    streamed, extremes = gather(ctx, pipeline, reference.missing,
                                observe(ctx, run_sample, progress, labels), len(samples))
    result = judge(ctx, streamed, pipeline, inputs[0], sources, samples)
    plan = result.pop("bisect")
    task = result.get("task") or {}
    # a verdict that failed only because the task judged nothing (its data never reach the
    # threshold) has no numerical drop to bisect and no range to blame: its note is the hint
    judged_nothing = (task.get("agreement") is None and task.get("note")
                      and all(f.startswith(f"task {task['task']}:") for f in result["failures"]))
    if not result["passed"] and not judged_nothing:
        calibrated = dirs["quantize"] / "calibration.json"
        if calibrated.is_file():
            passing = [o for o in pipeline.outputs if o not in plan["limits"]]
            result["unseen_values"] = unseen_values(json.loads(calibrated.read_text()),
                                                    extremes, labels, passing)
        fixes = RecipeFixes.from_recipe(ctx.recipe.quantization, bool(ctx.chip and ctx.chip.int16))
        result["bisection"] = bisect_sample(dirs, pipeline, reference, samples[plan["sample"]],
                                            plan["limits"], spec.slices, fixes)
        result["bisection"]["sample"] = sources[plan["sample"]].label(ctx.loaded.spelled)
        finding = result["bisection"]["finding"]
        if finding and finding["stage"] == "quantize" and finding.get("culprits"):
            refs, gots, floats = judged_values(ctx, pipeline, observe(ctx, run_sample, samples,
                                                                      labels))
            result["bisection"]["finding"] = measured_fixes(
                ctx, finding, list(plan["limits"]), fixes, pipeline, samples, refs, floats,
                reference.missing, inputs, gots)
    write_json(ctx.out / "verify.json", result)
    accuracy = {"outputs": result["outputs"], "data": "verify", "samples": len(samples),
                "against": "float original (import stage)"}
    accuracy.update({k: result[k] for k in ("slices", "task") if result.get(k)})
    return {"accuracy": accuracy,
            "verify": {k: v for k, v in result.items() if k not in ("outputs", "data")}}


def observe(ctx: StageContext, run_sample: SampleRun, samples: Iterable,
            labels: list[str]) -> Iterator[Observed]:
    """Every sample through the float original, the deployed and the float pipeline, in
    order: on the Dask workers with ``--scheduler`` (`npubuild.verify.fanout`), else here (an
    unexpected failure names the sample, ``labels``)."""
    if ctx.scheduler:
        from npubuild.verify import fanout

        sources = fanout.worker_sources(ctx.sources)
        if sources is not None:
            return fanout.samples_on_dask(ctx.scheduler, sources, samples)
        ctx.log.warning("verify: the upstream artifacts are not in a cache the workers can "
                        "reach; verifying in this process")
    return map(lambda feeds, label: _observed(run_sample, feeds, label), samples, labels)


def _observed(run_sample: SampleRun, feeds: dict, label: str) -> Observed:
    with working_on(sample=label):
        return run_sample(feeds)


def gather(ctx, pipeline, missing: list[str], observed: Iterable[Observed],
           count: int) -> tuple[verdict.Streamed, list[dict]]:
    """verify's figures of ``count`` samples gathered as they come (`verdict.Streamed`: a
    sample's hand-over tensors are let go once judged; the model outputs are kept), and per
    sample each float-pipeline tensor's extremes (what `unseen_values` reads of them: the
    array of its smallest and largest value). The recipe's names are checked on the first
    sample."""
    spec, handed_over = ctx.recipe.verify, npu_handovers(pipeline)
    streamed = verdict.Streamed(spec, count, pipeline.outputs, handed_over, missing,
                                verdict.output_channel_axis(ctx.recipe))
    extremes = []
    for ref, got, flt in observed:
        if not extremes:
            verdict.check_names(ctx.loaded, spec, pipeline.outputs,
                                {**{t: flt[t] for t in handed_over}, **ref})
        streamed.add(ref, got, flt)
        extremes.append({name: _extremes(value) for name, value in flt.items()})
        del ref, got, flt
    return streamed, extremes


def judged_values(ctx, pipeline, observed: Iterable[Observed]) -> tuple[list, list, list]:
    """Per sample the float original's, the deployed and the float pipeline's values of the
    tensors the hints' verdicts read (`verdict.judged_tensors`: the model outputs and the
    hand-over tensors a threshold, a selection or a slice reads), the others let go as each
    sample comes: the hints judge every sample again, each change they try."""
    kept = set(verdict.judged_tensors(ctx.recipe.verify, pipeline.outputs,
                                      npu_handovers(pipeline), npu_selections(pipeline)))
    refs, gots, floats = [], [], []
    for ref, got, flt in observed:
        refs.append(ref)
        gots.append({k: v for k, v in got.items() if k in kept})
        floats.append({k: v for k, v in flt.items() if k in kept})
    return refs, gots, floats


def _extremes(value) -> np.ndarray:
    value = np.asarray(value)
    return np.array([value.min(), value.max()]) if value.size else value.ravel()


def judge(ctx, streamed: verdict.Streamed, pipeline, info, sources: list,
          samples: list[dict]) -> dict:
    """Every metric and verdict of verify.json (`npubuild.verify.verdict`, which the
    quantize stage's precision search judges with too): outputs, hand-over tensors, slices,
    the task; ``bisect`` says what to bisect when something failed (tensor → cosine limit,
    and the sample where the first failing tensor is worst). ``streamed``: the samples'
    figures (`gather`); ``sources`` (`npubuild.quant.data.Source`) and ``samples`` are the
    verify samples, one of each per sample gathered."""
    spec, selected = ctx.recipe.verify, npu_selections(pipeline)
    refs, floats = streamed.refs, streamed.floats

    def detect(refs, gots, floats):
        return detections(ctx, info, sources, samples, refs, gots, floats, pipeline.outputs)

    def judged(spec):
        return streamed.verdict(spec, detect=detect, selected=selected)

    found = judged(spec)
    result = {"samples": len(refs), "data": [s.label(ctx.loaded.spelled) for s in sources],
              "outputs": found.outputs, "npu_outputs": found.npu_outputs,
              "npu_graphs": len(pipeline.npu_graphs), "slices": found.slices,
              **({"selected": selected} if selected else {})}
    if not pipeline.npu_graphs:
        result["note"] = NO_NPU_NOTE
    if found.detections is not None:
        result["detections"] = found.detections
    if found.task is not None:
        result["task"] = found.task
    reading = None if found.passed else readings.measure(spec, {**floats[0], **refs[0]},
                                                         pipeline.outputs, judged)
    if reading is not None:
        result["task_reading"] = reading
    plan = found.bisect()
    plan["limits"] = plan["limits"] or {name: spec.min_cosine for name in found.outputs}
    return {"passed": found.passed, "failures": found.failures, **result, "bisect": plan}


def measured_fixes(ctx, finding: dict, failing: list[str], fixes: RecipeFixes, pipeline,
                   samples: list, refs: list[dict], floats: list[dict], missing: list[str],
                   inputs, gots: list[dict]) -> dict:
    """The finding with a hint measured on every verify sample (`npubuild.verify.fixes`)."""
    import json

    from npubuild.quant import data
    from npubuild.verify import fixes as measured

    hw = input_hw(inputs[0]) if len(inputs[0].shape or []) == 4 else None
    outputs, handed_over = pipeline.outputs, npu_handovers(pipeline)
    selected = npu_selections(pipeline)
    # what the verdicts read (`judged_values`): a hand-over tensor no threshold reads fails
    # nothing and sets no margin, so leaving it out changes no figure a hint reports
    kept = verdict.judged_tensors(ctx.recipe.verify, outputs, handed_over, selected)

    def judge(gots):
        detect = (lambda r, g, f: verdict.detection_totals(r, g, f, outputs, hw)[0]) if hw else None
        return verdict.judge(ctx.recipe.verify, refs, gots, floats, outputs, handed_over, missing,
                             detect=detect, channel_axis=verdict.output_channel_axis(ctx.recipe),
                             selected=selected, judged_only=True)

    spec = ctx.recipe.quantization
    calibration = data.load_samples(calibration_files(ctx.loaded), inputs,
                                    spec.calibration.samples)
    workflow, graphs = deployed_workflow(ctx, pipeline, calibration)
    bench = measured.FixBench(workflow, graphs, samples, judge, kept)
    differences = bench.differences()
    if differences and spec.weight_rounding is None:
        # the quantize stage measured GPTQ rounding and kept it: its Gram matrices are a
        # second pass over the calibration samples, as there
        workflow.gather_weight_grams(data.load_samples(calibration_files(ctx.loaded), inputs,
                                                       spec.calibration.samples))
        workflow.options = replace(workflow.options, config=replace(
            workflow.options.config, weight_rounding="gptq"))
        bench = measured.FixBench(workflow, graphs, samples, judge, kept)
        differences = bench.differences()
    chip = ctx.chip
    trials = measured.measure(bench, finding["culprits"], failing, fixes,
                              chip_int16=bool(chip and chip.int16),
                              float_fallback=bool(chip is None or chip.float_fallback),
                              pinned=measured.pins(spec, workflow.options))
    search_file = ctx.upstream["quantize"] / "search.json"
    search = json.loads(search_file.read_text()) if search_file.is_file() else None
    name = f"worst cosine of {', '.join(repr(n) for n in failing)}"
    deployed = measured.figure(judge(gots), failing)
    return measured.with_measured(finding, trials, name, search, deployed,
                                  spec.auto.enabled, differences)


def deployed_workflow(ctx, pipeline, calibration) -> tuple:
    """The quantize stage's workflow as it deployed, calibrated again on ``calibration`` (the
    same samples in the same batches: the same statistics) with every tensor's histogram,
    and the deployed graphs: the recipe's options with what the stage chose on top (the
    scheme and method calibration.json names, cross-layer equalisation where it was kept,
    the precision search's overrides and per-tensor methods from search.json)."""
    from npubuild.quant.qgraph import QGraph
    from npubuild.quant.workflow import OverrideSpec, Workflow
    from npubuild.stages.quantize import options
    from npubuild.verify.fixes import moved_with

    quantize_dir = ctx.upstream["quantize"]
    deployed = {g.index: QGraph.load(quantize_dir / f"graph_{g.index}.qgraph.json")
                for g in pipeline.npu_graphs}
    calibrated = json.loads((quantize_dir / "calibration.json").read_text())
    search_file = quantize_dir / "search.json"
    search = json.loads(search_file.read_text()) if search_file.is_file() else {}
    graph_of = {t: qg for qg in deployed.values() for t in qg.tensors}
    chosen = tuple(OverrideSpec(tensors=(t,), precision=c["precision"])
                   for c in search.get("chosen") or [] if c["tensor"] in graph_of
                   for t in moved_with(graph_of[c["tensor"]], c["tensor"]))
    recipe = options(ctx.recipe.quantization, ctx.chip)
    config = replace(recipe.config, scheme=calibrated["scheme"], method=calibrated["method"],
                     tensor_methods=tuple(sorted(
                         ((search.get("calibration") or {}).get("per_tensor") or {}).items())))
    equalized = any("equalization" in g for g in calibrated["graphs"].values())
    workflow = Workflow(pipeline, replace(recipe, config=config,
                                          overrides=(*recipe.overrides, *chosen),
                                          equalize=equalized, histograms=True))
    workflow.calibrate(calibration)
    # observed with every histogram (a method trial reads them); the options say which the
    # quantize stage kept (`FixBench` hands the quantizer those alone)
    workflow.options = replace(workflow.options, histograms=recipe.histograms)
    return workflow, deployed


def bisect_sample(dirs, pipeline, reference, feeds, limits: dict[str, float], slices=(),
                  fixes: RecipeFixes = RecipeFixes()) -> dict:
    """Stage by stage on one sample: original → surgery → fusion → split → quantize → compile,
    on the failing tensors (``limits``: name → cosine threshold; slices by their label)."""
    from npubuild.quant.qgraph import QGraph
    from npubuild.runtime import Runner
    from npubuild.backends import npu_runner
    from npubuild.verify.bisect import bisect, quantize_tensor_drops

    qgraphs = {g.index: QGraph.load(dirs["quantize"] / f"graph_{g.index}.qgraph.json")
               for g in pipeline.npu_graphs}

    def model_outputs(stage):
        return lambda: onnx_io.run(onnx_io.load_model(dirs[stage] / "model.onnx"), feeds)

    def original():
        values = reference(feeds)
        surgery = model_outputs("surgery")()
        return {**surgery, **values}  # outputs the original lacks compare surgery with itself

    def with_slices(values: dict) -> dict:
        return {**values, **{c.label: verdict.cut(c, values[c.tensor]) for c in slices if c.tensor in values}}

    stage_outputs = {
        "import": original,
        "surgery": model_outputs("surgery"),
        "fusion": model_outputs("fusion"),
        "split": lambda: pipeline.runner.run(feeds, keep_intermediates=True),
        "quantize": lambda: pipeline.quantized_runner(qgraphs).run(feeds, keep_intermediates=True),
        "compile": lambda: Runner(dirs["split"], backends={"npu": npu_runner(dirs["compile"])}
                                  ).run(feeds, keep_intermediates=True),
    }
    stage_outputs = {stage: (lambda fn=fn: with_slices(fn())) for stage, fn in stage_outputs.items()}
    result = bisect(dirs, stage_outputs, limits,
                    lambda: quantize_tensor_drops(pipeline, qgraphs, feeds), fixes)
    return result.as_dict()


def detections(ctx, info, sources: list, samples: list[dict], refs: list[dict], gots: list[dict],
               floats: list[dict], outputs: list[str]) -> dict:
    """Boxes found by the float model and by the deployed pipeline on every verify sample, their
    agreement, and the picture of every sample (green: float, red: deployed, class names): its
    image, or (array data) the input tensor itself."""
    from npubuild.verify import detections as det

    names = det.class_names(onnx_io.load_model(ctx.upstream["import"] / "model.onnx"),
                            ctx.recipe.verify.class_names)
    totals, found = verdict.detection_totals(refs, gots, floats, outputs, input_hw(info))
    per_image = [{"image": source.label(), "float": det.as_records(reference, names),
                  "deployed": det.as_records(deployed, names), **agreement}
                 for source, (reference, deployed, agreement) in zip(sources, found)]
    pictures = [(s.label(), s.image or det.tensor_picture(x[info.name], info.layout))
                for s, x in zip(sources, samples)]
    det.draw(pictures[:len(found)], input_hw(info), [f[:2] for f in found], names,
             ctx.out / "detections.png")
    recall = totals.pop("box_recall")
    return {"picture": "detections.png", "images": len(refs), **totals, "box_recall": recall,
            "class_names": "recipe" if ctx.recipe.verify.class_names else
            "model metadata" if names else "none (class ids)", "per_image": per_image}


def input_hw(info) -> tuple[int, int]:
    """The first model input's height and width (NCHW unless the recipe says NHWC)."""
    return tuple(info.shape[2:]) if info.layout != "NHWC" else tuple(info.shape[1:3])
