"""Stage ``quantize``: the NPU submodels of ``split/`` become integer graphs.

Reads ``split/graph_infos.json`` and its submodels, the recipe's ``quantization`` and
``verify`` sections, the model inputs' preprocessing, the calibration and verify data, and the
``import``/``surgery`` models (the float original verify compares with). Quantizes in int8,
judges the result on the verify samples exactly as the verify stage will
(`npubuild.verify.verdict`), and where int8 misses verify's thresholds runs the precision
search (`npubuild.quant.search`, on by default) and confirms its choice on the integer
reference. Writes into ``quantize/``:

- ``graph_<i>.qgraph.json`` + ``.npz``: the quantized graph (``npubuild.quant.qgraph``), what
  ``compile`` reads;
- ``graph_<i>.qdq.onnx``: the same graph as a QDQ model ONNX Runtime runs (fake-quant reference);
- ``calibration.json``: per tensor, what calibration saw, the chosen range and the parameters;
- ``per_layer.json``: cosine / euclidean similarity / SQNR of every NPU tensor vs float, worst
  first, and the cross-check of the integer reference against ONNX Runtime;
- ``search.json`` (when the search ran): the tensors it kept out of int8 and why (the share of
  the needed gain each measured), the calibration methods it chose, every choice scored, the
  confirmations on the integer reference, and what would reach the thresholds when nothing
  the chip allows does (a summary in report.json, the choice in recipe.lock).

With ``--scheduler`` the calibration batches, the search's scores and its confirmations on
the integer reference run on Dask workers (`npubuild.quant.fanout`); the files are the same.

Proves: the integer reference equals ONNX Runtime on the QDQ model on ≥ 99.9 % of the elements
(a one-step difference on a float32 rounding tie counts as equal) and never differs by more
than one step (else the stage fails).
"""

from __future__ import annotations

import itertools
from dataclasses import replace
from pathlib import Path

from npubuild.atomic import write_json
from npubuild.errors import BuildError, did_you_mean
from npubuild.quant import data, onnx_inputs
from npubuild.quant.lower import EqualizationNotExact
from npubuild.quant.pipeline import SplitPipeline
from npubuild.quant.quantizer import QuantConfig
from npubuild.quant.search import PrecisionSearch, SearchSpec
from npubuild.quant.workflow import WIDE_WEIGHTS, Options, OverrideSpec, Workflow, tensor_names
from npubuild.split.cost import float_macs_per_second
from npubuild.stages import StageContext
from npubuild.stages.files import CALIBRATION_FIELD, calibration_files, verify_files
from npubuild.verify.verdict import SampleJudge, check_names, output_channel_axis

NO_NPU_NOTE = "the split placed every node on the CPU: no NPU graph to quantize"


def check_override_names(loaded, pipeline: SplitPipeline) -> None:
    """Every node and tensor an override names must exist in the split model (on any device),
    as `split.force_cpu` requires: a misspelt name would otherwise change nothing, silently."""
    nodes, tensors = set(), set()
    for graph in pipeline.graphs:
        model = graph.model
        nodes.update(n.name for n in model.graph.node)
        tensors.update(tensor_names(model))  # outputs, inputs, constant operands
    for i, override in enumerate(loaded.recipe.quantization.overrides):
        for kind, names, known in (("nodes", override.nodes, nodes), ("tensors", override.tensors, tensors)):
            for j, name in enumerate(names):
                if name not in known:
                    raise loaded.error(
                        f"no {kind[:-1]} is called {name[:200]!r} in the split model"
                        + did_you_mean(name, known),
                        "quantization", "overrides", i, kind, j,
                        hint="`npubuild targets --check RECIPE` lists the nodes")


# What an unset scheme, granularity, calibration method or weight rounding means (the report
# says so).
DEFAULTS = {"scheme": "asymmetric", "granularity": "per_channel", "method": "minmax",
            "weight_rounding": "nearest"}


def resolved(spec) -> dict[str, str]:
    """The scheme, weight granularity, calibration method and weight rounding quantization
    uses."""
    given = {"scheme": spec.scheme, "granularity": spec.granularity,
             "method": spec.calibration.method, "weight_rounding": spec.weight_rounding}
    return {k: v if v is not None else DEFAULTS[k] for k, v in given.items()}


def vendor_kernels(chip) -> tuple[tuple[str, str], ...]:
    """(op, int8 | float16) for each op whose nodes npubuild has no integer kernel for the
    chip's toolchain runs on the NPU all the same (its op table's `vendor_kernel`)."""
    if chip is None:
        return ()
    return tuple(sorted((op, spec.vendor_kernel) for op, spec in chip.ops.items()
                        if spec.vendor_kernel is not None))


def options(spec, chip) -> Options:
    chosen = resolved(spec)
    config = QuantConfig(scheme=chosen["scheme"], granularity=chosen["granularity"],
                         method=chosen["method"], percentile=spec.calibration.percentile,
                         bias=spec.bias, bias_correction=spec.bias_correction,
                         weight_rounding=chosen["weight_rounding"],
                         int16_underflow=bool(spec.int16_where_underflows and chip and chip.int16),
                         fc_integer_ranks=tuple(chip.fc_integer_ranks)
                         if chip and chip.fc_integer_ranks is not None else None,
                         vendor_kernels=vendor_kernels(chip))
    overrides = tuple(OverrideSpec(tuple(o.nodes), tuple(o.tensors), o.precision)
                      for o in spec.overrides)
    return Options(config, overrides, chip_int16=bool(chip and chip.int16),
                   equalize=bool(spec.cross_layer_equalization),
                   histograms=spec.calibration.method is None,
                   weight_grams=spec.weight_rounding == "gptq")


def search_spec(spec, chip) -> SearchSpec:
    """``quantization.auto`` for the library."""
    return SearchSpec(spec.enabled, spec.seconds, spec.precision, spec.max_overrides,
                      spec.min_cosine, spec.max_slowdown)


def verify_samples(ctx, inputs) -> list:
    """The samples verify judges (verify.data, else the calibration data; verify.samples)."""
    files = verify_files(ctx.loaded)
    field = ("verify", "data") if ctx.recipe.verify.data else CALIBRATION_FIELD
    return list(ctx.loaded.located(data.load_samples(files, inputs, ctx.recipe.verify.samples),
                                   *field))


def run(ctx: StageContext) -> dict:
    spec = ctx.recipe.quantization
    pipeline = SplitPipeline(ctx.upstream["split"])
    check_override_names(ctx.loaded, pipeline)
    if not pipeline.npu_graphs:
        ctx.log.warning("quantize: %s", NO_NPU_NOTE)
        write_json(ctx.out / "calibration.json", {"scheme": resolved(spec)["scheme"],
                                                  "graphs": {}, "note": NO_NPU_NOTE})
        write_json(ctx.out / "per_layer.json", {"tensors": [], "crosscheck": {}})
        return {"quantization": {"scheme": resolved(spec)["scheme"], "graphs": {}, "npu_graphs": 0,
                                 "note": NO_NPU_NOTE}}
    inputs = onnx_inputs.input_infos(pipeline, ctx.recipe.model.inputs, ctx.upstream.get("import"))
    workflow = Workflow(pipeline, options(spec, ctx.chip), ctx.progress)

    cal_files = calibration_files(ctx.loaded)

    def calibration_samples():
        return ctx.loaded.located(data.load_samples(cal_files, inputs, spec.calibration.samples),
                                  *CALIBRATION_FIELD)

    cal_total = min(spec.calibration.samples, len(cal_files))
    count = workflow.calibrate(calibration_samples(), total=cal_total,
                               map_batches=_batch_mapper(ctx, workflow))
    workflow.quantize()
    compare = verify_samples(ctx, inputs)
    judge = SampleJudge(ctx.recipe.verify, ctx.upstream, pipeline, compare, input_hw(inputs[0]),
                        channel_axis=output_channel_axis(ctx.recipe))
    check_names(ctx.loaded, ctx.recipe.verify, pipeline.outputs, {**judge.names, **judge.refs[0]})
    verdict = judge(workflow.deployed_values(compare, judge.kept))
    searched = spec.auto.enabled and spec.auto.precision in (None, "int16", "w16a16")
    equalization_measured = None
    if not verdict.passed and spec.cross_layer_equalization is None:
        workflow, verdict, equalization_measured = measured_equalization(
            workflow, judge, compare, verdict, searched,
            lambda w: w.calibrate(calibration_samples(), total=cal_total,
                                  map_batches=_batch_mapper(ctx, w)))
    rounding_measured = None
    if not verdict.passed and spec.weight_rounding is None:
        workflow.gather_weight_grams(calibration_samples(), total=cal_total,
                                     mapper=lambda w: _batch_mapper(ctx, w))
        verdict, rounding_measured = measured_weight_rounding(
            workflow, judge, compare, verdict, searched=searched)
    search = None
    if not verdict.passed and spec.auto.enabled:
        search = precision_search(ctx, workflow, compare, judge, verdict)
        write_json(ctx.out / "search.json", search)
    files = workflow.write(ctx.out)
    evaluation = workflow.evaluate(compare, judge.kept, spec.compare_samples)
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
            "scheme": workflow.options.config.scheme,
            "granularity": workflow.options.config.granularity,
            "method": workflow.options.config.method, "calibration_samples": count,
            "weight_rounding": workflow.options.config.weight_rounding,
            **({"weight_rounding_measured": rounding_measured} if rounding_measured else {}),
            "unset": [k for k, v in (("scheme", spec.scheme), ("granularity", spec.granularity),
                                     ("method", spec.calibration.method),
                                     ("weight_rounding", spec.weight_rounding),
                                     ("cross_layer_equalization", spec.cross_layer_equalization))
                      if v is None],
            "graphs": {q.name: _graph_summary(q) for q in workflow.qgraphs().values()},
            "cross_layer_equalization": workflow.options.equalize,
            **({"equalization": workflow.equalization()} if workflow.options.equalize else {}),
            **({"equalization_measured": equalization_measured}
               if equalization_measured else {}),
            "files": files, "crosscheck": {g: {k: v for k, v in c.items() if k != "worst_layers"}
                                           for g, c in crosscheck.items()},
            "worst_tensors": [{k: v for k, v in row.items() if k != "histogram"}
                              for row in per_layer[:5]], "overrides": overrides,
            "int8_verdict": {"passed": verdict.passed, "failures": verdict.failures[:8]},
            **({"search": _search_summary(search)} if search is not None else {})},
        "accuracy": {"outputs": outputs, "data": "verify" if ctx.recipe.verify.data else "calibration",
                     "samples": len(compare),
                     **({"selected": judge.selected} if judge.selected else {})},
    }


MAX_CONFIRMATIONS = 6
SPAN_DEMANDED = 0.5   # where a channel died, the search keeps every channel this lively


def measured_weight_rounding(workflow: Workflow, judge: SampleJudge, compare: list, nearest,
                             searched: bool = True):
    """Where the recipe leaves ``weight_rounding`` unset and int8 misses verify's thresholds:
    both roundings judged on the verify samples as verify judges, at the widest integer
    precision the precision search can then use (int16 on every tensor on chips with int16
    when the search will run and may choose int16, ``searched``; else int8, what is
    deployed), and GPTQ kept only where it scores better there (passes, or a higher cosine
    margin). At int8 alone the activations' rounding can hide what the weights' allows:
    MediaPipe's face detector scores lower with GPTQ in int8, yet only GPTQ's weights let
    int16 activations pass. Without the search nothing deploys int16, so judging there chose
    GPTQ for BlazePose's landmark model, which then deployed worse in int8 (pose flag 0.994 →
    0.84, worst output 0.614 → 0.584). Returns the int8 verdict kept and what was measured."""
    wide = workflow.options.chip_int16 and searched

    def int8_verdict():  # the integer reference's values are cached per quantization
        return judge(workflow.deployed_values(compare, judge.kept))

    def ceiling():
        if not wide:
            return int8_verdict()
        return judge(workflow.widest_integer_values(compare, judge.kept))

    nearest_ceiling = ceiling() if wide else nearest
    workflow.use_weight_rounding("gptq")
    gptq_ceiling = ceiling()
    measured = {"judged_at": "int16 everywhere" if wide else "int8",
                "nearest": round(nearest_ceiling.margin(), 6),
                "gptq": round(gptq_ceiling.margin(), 6)}
    if (gptq_ceiling.passed, gptq_ceiling.margin()) > (nearest_ceiling.passed,
                                                       nearest_ceiling.margin()):
        return int8_verdict(), measured  # GPTQ's int8 run only where GPTQ is kept
    workflow.use_weight_rounding("nearest")
    return nearest, measured


def measured_equalization(workflow: Workflow, judge: SampleJudge, compare: list, plain,
                          searched: bool, calibrate):
    """Where the recipe leaves ``cross_layer_equalization`` unset and int8 misses verify's
    thresholds: the NPU graphs equalised (`quant.equalize`: exact in float, proved on each
    graph), calibrated again (``calibrate(workflow)``) and judged as verify judges, in int8
    and at the widest integer precision the search can then use (as `measured_weight_rounding`
    judges); kept only where neither figure is lower and one is higher, so a model it does not
    help keeps what it had. A model with no pair to equalise costs one lowering. Returns the
    workflow and int8 verdict kept, and what was measured."""
    try:
        other = Workflow(workflow.pipeline, replace(workflow.options, equalize=True),
                         workflow.progress)
    except EqualizationNotExact as exc:
        return workflow, plain, {"kept": False, "not_exact": str(exc)}
    pairs = sum(len(s.fg.equalization.pairs) for s in other.states)
    measured = {"pairs": pairs, "folded_batch_norms": sum(
        len(s.fg.equalization.folded) for s in other.states)}
    if not pairs:
        return workflow, plain, {**measured, "kept": False}
    calibrate(other)
    other.quantize()
    wide = workflow.options.chip_int16 and searched

    def figures(w: Workflow, int8):
        ceiling = judge(w.widest_integer_values(compare, judge.kept)) if wide else int8
        return int8, ceiling

    before = figures(workflow, plain)
    after = figures(other, judge(other.deployed_values(compare, judge.kept)))
    gains = [a.margin() - b.margin() for a, b in zip(after, before)]
    kept = min(gains) >= 0.0 and max(gains) > 0.0
    measured.update({"judged_at": ["int8", "int16 everywhere" if wide else "int8"],
                     "without": [round(v.margin(), 6) for v in before],
                     "with": [round(v.margin(), 6) for v in after], "kept": kept})
    return (other, after[0], measured) if kept else (workflow, plain, measured)


def dead_channels(verdict) -> list[str]:
    return [line for line in verdict.failures if "dead channel" in line]


def lost_where_kept(reference, fake_quant) -> bool:
    """Whether the integer reference has a dead channel the fake-quant judgement of the same
    choice does not show (the search, judging by fake quantization, cannot see that loss)."""
    return bool(dead_channels(reference)) and not dead_channels(fake_quant)


def precision_search(ctx, workflow: Workflow, samples: list, judge: "SampleJudge", plain) -> dict:
    """Search, adopt the choice, confirm it on the integer reference; where the reference
    misses what fake quantization passed, search again demanding the cosine margin they
    differ by (twice over), within the time budget."""
    chip, spec = ctx.chip, ctx.recipe.quantization
    on_dask = _search_on_dask(ctx, samples)
    # an open-ended counter (the phases' budgets bound it, the choice decides where it stops)
    ticks = ctx.progress(itertools.count(1), description="precision search, choices scored")
    search = PrecisionSearch(workflow, samples, judge, judge.kept, search_spec(spec.auto, chip),
                             chip_int16=bool(chip and chip.int16),
                             float_fallback=bool(chip is None or chip.float_fallback),
                             chip=chip,
                             **({"float_macs_per_second": float_macs_per_second(chip),
                                 "float_on_npu": chip.float_macs_per_cycle_per_lane is not None}
                                if chip else {}),
                             choose_methods=spec.calibration.method is None,
                             choose_scheme=spec.scheme is None,
                             on_score=lambda count: next(ticks),
                             **({"fake_quant": on_dask.fake_quant} if on_dask else {}))
    try:
        return _searched(ctx, workflow, samples, judge, plain, search,
                         on_dask.deployed_values if on_dask else Workflow.deployed_values)
    finally:
        ticks.close()  # ends the bar


def _searched(ctx, workflow: Workflow, samples: list, judge: SampleJudge, plain,
              search: PrecisionSearch, deployed_values) -> dict:
    """`precision_search` once its search is set up; ``deployed_values(workflow, samples,
    kept)`` runs the integer reference that confirms a choice (here or on Dask)."""
    int8 = search.score({}, "int8 everywhere")
    margin = max(0.0, 1.5 * (int8.margin - plain.margin()))
    # a span above verify's "not dead" only where the reference lost a channel fake
    # quantization kept: where both lose it, the search sees it dead already, and demanding
    # half of every channel's span from the start put nearly every tensor in int16 (chars2vec:
    # 371 of 389 for 5 channels; the ISBN detector 239 of 246 for a 0.0054 miss)
    span = SPAN_DEMANDED if lost_where_kept(plain, int8) else 0.0
    confirmations = [{"choice": "int8 everywhere", "reference_passed": plain.passed,
                      "reference_margin": round(plain.margin(), 6)}]
    # int8 as the recipe calibrates it failed on the integer reference: refuted like any choice
    confirmed: dict[tuple, object] = {((), *search.recipe_choice): plain}
    adopted = None
    for _ in range(MAX_CONFIRMATIONS):
        refuted = frozenset(k for k, v in confirmed.items() if not v.passed)
        result = search.run(margin, span, refuted)
        key = (tuple(sorted(result.chosen.items())), result.method, result.tensor_methods,
               result.scheme)
        if key not in confirmed:
            workflow.adopt(result.overrides(), result.method, result.tensor_methods, result.scheme)
            adopted = key
            confirmed[key] = judge(deployed_values(workflow, samples, judge.kept))
            search.charge_confirmation(len(samples))
            confirmations.append({"choice": f"{len(result.chosen)} tensor(s)",
                                  "tensors": dict(sorted(result.chosen.items())),
                                  "calibration": result.method, "scheme": result.scheme,
                                  "fake_quant_margin": round(result.after, 6),
                                  "demanded": {"margin": round(search.margin, 6), "span": span},
                                  "reference_passed": confirmed[key].passed,
                                  "reference_margin": round(confirmed[key].margin(), 6),
                                  "failures": confirmed[key].failures[:4]})
        verdict = confirmed[key]
        if verdict.passed or not result.reached or search.clock() > search.deadline:
            break
        if dead_channels(verdict):  # fake quantization kept a channel the reference lost
            span = min(1.0, max(SPAN_DEMANDED, span + 0.25))
        if len(verdict.failures) > len(dead_channels(verdict)):
            margin = max(2.0 * margin, 1.5 * (result.after - verdict.margin()), 1e-4)
    if adopted != key:
        workflow.adopt(result.overrides(), result.method, result.tensor_methods, result.scheme)
    note = result.note
    if not verdict.passed and "int16" in search.levels:
        bound = weights_bound(search, judge, samples)
        note = "; ".join(n for n in (note, bound) if n)
    slower = search.slower_than_the_cpu_alone(result.chosen) if verdict.passed else ""
    if slower:
        ctx.log.warning("quantize: %s", slower)
        note = "; ".join(n for n in (note, slower) if n)
    ctx.log.info("quantize: the precision search chose %d tensor(s) (%s), verify's thresholds "
                 "%s on the integer reference, %d choices scored in an estimated %.1f s of work",
                 len(result.chosen), ", ".join(sorted(set(result.chosen.values()))) or "none",
                 "hold" if verdict.passed else "still miss", result.evaluations, result.seconds)
    return {"passed": verdict.passed, "reached": result.reached,
            "demanded": {"margin": search.margin, "channel_span": span},
            "levels": search.levels, "candidates": len(search.candidates),
            "chosen": [{"tensor": t, "precision": p, **result.why.get(t, {})}
                       for t, p in sorted(result.chosen.items())],
            "before": {"fake_quant_margin": round(result.before, 6)},
            "after": {"fake_quant_margin": round(result.after, 6),
                      "reference_margin": round(verdict.margin(), 6),
                      "estimated_slowdown": round(search.slowdown(result.chosen), 3),
                      "failures": verdict.failures,
                      "outputs": {name: {"cosine": m["cosine"],
                                         "min_sample_cosine": m["min_sample_cosine"]}
                                  for name, m in verdict.outputs.items()}},
            "calibration": {"scheme": result.scheme, "method": result.method,
                            "per_tensor": dict(result.tensor_methods),
                            "measured": result.method_scores},
            "evaluations": result.evaluations,
            "note": note, "what_would_reach": result.best_reachable,
            "ranking": result.ranking, "confirmations": confirmations, "steps": result.steps}


def weights_bound(search: PrecisionSearch, judge: SampleJudge, samples: list) -> str:
    """Where the search found nothing that passes: every activation in float and only the
    weights in int8 (the quantized constants that are candidates in float too), judged as
    verify judges; when that misses too, the note says what bounds the model, each claim
    measured ("" otherwise): int8 weights, where every candidate tensor in float (its layers'
    weights too) passes; else something no choice of the search reaches (the quantized
    constants no choice widens: those lowering made, which no override can name).
    BlazePose's landmark model: its segmentation logits reach 0.905 on the worst sample so,
    0.896 with int16 activations everywhere. BirdNET V2.4 with its spectra on the CPU: 4 of 6
    top-1 with every activation in float, and 4 of 6 with every candidate in float too: its
    Hann window, a constant, was the bound (constants were no candidates then)."""
    from npubuild.quant import fakequant

    feeds = {i: {**fakequant.params_feed(search.pipeline.tensors(i), {},
                                         search.pipeline.layers(i), wide=search.pipeline.wide(i)),
                 **_candidate_constants_in_float(search, i)}
             for i in search.states}
    verdict = judge(search.pipeline.run(samples, feeds, judge.kept))
    if verdict.passed:
        return ""
    if verdict.failed:
        name, m, _ = min(verdict.failed, key=lambda f: min(
            v for v in (f[1]["cosine"], f[1].get("min_sample_cosine"), 1.0) if v is not None))
        worst = m.get("min_sample_cosine")
        figure = (f"output {name!r} at cosine {m['cosine']:.4f}"
                  + (f", {worst:.4f} on its worst sample" if worst is not None else ""))
    else:
        figure = verdict.failures[0]
    floats = search.score({t: "float" for t in search.candidates}, "what float would reach")
    if not floats.passed:
        return (f"with every activation in float and only the weights in int8 it still misses "
                f"({figure}), and with every candidate tensor in float, its layers' weights "
                f"too, it misses as well (cosine margin {floats.margin:+.4f}): no precision "
                f"the search chooses reaches verify's thresholds{_fixed_constants(search)}")
    return (f"int8 weights bound this model: with every activation in float and only the "
            f"weights in int8 it still misses ({figure}), so int16 activations cannot reach "
            f"verify's thresholds; {_finer_weights(search, floats)}")


def _candidate_constants_in_float(search: PrecisionSearch, index: int) -> dict:
    """Graph ``index``'s quantized constants that are candidates, as their float values (the
    fake-quant model's ``<t>::c`` inputs): a constant a choice can widen is not a weight."""
    import numpy as np

    from npubuild.quant import fakequant

    state = search.states[index]
    return {f"{t}{fakequant.CONSTANT_SUFFIX}": np.asarray(state.fg.constants[t], np.float32
                                                          ).reshape(np.shape(value))
            for t, value in state.qgraph.constants.items() if t in search.members}


def _fixed_constants(search: PrecisionSearch, shown: int = 3) -> str:
    """The quantized constants of the NPU graphs (operands such as a window or anchors, not a
    layer's weights) that are not candidates (no override can name them, or their int8
    integers hold them exactly), which stay integer whatever the search chooses, largest
    first."""
    found = sorted(((int(value.size), name) for state in search.states.values()
                    for name, value in state.qgraph.constants.items()
                    if name not in search.members), key=lambda c: (-c[0], c[1]))
    if not found:
        return ""
    names = ", ".join(f"{name} ({size} value{'s' * (size != 1)})" for size, name in found[:shown])
    more = f" and {len(found) - shown} more" if len(found) > shown else ""
    return f"; {len(found)} quantized constant(s) stay integer in every choice: {names}{more}"


def _finer_weights(search: PrecisionSearch, floats) -> str:
    """What int16 weights (W16A16 on every candidate tensor) reach, measured, where the chip
    has them, and what float on every candidate (``floats``, scored: it passes) reached."""
    float_text = (f"float layers pass (every candidate tensor in float: cosine margin "
                  f"{floats.margin:+.4f}; quantization.auto.max_slowdown bounds their cost)")
    if not any(search.pipeline.wide(i) for i in search.states):
        return f"{float_text}; this chip has no int16 weights"
    scored = search.score({t: WIDE_WEIGHTS for t in search.candidates},
                          f"what {WIDE_WEIGHTS} would reach")
    allow = ("" if WIDE_WEIGHTS in search.levels else
             f": allow them with quantization.auto.precision: {WIDE_WEIGHTS} (or unset)")
    return (f"int16 weights with int16 activations ({WIDE_WEIGHTS}) on every candidate tensor "
            f"{'pass' if scored.passed else 'still miss'} (cosine margin "
            f"{scored.margin:+.4f}){allow}; {float_text}")


def _search_summary(search: dict) -> dict:
    keep = ("passed", "reached", "levels", "candidates", "evaluations", "note",
            "before", "after", "what_would_reach", "calibration")
    return {**{k: search[k] for k in keep}, "chosen": search["chosen"],
            "file": "search.json"}


def input_hw(info) -> tuple[int, int] | None:
    shape = list(info.shape or [])
    if len(shape) != 4:
        return None
    return tuple(shape[2:]) if info.layout != "NHWC" else tuple(shape[1:3])


def _split_for_workers(ctx: StageContext, work: str):
    """The split artifacts Dask workers fetch by key: None without a scheduler, and (with a
    warning that ``work`` runs in this process) when no cache the workers reach has them."""
    if not ctx.scheduler:
        return None
    if "split" not in ctx.sources:
        ctx.log.warning("quantize: the split artifacts are not in a cache the workers can "
                        "reach; %s in this process", work)
        return None
    return ctx.sources["split"]


def _batch_mapper(ctx: StageContext, workflow: Workflow):
    """Calibration batches on Dask when the build has a scheduler, else in this process."""
    split = _split_for_workers(ctx, "calibrating")
    if split is None:
        return None
    from npubuild.quant.fanout import calibration_on_dask

    return calibration_on_dask(ctx.scheduler, split, workflow.options)


def _search_on_dask(ctx: StageContext, samples: list):
    """Where the search scores and confirms its choices: on the Dask workers (the samples in
    one batch per worker) when the build has a scheduler, else None: in this process."""
    split = _split_for_workers(ctx, "the precision search scores")
    if split is None:
        return None
    from npubuild.quant.fanout import SearchOnDask

    return SearchOnDask(ctx.scheduler, split, samples)


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
