"""Stage ``quantize``: the NPU submodels of ``split/`` become integer graphs.

Reads ``split/graph_infos.json`` and its submodels, the recipe's ``quantization`` section, the
model inputs' preprocessing and the calibration (and verify) data. Writes into ``quantize/``:

- ``graph_<i>.qgraph.json`` + ``.npz``: the quantized graph (``npubuild.quant.qgraph``), what
  ``compile`` reads;
- ``graph_<i>.qdq.onnx``: the same graph as a QDQ model ONNX Runtime runs (fake-quant reference);
- ``calibration.json``: per tensor, what calibration saw, the chosen range and the parameters;
- ``per_layer.json``: cosine / euclidean similarity / SQNR of every NPU tensor vs float, worst
  first, and the cross-check of the integer reference against ONNX Runtime;
- ``auto.json`` (with ``quantization.auto``): the overrides the mixed-precision search chose,
  what it tried, and the output cosine before and after (also in report.json and recipe.lock).

Proves: the integer reference equals ONNX Runtime on the QDQ model on ≥ 99.9 % of the elements
(a one-step difference on a float32 rounding tie counts as equal) and never differs by more
than one step (else the stage fails).
"""

from __future__ import annotations

from pathlib import Path

from npubuild.atomic import write_json
from npubuild.errors import BuildError, did_you_mean
from npubuild.quant import data, onnx_inputs
from npubuild.quant.pipeline import SplitPipeline
from npubuild.quant.quantizer import QuantConfig
from npubuild.quant.workflow import AutoTarget, Options, OverrideSpec, Workflow
from npubuild.stages import StageContext

NO_NPU_NOTE = "the split placed every node on the CPU: no NPU graph to quantize"
CALIBRATION_FIELD = ("quantization", "calibration", "data")


def data_files(loaded) -> list[Path]:
    """Calibration and verify files: part of the stage's cache key."""
    files = calibration_files(loaded)
    verify = loaded.recipe.verify.data
    if verify:
        files += [f for f in loaded.resolve_glob(verify, "verify", "data") if f not in files]
    return files


def calibration_files(loaded) -> list[Path]:
    spec = loaded.recipe.quantization.calibration
    if not spec.data:
        raise loaded.error("quantization needs calibration data", *CALIBRATION_FIELD[:2],
                           hint="set quantization.calibration.data, e.g. "
                                "\"pkg:skimage/data/[a-m]*.png\"")
    return loaded.resolve_glob(spec.data, *CALIBRATION_FIELD)


def check_override_names(loaded, pipeline: SplitPipeline) -> None:
    """Every node and tensor an override names must exist in the split model (on any device),
    as `split.force_cpu` requires: a misspelt name would otherwise change nothing, silently."""
    nodes, tensors = set(), set()
    for graph in pipeline.graphs:
        model = graph.model
        nodes.update(n.name for n in model.graph.node)
        tensors.update(o for n in model.graph.node for o in n.output)
        tensors.update(i.name for i in model.graph.input)
    for i, override in enumerate(loaded.recipe.quantization.overrides):
        for kind, names, known in (("nodes", override.nodes, nodes), ("tensors", override.tensors, tensors)):
            for j, name in enumerate(names):
                if name not in known:
                    raise loaded.error(
                        f"no {kind[:-1]} is called {name[:200]!r} in the split model"
                        + did_you_mean(name, known),
                        "quantization", "overrides", i, kind, j,
                        hint="`npubuild targets --check RECIPE` lists the nodes")


def options(spec, chip) -> Options:
    config = QuantConfig(scheme=spec.scheme, granularity=spec.granularity,
                         method=spec.calibration.method, percentile=spec.calibration.percentile,
                         bias=spec.bias, bias_correction=spec.bias_correction,
                         int16_underflow=bool(spec.int16_where_underflows and chip and chip.int16))
    overrides = tuple(OverrideSpec(tuple(o.nodes), tuple(o.tensors), o.precision)
                      for o in spec.overrides)
    return Options(config, overrides, chip_int16=bool(chip and chip.int16),
                   equalize=spec.cross_layer_equalization)


def auto_target(spec, chip) -> AutoTarget:
    """``quantization.auto`` for the library: int16 by default where the chip has it."""
    precision = spec.precision or ("int16" if chip is not None and chip.int16 else "float")
    return AutoTarget(spec.min_cosine, precision, spec.max_overrides, spec.candidates)


def run(ctx: StageContext) -> dict:
    spec = ctx.recipe.quantization
    pipeline = SplitPipeline(ctx.upstream["split"])
    check_override_names(ctx.loaded, pipeline)
    if not pipeline.npu_graphs:
        ctx.log.warning("quantize: %s", NO_NPU_NOTE)
        write_json(ctx.out / "calibration.json", {"scheme": spec.scheme, "graphs": {},
                                                  "note": NO_NPU_NOTE})
        write_json(ctx.out / "per_layer.json", {"tensors": [], "crosscheck": {}})
        return {"quantization": {"scheme": spec.scheme, "graphs": {}, "npu_graphs": 0,
                                 "note": NO_NPU_NOTE}}
    inputs = onnx_inputs.input_infos(pipeline, ctx.recipe.model.inputs)
    workflow = Workflow(pipeline, options(spec, ctx.chip), ctx.progress)

    cal_files = calibration_files(ctx.loaded)
    samples = ctx.loaded.located(data.load_samples(cal_files, inputs, spec.calibration.samples),
                                 *CALIBRATION_FIELD)
    count = workflow.calibrate(samples, total=min(spec.calibration.samples, len(cal_files)),
                               map_batches=_batch_mapper(ctx, workflow))
    workflow.quantize()
    verify_data = ctx.recipe.verify.data
    compare_files = ctx.loaded.resolve_glob(verify_data, "verify", "data") if verify_data else cal_files
    compare_field = ("verify", "data") if verify_data else CALIBRATION_FIELD
    compare = list(ctx.loaded.located(data.load_samples(compare_files, inputs, spec.compare_samples),
                                      *compare_field))
    auto = None
    if spec.auto is not None:
        auto = workflow.auto_precision(compare, auto_target(spec.auto, ctx.chip)).as_dict()
        write_json(ctx.out / "auto.json", auto)
        ctx.log.info("quantize: auto chose %d override(s), output cosine %.5f -> %.5f (target %s)",
                     len(auto["overrides"]), auto["output_cosine_before"],
                     auto["output_cosine_after"], spec.auto.min_cosine)
    files = workflow.write(ctx.out)
    evaluation = workflow.evaluate(compare)
    per_layer = evaluation.per_layer()
    crosscheck = evaluation.crosscheck_summary()
    write_json(ctx.out / "per_layer.json", {"order": "worst cosine first", "tensors": per_layer,
                                            "crosscheck": crosscheck})
    if not evaluation.crosscheck_ok():
        raise BuildError(_crosscheck_failure(crosscheck), stage="quantize")
    outputs = evaluation.outputs()
    overrides = workflow.override_gains(compare, outputs) if spec.overrides else []
    for row in overrides:
        if row["unmatched"]:
            ctx.log.warning("quantization override %s: no NPU node or tensor is called %s",
                            row["override"], ", ".join(map(repr, row["unmatched"])))
    return {
        "quantization": {
            "scheme": spec.scheme, "granularity": spec.granularity,
            "method": spec.calibration.method, "calibration_samples": count,
            "graphs": {q.name: _graph_summary(q) for q in workflow.qgraphs().values()},
            **({"equalization": workflow.equalization()} if spec.cross_layer_equalization else {}),
            "files": files, "crosscheck": {g: {k: v for k, v in c.items() if k != "worst_layers"}
                                           for g, c in crosscheck.items()},
            "worst_tensors": [{k: v for k, v in row.items() if k != "histogram"}
                              for row in per_layer[:5]], "overrides": overrides,
            **({"auto": auto} if auto is not None else {})},
        "accuracy": {"outputs": outputs, "data": "verify" if verify_data else "calibration"},
    }


def _batch_mapper(ctx: StageContext, workflow: Workflow):
    """Calibration batches on Dask when the build has a scheduler, else in this process."""
    if not ctx.scheduler:
        return None
    from npubuild.quant.fanout import calibration_on_dask

    if "split" not in ctx.sources:
        ctx.log.warning("quantize: the split artifacts are not in a cache the workers can "
                        "reach; calibrating in this process")
        return None
    return calibration_on_dask(ctx.scheduler, ctx.sources["split"], workflow.options)


def _graph_summary(qgraph) -> dict:
    cpu = [{"layer": layer.name, "reason": layer.attrs.get("reason", "")} for layer in qgraph.cpu_layers()]
    dtypes = {}
    for t in qgraph.tensors.values():
        dtypes[t.dtype] = dtypes.get(t.dtype, 0) + 1
    return {"layers": len(qgraph.layers), "npu_layers": len(qgraph.layers) - len(cpu),
            "cpu_layers": cpu, "tensor_dtypes": dtypes}


def _crosscheck_failure(summary: dict) -> str:
    bad = {g: s for g, s in summary.items() if not s["ok"]}
    parts = []
    for g, s in bad.items():
        worst = s["worst_layers"][0] if s["worst_layers"] else {}
        parts.append(f"{g}: {s['identical_fraction']:.5%} identical (+{s['tie_fraction']:.5%} "
                     f"float32 ties), max {s['max_lsb']} LSB "
                     f"(worst: layer {worst.get('layer')!r}, {worst.get('max_lsb')} LSB)")
    return ("the integer reference disagrees with ONNX Runtime on the QDQ model: " + "; ".join(parts)
            + " (needs >= 99.9 % identical or on a float32 tie, and <= 1 LSB)")
