"""Quantize every NPU submodel of a split pipeline: the library behind ``stages/quantize.py``.

    lower each NPU submodel → calibrate through the whole float pipeline → quantize →
    write qgraph / QDQ / calibration files → compare on the verify samples (every tensor vs
    float, integer reference vs ONNX Runtime on the QDQ model, pipeline outputs vs float) →
    measure what each override bought.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from pathlib import Path
from itertools import islice
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from npubuild import onnx_io
from npubuild.atomic import write_json
from npubuild.engine.hashing import sha256_array
from npubuild.errors import BuildError, UserError
from npubuild.quant import calibrate, calibrators, check, qdq, quantizer
from npubuild.quant.floatgraph import FloatGraph, Probe
from npubuild.quant.lower import lower
from npubuild.quant.pipeline import SplitPipeline, SubGraph
from npubuild.quant.qgraph import QGraph
from npubuild.quant.reference import quantize_inputs, run_reference
from npubuild.verify import judge

MAX_CROSSCHECK_SAMPLES = 4
# Samples per calibration batch. Fixed (not derived from the number of workers) so that the
# floating-point sums inside the statistics happen in the same order on any cluster.
CALIBRATION_BATCH = 8


@dataclass(frozen=True)
class OverrideSpec:
    """One ``quantization.overrides`` entry, as the library sees it."""

    nodes: tuple[str, ...] = ()
    tensors: tuple[str, ...] = ()
    precision: str = "float"

    def label(self) -> str:
        names = [*self.nodes, *self.tensors]
        return f"{self.precision}: {', '.join(names[:3])}{' …' if len(names) > 3 else ''}"


@dataclass
class Options:
    config: quantizer.QuantConfig
    overrides: tuple[OverrideSpec, ...] = ()
    chip_int16: bool = False
    equalize: bool = False   # cross-layer equalisation of conv pairs before calibration
    histograms: bool = False  # keep every tensor's histogram (methods chosen per tensor later)
    weight_grams: bool = False  # gather conv input Gram matrices (GPTQ weight rounding)
    grams_only: bool = False  # observe those matrices alone (the pass that gathers them late)


@dataclass
class GraphState:
    graph: SubGraph
    fg: FloatGraph
    probe: Probe
    observer: calibrate.Observer
    float_nodes: set[str] = field(default_factory=set)
    qgraph: QGraph | None = None
    records: dict = field(default_factory=dict)


Progress = Callable[..., Iterator]
BatchMapper = Callable[[Iterable[list]], Iterable[tuple[int, list[dict]]]]


def _no_progress(items, total=None, description=""):
    yield from items


def tensor_names(model) -> set[str]:
    """The tensors a tensor override may name in one submodel: its nodes' outputs, its inputs
    and its initializers (a constant operand the quantizer quantizes, a window or a
    BatchNorm's scale as a Mul constant: int16, or float with the layer that reads it on the
    CPU; a layer's weights are the layer's and no name moves them)."""
    return ({o for n in model.graph.node for o in n.output} | {i.name for i in model.graph.input}
            | {t.name for t in model.graph.initializer})


WIDE_WEIGHTS = "w16a16"
"""The precision of a tensor kept in int16 whose weighted readers carry int16 weights too."""


@dataclass(frozen=True)
class Resolved:
    """What overrides say for one submodel: float nodes and tensors, int16 tensors, the
    tensors whose weighted readers carry int16 weights (``w16a16``), the names matched."""

    float_nodes: set[str]
    float_tensors: set[str]
    int16: set[str]
    int16_weights: set[str]
    matched: list[str]


def resolve_overrides(overrides: Sequence[OverrideSpec], model) -> Resolved:
    """What ``overrides`` keep out of int8 in one submodel (`Resolved`)."""
    nodes = {n.name: n for n in model.graph.node}
    produced = tensor_names(model)
    initializers = {t.name for t in model.graph.initializer}
    out = Resolved(set(), set(), set(), set(), [])
    for ov in overrides:
        for name in ov.nodes:
            if name not in nodes:
                continue
            out.matched.append(name)
            if ov.precision == "float":
                out.float_nodes.add(name)
                continue
            # its activations: a node's int16 leaves its constant operands as they were
            touched = [t for t in (*nodes[name].output, *nodes[name].input)
                       if t and t not in initializers]
            out.int16.update(touched)
            if ov.precision == WIDE_WEIGHTS:
                out.int16_weights.update(t for t in nodes[name].input
                                         if t in produced and t not in initializers)
        for name in ov.tensors:
            if name in produced:
                out.matched.append(name)
                (out.float_tensors if ov.precision == "float" else out.int16).add(name)
                if ov.precision == WIDE_WEIGHTS:
                    out.int16_weights.add(name)
    return out


def _config_for(options: Options, overrides: Sequence[OverrideSpec], model
                ) -> tuple[quantizer.QuantConfig, set[str]]:
    resolved = resolve_overrides(overrides, model)
    config = replace(options.config, float_tensors=frozenset(resolved.float_tensors),
                     int16_tensors=frozenset(resolved.int16),
                     int16_weight_inputs=frozenset(resolved.int16_weights))
    return config, resolved.float_nodes


def _rounds_to_nearest(key: tuple) -> bool:
    """Whether the quantization ``Workflow._quantization_key`` names rounds its weights to
    nearest: what the conv inputs' Gram matrices (read by GPTQ alone) cannot change."""
    return key[1].weight_rounding != "gptq"


class Workflow:
    """One quantize run over a split pipeline: lowered NPU graphs, their observers, results."""

    def __init__(self, pipeline: SplitPipeline, options: Options, progress: Progress = _no_progress):
        self.pipeline, self.options, self.progress = pipeline, options, progress
        if any(o.precision in ("int16", WIDE_WEIGHTS) for o in options.overrides) and not options.chip_int16:
            raise UserError("the target chip has no int16 support, so an int16 or w16a16 override "
                            "cannot be honoured", field="quantization.overrides",
                            hint="use precision: float, or a chip with int16: true")
        self.states = [self._lowered(g) for g in pipeline.npu_graphs]
        self.base_overrides = options.overrides
        self._deployed: dict = {}
        self._by_rounding: dict[str, tuple] = {}  # weight rounding -> graphs, judged values
        # (graph, its config, its float nodes) -> (qgraph, records): a graph the overrides of
        # an adopted choice leave as an earlier quantization had it is not quantized again
        self._quantizations: dict[tuple, tuple] = {}
        # int16 everywhere's judged values, keyed as `_quantizations` per graph (with the
        # samples' count and the tensors kept): measured equalisation judges the workflow it
        # keeps there, and the weight-rounding choice then judged it again (nearest)
        self._widest: dict[tuple, dict] = {}
        # each float weight's integers rounded to nearest, per scales (`quantizer._nearest`):
        # the graphs kept per configuration above (the recipe's, each rounding's, int16
        # everywhere's, each choice confirmed) share them where a weight's scales stay
        self._weight_integers: dict = {}

    def _lowered(self, graph: SubGraph) -> GraphState:
        _, float_nodes = _config_for(self.options, self.options.overrides, graph.model)
        fg, probe = lower(graph.model, float_nodes=float_nodes, equalize=self.options.equalize)
        observer = calibrate.Observer(fg, probe, self.options.config.method, every_tensor=True,
                                      histograms=self.options.histograms,
                                      weight_grams=self.options.weight_grams,
                                      grams_only=self.options.grams_only)
        return GraphState(graph, fg, probe, observer, float_nodes)

    # ---- calibration and quantization ---------------------------------------------------

    def calibrate(self, samples: Iterable[Mapping[str, np.ndarray]], total: int | None = None,
                  map_batches: BatchMapper | None = None) -> int:
        """Observe the calibration samples through the float pipeline.

        Samples go in batches of ``CALIBRATION_BATCH`` whose statistics merge in order, in
        this process or, through ``map_batches`` (e.g. on Dask workers, which must return
        :meth:`observe_batch`'s result per batch, in order), elsewhere: the batches are the
        same either way, so the statistics are byte-identical however many workers ran."""
        fed = self.progress(samples, total=total, description="calibrating")
        batches = iter(lambda it=iter(fed): list(islice(it, CALIBRATION_BATCH)), [])
        observed = map_batches(batches) if map_batches else map(self.observe_batch, batches)
        count = 0
        for samples_in_batch, stats in observed:
            for state, graph_stats in zip(self.states, stats):
                state.observer.merge(graph_stats, samples_in_batch)
            count += samples_in_batch
        if count == 0:
            raise BuildError("no calibration sample was read", stage="quantize")
        self._quantizations.clear()  # quantized from other statistics
        self._widest.clear()
        return count

    def gather_weight_grams(self, samples: Iterable[Mapping[str, np.ndarray]],
                            total: int | None = None,
                            mapper: Callable[["Workflow"], BatchMapper | None] = lambda w: None
                            ) -> None:
        """The conv inputs' Gram matrices (GPTQ rounding) from a second pass over the
        calibration samples, for a build that needs them only once int8 has missed: the
        first pass's statistics stay as they are, so the pass observes the matrices' tensors
        alone (no histogram, range or channel figure of any tensor: PP-OCRv5 rec's pass
        spent about half its time on those). ``mapper`` gives the batch mapper for the
        options that now ask for the matrices alone (Dask workers build their graphs from
        them)."""
        if self.options.weight_grams:
            return
        self.options = replace(self.options, weight_grams=True, grams_only=True)
        observed = [state.observer for state in self.states]
        # the first pass's statistics stay, and only GPTQ reads the matrices: what was quantized
        # and judged with nearest rounding holds as it was
        quantized = {k: v for k, v in self._quantizations.items() if _rounds_to_nearest(k)}
        widest = {k: v for k, v in self._widest.items() if all(map(_rounds_to_nearest, k))}
        for state in self.states:
            state.observer = state.observer.empty_like(weight_grams=True, grams_only=True)
        try:
            self.calibrate(samples, total=total, map_batches=mapper(self))
            for state, first in zip(self.states, observed):
                for tensor, stats in state.observer.stats.items():
                    if stats.patch_grams:
                        first.stats[tensor].patch_grams = stats.patch_grams
            self._quantizations = quantized
            self._widest = widest
        finally:
            self.options = replace(self.options, grams_only=False)
            for state, first in zip(self.states, observed):
                state.observer = first

    def observe_batch(self, batch: Sequence[Mapping[str, np.ndarray]]
                      ) -> tuple[int, list[dict[str, calibrate.TensorStats]]]:
        """One batch's statistics per NPU graph (picklable: what a worker sends back)."""
        observers = [state.observer.empty_like() for state in self.states]
        for feeds in batch:
            values = self.pipeline.float_values(feeds)
            for state, observer in zip(self.states, observers):
                observer.update({t: values[t] for t in state.fg.inputs})
        return len(batch), [observer.stats for observer in observers]

    def quantize(self) -> None:
        """Quantize every NPU graph with the current options; a graph whose own configuration
        (its tensors' precisions and methods, the scheme, the rounding) and float nodes an
        earlier call already quantized with the same statistics gets that result back: the
        precision search's confirmations re-quantize only the graphs its choice changed. The
        integer reference's judged values are forgotten only where a graph changed: a search
        that keeps int8 adopts the recipe's own quantization again, and its judging and
        per-layer comparison then ran the reference over the verify samples a second time
        (CRAFT at 240x320: 6 passes of a VGG16 U-Net)."""
        changed = False
        for state in self.states:
            known = self._known_quantization(state, self.options.overrides)
            changed = changed or state.qgraph is not known[0] or state.records is not known[1]
            state.qgraph, state.records = known
        if changed:
            self._deployed = {}

    def _quantization_key(self, state: GraphState, overrides: Sequence[OverrideSpec]) -> tuple:
        config, float_nodes = _config_for(self.options, overrides, state.graph.model)
        return (state.graph.index, config, frozenset(float_nodes))

    def _known_quantization(self, state: GraphState, overrides: Sequence[OverrideSpec]):
        """``state``'s graph quantized with ``overrides`` (once per configuration)."""
        key = self._quantization_key(state, overrides)
        if key not in self._quantizations:
            quantized = self._quantized(state, overrides)
            check.check_quantized(quantized[0])
            self._quantizations[key] = quantized
        return self._quantizations[key]

    def use_weight_rounding(self, rounding: str) -> None:
        """Quantize with another weight rounding (`npubuild.quant.rounding`); going back to
        one used before restores its graphs and judged values instead of recomputing them."""
        current = self.options.config.weight_rounding
        self._by_rounding[current] = ([(s.qgraph, s.records) for s in self.states], self._deployed)
        self.options = replace(self.options, config=replace(self.options.config,
                                                            weight_rounding=rounding))
        if rounding not in self._by_rounding:
            self.quantize()
            return
        graphs, self._deployed = self._by_rounding[rounding]
        for state, (qgraph, records) in zip(self.states, graphs):
            state.qgraph, state.records = qgraph, records

    def _quantized(self, state: GraphState, overrides: Sequence[OverrideSpec]):
        config, float_nodes = _config_for(self.options, overrides, state.graph.model)
        fg = state.fg
        if float_nodes != state.float_nodes:  # a node override left out: lower again
            fg, _ = lower(state.graph.model, float_nodes=float_nodes, equalize=self.options.equalize)
        return quantizer.quantize_graph(  # a graph lowered again keeps its weights to itself
            fg, state.observer.stats, config, f"graph_{state.graph.index}",
            self._weight_integers if fg is state.fg else None)

    def equalization(self) -> dict[str, dict]:
        """Per NPU graph, how many conv pairs cross-layer equalisation scaled and skipped."""
        return {f"graph_{s.graph.index}": {"pairs": len(s.fg.equalization.pairs),
                                           "skipped": len(s.fg.equalization.skipped)}
                for s in self.states if s.fg.equalization is not None}

    def qgraphs(self) -> dict[int, QGraph]:
        return {s.graph.index: s.qgraph for s in self.states}

    # ---- files --------------------------------------------------------------------------

    def write(self, out: Path) -> dict[str, list[str]]:
        files: dict[str, list[str]] = {"qgraph": [], "qdq": []}
        calibration = {"scheme": self.options.config.scheme, "method": self.options.config.method,
                       "granularity": self.options.config.granularity, "graphs": {}}
        for state in self.states:
            name = f"graph_{state.graph.index}"
            json_path, _ = state.qgraph.save(out / f"{name}.qgraph.json")
            onnx_io.save_model(qdq.export_qdq(state.qgraph), out / f"{name}.qdq.onnx")
            files["qgraph"].append(json_path.name)
            files["qdq"].append(f"{name}.qdq.onnx")
            calibration["graphs"][name] = {
                "samples": state.observer.samples,
                "tensors": {t: r.as_dict() for t, r in state.records.items()},
                "inner_tensors": self._inner_ranges(state)}
            if state.fg.equalization is not None:
                calibration["graphs"][name]["equalization"] = state.fg.equalization.as_dict()
        write_json(out / "calibration.json", calibration)
        return files

    def _inner_ranges(self, state: GraphState) -> dict[str, dict]:
        """The calibrated range (its calibration method) of every tensor npubuild computes inside
        one of its integer layers and never quantizes (a conv's output before its folded bias
        Add or Relu): a vendor that quantizes such a tensor (TPU-MLIR's calibration table) gets
        npubuild's calibration for it too."""
        cfg = self.options.config
        options = calibrators.CalibrationOptions(cfg.percentile)
        out = {}
        for t, stats in state.observer.stats.items():
            if t in state.records or not stats.count:
                continue
            lo, hi = calibrators.calibrated_range(stats, cfg.method_of(t), cfg.scheme, options)
            out[t] = {"min": float(stats.min), "max": float(stats.max),
                      "range": [float(lo), float(hi)]}
        return out

    # ---- checks -------------------------------------------------------------------------

    def deployed_values(self, samples: Sequence[Mapping[str, np.ndarray]],
                        kept: Sequence[str]) -> list[dict[str, np.ndarray]]:
        """Per sample, the ``kept`` tensors of the pipeline with every NPU graph run by the
        integer reference (what the simulator computes bit for bit); computed once per
        quantization (``quantize`` forgets them) and reused for any of the tensors kept then
        (the stage judges ``verify``'s tensors, then compares the outputs among them: one run
        of the reference over the verify samples, where a key on the list's spelling ran it
        twice)."""
        wanted = frozenset(kept)
        known = self._deployed
        if not (known and known["samples"] == len(samples) and wanted <= known["kept"]):
            values, envs = self._run_deployed(self.qgraphs(), samples, kept)
            self._deployed = known = {"kept": wanted, "samples": len(samples), "values": values,
                                      "envs": envs}
        return [{t: v for t, v in got.items() if t in wanted} for got in known["values"]]

    def _run_deployed(self, qgraphs: Mapping[int, QGraph], samples, kept):
        """Per sample, the ``kept`` tensors of the integer pipeline, and (first
        ``MAX_CROSSCHECK_SAMPLES``) the integer tensors of each NPU graph `evaluate` can reuse:
        a graph no NPU graph feeds (any other gets other inputs than float's), with its inputs'
        digest. Each sample's other tensors are freed before the next: deepbrain's 3-D U-Net
        held every hand-over tensor and integer tensor of every sample (0.4 GB per sample)
        and ran out of memory at 9 GB."""
        seen: dict = {}
        runner = self.pipeline.quantized_runner(qgraphs, seen)
        wanted = set(kept)
        reusable = {g.index for g in self.pipeline.npu_graphs} - self.pipeline.downstream_of_npu()
        values, envs = [], []
        for k, feeds in enumerate(self.progress(samples, total=len(samples),
                                                description="judging")):
            seen.clear()
            got = runner.run(dict(feeds), keep_intermediates=True)
            values.append({k: v for k, v in got.items() if k in wanted})
            del got
            envs.append({i: (_digest(inputs), env) for i, (inputs, env) in seen.items()
                         if i in reusable} if k < MAX_CROSSCHECK_SAMPLES else {})
        seen.clear()
        return values, envs

    def widest_integer_values(self, samples: Sequence[Mapping[str, np.ndarray]],
                              kept: Sequence[str]) -> list[dict[str, np.ndarray]]:
        """``deployed_values`` with every quantized tensor in int16 (the widest integer
        precision, on chips with int16): what the precision search can reach without float."""
        overrides = {}
        for state in self.states:
            wide = sorted(t for t, info in state.qgraph.tensors.items()
                          if not info.is_float and t not in state.qgraph.constants)
            overrides[state.graph.index] = [*self.options.overrides,
                                            OverrideSpec((), tuple(wide), "int16")]
        key = tuple(self._quantization_key(s, overrides[s.graph.index]) for s in self.states)
        wanted = frozenset(kept)
        known = self._widest.get(key)
        if not (known and known["samples"] == len(samples) and wanted <= known["kept"]):
            qgraphs = {s.graph.index: self._quantized(s, overrides[s.graph.index])[0]
                       for s in self.states}
            known = {"kept": wanted, "samples": len(samples),
                     "values": self._run_deployed(qgraphs, samples, kept)[0]}
            self._widest[key] = known
        return [{t: v for t, v in got.items() if t in wanted} for got in known["values"]]

    def _reference_env(self, k: int, state: GraphState, inputs: Mapping[str, np.ndarray]) -> dict:
        """Graph ``state``'s integer tensors on float ``inputs``: the deployed run's own when
        that graph got the very same inputs there (no NPU graph upstream of it), else run."""
        seen = self._deployed.get("envs") or []
        deployed = seen[k].get(state.graph.index) if k < len(seen) else None
        if deployed is not None and deployed[0] == _digest(inputs):
            return deployed[1]
        return run_reference(state.qgraph, quantize_inputs(state.qgraph, inputs))

    def evaluate(self, samples: Sequence[Mapping[str, np.ndarray]], kept: Sequence[str] = (),
                 per_layer_samples: int | None = None) -> "Evaluation":
        """Every NPU tensor against float and the integer reference against ONNX Runtime on
        the first ``per_layer_samples`` samples; the pipeline's outputs on all of them."""
        ev = Evaluation({s.graph.index: check.TensorComparison(s.qgraph) for s in self.states},
                        {s.graph.index: check.CrossChecker(s.qgraph) for s in self.states})
        deployed = self.deployed_values(samples, [*self.pipeline.outputs, *kept])
        first = list(samples)[:per_layer_samples]
        npu_inputs = {t for s in self.states for t in s.fg.inputs}
        for k, feeds in enumerate(self.progress(first, total=len(first),
                                                description="per-layer comparison")):
            values = {t: v for t, v in self.pipeline.float_values(feeds).items() if t in npu_inputs}
            for state in self.states:
                inputs = {t: values[t] for t in state.fg.inputs}
                float_values = state.probe.run(inputs)
                float_values.update(inputs)
                env = self._reference_env(k, state, inputs)
                ev.tensors[state.graph.index].add(float_values, env)
                if k < MAX_CROSSCHECK_SAMPLES:
                    ev.crosscheck[state.graph.index].add(env)
                del float_values, env  # one graph's tensors at a time
            del values
        for feeds, got in zip(samples, deployed):
            ev.add_outputs(self.pipeline.float_values(feeds), got, self.pipeline.outputs)
        return ev

    def adopt(self, overrides: Sequence[OverrideSpec], method: str | None = None,
              tensor_methods: tuple[tuple[str, str], ...] = (), scheme: str | None = None) -> None:
        """Quantize again with ``overrides`` after the recipe's own, calibration ``method``
        (per tensor where ``tensor_methods`` says) and ``scheme``: the search's choice."""
        config = replace(self.options.config, method=method or self.options.config.method,
                         tensor_methods=tuple(tensor_methods),
                         scheme=scheme or self.options.config.scheme)
        self.options = replace(self.options, config=config,
                               overrides=(*self.base_overrides, *overrides))
        self.quantize()

    def run_quantized_pipeline(self, feeds, qgraphs: Mapping[int, QGraph]) -> dict[str, np.ndarray]:
        return self.pipeline.quantized_outputs(feeds, qgraphs)

    def override_gains(self, samples: Sequence[Mapping[str, np.ndarray]],
                       with_all: Mapping[str, float]) -> list[dict]:
        """Output cosine with every override against without each of the recipe's in turn."""
        rows = []
        matched = {ov: [] for ov in self.base_overrides}
        for state in self.states:
            for ov in self.base_overrides:
                matched[ov] += resolve_overrides([ov], state.graph.model).matched
        for ov in self.base_overrides:
            rest = [o for o in self.options.overrides if o is not ov]
            qgraphs = {s.graph.index: self._quantized(s, rest)[0] for s in self.states}
            without = Evaluation({}, {})
            for feeds in samples:
                without.add_outputs(self.pipeline.float_values(feeds),
                                    self.run_quantized_pipeline(feeds, qgraphs), self.pipeline.outputs)
            cos_with = float(np.mean([v["cosine"] for v in with_all.values()]))
            cos_without = float(np.mean([v["cosine"] for v in without.outputs().values()]))
            rows.append({"override": ov.label(), "precision": ov.precision,
                         "matched": matched[ov], "unmatched": sorted(
                             (set(ov.nodes) | set(ov.tensors)) - set(matched[ov])),
                         "output_cosine_with": cos_with, "output_cosine_without": cos_without,
                         "cosine_gain": cos_with - cos_without})
        return rows


def _digest(values: Mapping[str, np.ndarray]) -> str:
    """Names, shapes, dtypes and bytes of ``values`` (each array by `sha256_array`, which
    hashes it in place): what tells the same inputs apart."""
    h = hashlib.sha256()
    for name in sorted(values):
        h.update(f"{name}|".encode())
        h.update(sha256_array(values[name]))
    return h.hexdigest()


@dataclass
class Evaluation:
    tensors: dict[int, check.TensorComparison]
    crosscheck: dict[int, check.CrossChecker]
    _outputs: dict[str, tuple[list, list]] = field(default_factory=dict)

    def add_outputs(self, reference: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
                    names: Sequence[str]) -> None:
        for name in names:
            refs, gots = self._outputs.setdefault(name, ([], []))
            refs.append(np.asarray(reference[name]))
            gots.append(np.asarray(actual[name]))

    def outputs(self) -> dict[str, dict]:
        """Each output judged as verify judges it (`npubuild.verify.judge`): cosine, SQNR...
        over all samples together, and the worst sample's cosine among the samples where one
        means something. A mean of per-sample cosines is fooled by a near-zero sample (a text
        map of an image without text scores 0 whatever the quantization)."""
        out = {}
        for name, (refs, gots) in self._outputs.items():
            m = judge.tensor_metrics(refs, gots, axis=None)
            out[name] = {"cosine": m["cosine"], "euclid": m["euclid"], "sqnr_db": m["sqnr_db"],
                         "max_abs": m["max_abs"], "min_sample_cosine": m["min_sample_cosine"],
                         "samples": len(refs)}
        return out

    def figure(self) -> float:
        """One number for the outputs, as verify's min_cosine reads them: the lowest of every
        output's all-sample and worst-sample cosine."""
        return float(min((min(v["cosine"], v["min_sample_cosine"] if v["min_sample_cosine"]
                               is not None else v["cosine"]) for v in self.outputs().values()),
                         default=1.0))

    HISTOGRAMS_KEPT = 12

    def per_layer(self) -> list[dict]:
        """Every NPU tensor, worst cosine first; the worst keep their calibration histogram."""
        rows = [dict(graph=f"graph_{i}", **row) for i, cmp in self.tensors.items() for row in cmp.rows()]
        rows = sorted(rows, key=lambda r: r["cosine"])
        for row in rows[self.HISTOGRAMS_KEPT:]:
            row.pop("histogram", None)
        return rows

    def crosscheck_summary(self) -> dict:
        return {f"graph_{i}": c.result.summary() for i, c in self.crosscheck.items()}

    def crosscheck_ok(self) -> bool:
        return all(c.result.ok for c in self.crosscheck.values())
