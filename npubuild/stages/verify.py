"""Stage `verify`: the deployed pipeline against the float original, end to end.

The deployed pipeline is the split runner with CPU submodels in ONNX Runtime and NPU submodels
in the simulator, on the recipe's verify data. Per model output: cosine, euclidean similarity,
SQNR and max abs error against the imported (float) model; the verdict checks
``verify.min_cosine`` on every sample, for every model output and every tensor an NPU
submodel hands over (what the NPU itself produces, even when a float CPU decode follows), and
``min_sqnr_db`` / ``max_abs`` when set. When it fails, the stage
bisects (`npubuild.verify.bisect`) and names the stage, tensor and rewrite/rule/layer behind the
drop. Writes ``verify/verify.json`` (and ``verify/detections.png`` with ``verify.detections``);
a failed verdict makes the run exit 1 (the artifacts are kept for the report).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from npubuild import onnx_io
from npubuild.atomic import write_json
from npubuild.metrics import similarity
from npubuild.stages import StageContext

NO_NPU_NOTE = ("no NPU graph: the deployed pipeline is the CPU submodels alone (ONNX Runtime), "
               "checked against the float original")
DIRS = ("import", "surgery", "fusion", "split", "quantize", "compile")


def data_files(loaded) -> list[Path]:
    """The verify data (or, without it, the calibration data): part of the stage's key."""
    spec = loaded.recipe.verify
    if spec.data:
        return loaded.resolve_glob(spec.data, "verify", "data")
    calibration = loaded.recipe.quantization.calibration.data
    if calibration:
        return loaded.resolve_glob(calibration, "quantization", "calibration", "data")
    raise loaded.error("verify needs data: set verify.data (or quantization.calibration.data)",
                       "verify")


def run(ctx: StageContext) -> dict:
    from npubuild.quant import data, onnx_inputs
    from npubuild.quant.pipeline import SplitPipeline
    from npubuild.runtime import Runner
    from npubuild.runtime.simulator import simulator_backend
    from npubuild.verify.reference import FloatReference, original_names

    spec, dirs = ctx.recipe.verify, ctx.upstream
    pipeline = SplitPipeline(dirs["split"])
    inputs = onnx_inputs.input_infos(pipeline, ctx.recipe.model.inputs)
    files = data_files(ctx.loaded)
    samples = list(ctx.progress(data.load_samples(files, inputs, spec.samples),
                                total=min(spec.samples, len(files)), description="verify"))
    deployed = Runner(dirs["split"], backends={"npu": simulator_backend(dirs["compile"].parent)})
    original = onnx_io.load_model(dirs["import"] / "model.onnx")
    surgery_model = onnx_io.load_model(dirs["surgery"] / "model.onnx")
    reference = FloatReference(original, pipeline.outputs, original_names(surgery_model))
    handed_over = npu_handovers(pipeline)
    refs, gots, floats = [], [], []
    for feeds in samples:
        gots.append(deployed.run(feeds, keep_intermediates=True))
        refs.append(reference(feeds))
        floats.append(pipeline.runner.run(feeds, keep_intermediates=True))
    metrics = output_metrics(refs, gots, floats, reference.missing)
    boundaries = {name: tensor_metrics([f[name] for f in floats], [g[name] for g in gots])
                  for name in handed_over}
    failures = verdict(metrics, spec) + boundary_verdict(boundaries, spec)
    result = {"passed": not failures, "failures": failures, "samples": len(samples),
              "data": [str(f) for f in files[:len(samples)]], "outputs": metrics,
              "npu_outputs": boundaries, "npu_graphs": len(pipeline.npu_graphs)}
    if not pipeline.npu_graphs:
        result["note"] = NO_NPU_NOTE
    if failures:
        result["bisection"] = bisect_sample(dirs, pipeline, reference, samples[0], spec.min_cosine)
    if spec.detections:
        result["detections"] = detections(ctx, inputs[0], files[:len(samples)], refs, gots, floats,
                                          pipeline.outputs)
    write_json(ctx.out / "verify.json", result)
    return {"accuracy": {"outputs": metrics, "data": "verify", "samples": len(samples),
                         "against": "float original (import stage)"},
            "verify": {k: v for k, v in result.items() if k not in ("outputs", "data")}}


def npu_handovers(pipeline) -> list[str]:
    """Tensors an NPU submodel hands to the CPU (or to the model's caller): what the NPU
    itself produces, checked even when a float CPU decode follows it."""
    return [t for g in pipeline.npu_graphs for t in g.outputs if t not in pipeline.outputs]


def tensor_metrics(refs: list[np.ndarray], gots: list[np.ndarray]) -> dict:
    """Similarity over all samples together, and the worst sample's cosine."""
    sim = similarity(np.concatenate([r.ravel() for r in refs]),
                     np.concatenate([g.ravel() for g in gots])).as_dict()
    sim["min_sample_cosine"] = min(similarity(r, g).cosine for r, g in zip(refs, gots))
    return sim


def output_metrics(refs: list[dict], gots: list[dict], floats: list[dict], missing: list[str]) -> dict:
    """Per model output, over all samples; outputs the original lacks are compared with the
    float pipeline (the rewritten model) and say so."""
    out = {}
    for name in [*refs[0], *(m for m in missing if m not in refs[0])]:
        source = floats if name in missing else refs
        out[name] = tensor_metrics([r[name] for r in source], [g[name] for g in gots])
        out[name]["reference"] = "float pipeline (after surgery)" if name in missing else "float original"
    return out


def verdict(metrics: dict, spec) -> list[str]:
    failures = []
    for name, m in metrics.items():
        if m["min_sample_cosine"] < spec.min_cosine:
            failures.append(f"output {name!r}: cosine {m['min_sample_cosine']:.6f} < min_cosine "
                            f"{spec.min_cosine} on the worst sample (all samples: {m['cosine']:.6f})")
        if spec.min_sqnr_db is not None and (m["sqnr_db"] is not None and m["sqnr_db"] < spec.min_sqnr_db):
            failures.append(f"output {name!r}: SQNR {m['sqnr_db']:.2f} dB < min_sqnr_db {spec.min_sqnr_db}")
        if spec.max_abs is not None and m["max_abs"] > spec.max_abs:
            failures.append(f"output {name!r}: max abs error {m['max_abs']:.4g} > max_abs {spec.max_abs}")
    return failures


def boundary_verdict(boundaries: dict, spec) -> list[str]:
    return [f"NPU output {name!r}: cosine {m['min_sample_cosine']:.6f} < min_cosine "
            f"{spec.min_cosine} on the worst sample (against the float pipeline)"
            for name, m in boundaries.items() if m["min_sample_cosine"] < spec.min_cosine]


def bisect_sample(dirs, pipeline, reference, feeds, min_cosine: float) -> dict:
    """Stage by stage on one sample: original → surgery → fusion → split → quantize → compile."""
    from npubuild.quant.qgraph import QGraph
    from npubuild.runtime import Runner
    from npubuild.runtime.simulator import simulator_backend
    from npubuild.verify.bisect import bisect, quantize_tensor_drops

    qgraphs = {g.index: QGraph.load(dirs["quantize"] / f"graph_{g.index}.qgraph.json")
               for g in pipeline.npu_graphs}

    def model_outputs(stage):
        return lambda: onnx_io.run(onnx_io.load_model(dirs[stage] / "model.onnx"), feeds)

    def original():
        values = reference(feeds)
        surgery = model_outputs("surgery")()
        return {**surgery, **values}  # outputs the original lacks compare surgery with itself

    stage_outputs = {
        "import": original,
        "surgery": model_outputs("surgery"),
        "fusion": model_outputs("fusion"),
        "split": lambda: pipeline.runner.run(feeds, keep_intermediates=True),
        "quantize": lambda: pipeline.quantized_runner(qgraphs).run(feeds, keep_intermediates=True),
        "compile": lambda: Runner(dirs["split"], backends={"npu": simulator_backend(dirs["compile"].parent)}
                                  ).run(feeds, keep_intermediates=True),
    }
    result = bisect(dirs, stage_outputs, min_cosine,
                    lambda: quantize_tensor_drops(pipeline, qgraphs, feeds))
    return result.as_dict()


def detections(ctx, info, images: list[Path], refs: list[dict], gots: list[dict],
               floats: list[dict], outputs: list[str]) -> dict:
    """Boxes found by the float model and by the deployed pipeline on every verify image, their
    agreement, and the picture of every image (green: float, red: deployed, class names)."""
    from npubuild.verify import detections as det

    hw = tuple(info.shape[2:]) if info.layout != "NHWC" else tuple(info.shape[1:3])
    names = det.class_names(onnx_io.load_model(ctx.upstream["import"] / "model.onnx"),
                            ctx.recipe.verify.class_names)
    totals = {"float_boxes": 0, "deployed_boxes": 0, "matched": 0}
    found, per_image = [], []
    for path, ref, got, flt in zip(images, refs, gots, floats):
        reference = det.boxes(det.yolov8_output0({n: {**flt, **ref}[n] for n in outputs}, hw))
        deployed = det.boxes(det.yolov8_output0({n: got[n] for n in outputs}, hw))
        agreement = det.agreement(reference, deployed)
        for key, value in agreement.items():
            totals[key] += value
        found.append((reference, deployed))
        per_image.append({"image": path.name, "float": det.as_records(reference, names),
                          "deployed": det.as_records(deployed, names), **agreement})
    det.draw(images[:len(found)], hw, found, names, ctx.out / "detections.png")
    recall = totals["matched"] / totals["float_boxes"] if totals["float_boxes"] else None
    return {"picture": "detections.png", "images": len(refs), **totals, "box_recall": recall,
            "class_names": "recipe" if ctx.recipe.verify.class_names else
            "model metadata" if names else "none (class ids)", "per_image": per_image}
