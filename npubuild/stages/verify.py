"""Stage `verify`: the deployed pipeline against the float original, end to end.

The deployed pipeline is the split runner with CPU submodels in ONNX Runtime and NPU submodels
in the simulator, on the recipe's verify data. Per model output: cosine, euclidean similarity,
SQNR and max abs error against the imported (float) model; the verdict checks
``verify.min_cosine`` (and ``min_sqnr_db`` / ``max_abs`` when set). When it fails, the stage
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
    refs, gots, floats = [], [], []
    for feeds in samples:
        gots.append(deployed.run(feeds))
        refs.append(reference(feeds))
        floats.append(pipeline.runner.run(feeds) if reference.missing else {})
    metrics = output_metrics(refs, gots, floats, reference.missing)
    failures = verdict(metrics, spec)
    result = {"passed": not failures, "failures": failures, "samples": len(samples),
              "data": [str(f) for f in files[:len(samples)]], "outputs": metrics}
    if failures:
        result["bisection"] = bisect_sample(dirs, pipeline, reference, samples[0], spec.min_cosine)
    if spec.detections:
        result["detections"] = detections(ctx, inputs[0], files[0], refs[0], gots[0], floats[0])
    write_json(ctx.out / "verify.json", result)
    return {"accuracy": {"outputs": metrics, "data": "verify", "samples": len(samples),
                         "against": "float original (import stage)"},
            "verify": {k: v for k, v in result.items() if k not in ("outputs", "data")}}


def output_metrics(refs: list[dict], gots: list[dict], floats: list[dict], missing: list[str]) -> dict:
    """Per output, over all samples; outputs the original lacks are compared with the float
    pipeline (the rewritten model) and say so."""
    out = {}
    for name in gots[0]:
        source = floats if name in missing else refs
        ref = np.concatenate([r[name].ravel() for r in source])
        got = np.concatenate([g[name].ravel() for g in gots])
        sim = similarity(ref, got).as_dict()
        sim["min_sample_cosine"] = min(similarity(r[name], g[name]).cosine for r, g in zip(source, gots))
        sim["reference"] = "float pipeline (after surgery)" if name in missing else "float original"
        out[name] = sim
    return out


def verdict(metrics: dict, spec) -> list[str]:
    failures = []
    for name, m in metrics.items():
        if m["cosine"] < spec.min_cosine:
            failures.append(f"output {name!r}: cosine {m['cosine']:.6f} < min_cosine {spec.min_cosine}")
        if spec.min_sqnr_db is not None and (m["sqnr_db"] is not None and m["sqnr_db"] < spec.min_sqnr_db):
            failures.append(f"output {name!r}: SQNR {m['sqnr_db']:.2f} dB < min_sqnr_db {spec.min_sqnr_db}")
        if spec.max_abs is not None and m["max_abs"] > spec.max_abs:
            failures.append(f"output {name!r}: max abs error {m['max_abs']:.4g} > max_abs {spec.max_abs}")
    return failures


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
        "split": lambda: pipeline.runner.run(feeds),
        "quantize": lambda: pipeline.quantized_outputs(feeds, qgraphs),
        "compile": lambda: Runner(dirs["split"], backends={"npu": simulator_backend(dirs["compile"].parent)}).run(feeds),
    }
    result = bisect(dirs, stage_outputs, min_cosine,
                    lambda: quantize_tensor_drops(pipeline, qgraphs, feeds))
    return result.as_dict()


def detections(ctx, info, image: Path, ref: dict, got: dict, float_out: dict) -> dict:
    from npubuild.verify import detections as det

    hw = tuple(info.shape[2:]) if info.layout != "NHWC" else tuple(info.shape[1:3])
    reference = det.boxes(det.yolov8_output0({**float_out, **ref}, hw))
    deployed = det.boxes(det.yolov8_output0(got, hw))
    det.draw(image, hw, reference, deployed, ctx.out / "detections.png")
    return {"image": str(image), "picture": "detections.png", **det.agreement(reference, deployed)}
