"""Quantize every NPU submodel of a split pipeline: the library behind ``stages/quantize.py``.

    lower each NPU submodel → calibrate through the whole float pipeline → quantize →
    write qgraph / QDQ / calibration files → compare on the verify samples (every tensor vs
    float, integer reference vs ONNX Runtime on the QDQ model, pipeline outputs vs float) →
    measure what each override bought.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from itertools import islice
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from npubuild import onnx_io
from npubuild.atomic import write_json
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


def resolve_overrides(overrides: Sequence[OverrideSpec], model
                      ) -> tuple[set[str], set[str], set[str], list[str]]:
    """float nodes, float tensors, int16 tensors of one submodel, and the names it matched."""
    nodes = {n.name: n for n in model.graph.node}
    float_nodes, float_tensors, int16 = set(), set(), set()
    matched = []
    for ov in overrides:
        for name in ov.nodes:
            if name not in nodes:
                continue
            matched.append(name)
            if ov.precision == "float":
                float_nodes.add(name)
            else:
                int16.update(o for o in nodes[name].output if o)
                int16.update(i for i in nodes[name].input if i)
        for name in ov.tensors:
            produced = any(name in n.output for n in nodes.values()) or name in {
                i.name for i in model.graph.input}
            if produced:
                matched.append(name)
                (float_tensors if ov.precision == "float" else int16).add(name)
    return float_nodes, float_tensors, int16, matched


def _config_for(options: Options, overrides: Sequence[OverrideSpec], model
                ) -> tuple[quantizer.QuantConfig, set[str]]:
    float_nodes, float_tensors, int16, _ = resolve_overrides(overrides, model)
    config = replace(options.config, float_tensors=frozenset(float_tensors),
                     int16_tensors=frozenset(int16))
    return config, float_nodes


class Workflow:
    """One quantize run over a split pipeline: lowered NPU graphs, their observers, results."""

    def __init__(self, pipeline: SplitPipeline, options: Options, progress: Progress = _no_progress):
        self.pipeline, self.options, self.progress = pipeline, options, progress
        if any(o.precision == "int16" for o in options.overrides) and not options.chip_int16:
            raise UserError("the target chip has no int16 support, so an int16 override cannot be "
                            "honoured", field="quantization.overrides",
                            hint="use precision: float, or a chip with int16: true")
        self.states = [self._lowered(g) for g in pipeline.npu_graphs]

    def _lowered(self, graph: SubGraph) -> GraphState:
        _, float_nodes = _config_for(self.options, self.options.overrides, graph.model)
        fg, probe = lower(graph.model, float_nodes=float_nodes, equalize=self.options.equalize)
        method = self.options.config.method
        return GraphState(graph, fg, probe, calibrate.Observer(fg, probe, method, every_tensor=True),
                          float_nodes)

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
        return count

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
        for state in self.states:
            state.qgraph, state.records = self._quantized(state, self.options.overrides)
            check.check_quantized(state.qgraph)

    def _quantized(self, state: GraphState, overrides: Sequence[OverrideSpec]):
        config, float_nodes = _config_for(self.options, overrides, state.graph.model)
        fg = state.fg
        if float_nodes != state.float_nodes:  # a node override left out: lower again
            fg, _ = lower(state.graph.model, float_nodes=float_nodes, equalize=self.options.equalize)
        return quantizer.quantize_graph(fg, state.observer.stats, config, f"graph_{state.graph.index}")

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
        """The calibrated range (the recipe's method) of every tensor npubuild computes inside
        one of its integer layers and never quantizes (a conv's output before its folded bias
        Add or Relu): a vendor that quantizes such a tensor (TPU-MLIR's calibration table) gets
        npubuild's calibration for it too."""
        cfg = self.options.config
        options = calibrators.CalibrationOptions(cfg.percentile)
        out = {}
        for t, stats in state.observer.stats.items():
            if t in state.records or not stats.count:
                continue
            lo, hi = calibrators.calibrated_range(stats, cfg.method, cfg.scheme, options)
            out[t] = {"min": float(stats.min), "max": float(stats.max),
                      "range": [float(lo), float(hi)]}
        return out

    # ---- checks -------------------------------------------------------------------------

    def evaluate(self, samples: Sequence[Mapping[str, np.ndarray]]) -> "Evaluation":
        ev = Evaluation({s.graph.index: check.TensorComparison(s.qgraph) for s in self.states},
                        {s.graph.index: check.CrossChecker(s.qgraph) for s in self.states})
        for k, feeds in enumerate(self.progress(samples, total=len(samples),
                                                description="per-layer comparison")):
            values = self.pipeline.float_values(feeds)
            for state in self.states:
                inputs = {t: values[t] for t in state.fg.inputs}
                float_values = state.probe.run(inputs)
                float_values.update(inputs)
                env = run_reference(state.qgraph, quantize_inputs(state.qgraph, inputs))
                ev.tensors[state.graph.index].add(float_values, env)
                if k < MAX_CROSSCHECK_SAMPLES:
                    ev.crosscheck[state.graph.index].add(env)
            ev.add_outputs(values, self.run_quantized_pipeline(feeds, self.qgraphs()),
                           self.pipeline.outputs)
        return ev

    def auto_precision(self, samples: Sequence[Mapping[str, np.ndarray]],
                       target: AutoTarget) -> AutoResult:
        """Search the fewest overrides reaching ``target`` (``AutoSearch``), adopt them and
        quantize again."""
        if target.precision == "int16" and not self.options.chip_int16:
            raise UserError("the target chip has no int16 support, so auto cannot keep tensors "
                            "in int16", field="quantization.auto.precision",
                            hint="use precision: float, or a chip with int16: true")
        search = AutoSearch(self, samples)
        evaluation = Evaluation({s.graph.index: check.TensorComparison(s.qgraph) for s in self.states}, {})
        for feeds, values in zip(search.samples, search.references):
            for state in self.states:
                inputs = {t: values[t] for t in state.fg.inputs}
                float_values = {**state.probe.run(inputs), **inputs}
                env = run_reference(state.qgraph, quantize_inputs(state.qgraph, inputs))
                evaluation.tensors[state.graph.index].add(float_values, env)
        result = search.run(target, self.options.overrides, evaluation)
        self.options = replace(self.options, overrides=(*self.options.overrides, *result.chosen))
        self.quantize()
        return result

    def run_quantized_pipeline(self, feeds, qgraphs: Mapping[int, QGraph]) -> dict[str, np.ndarray]:
        return self.pipeline.quantized_outputs(feeds, qgraphs)

    def override_gains(self, samples: Sequence[Mapping[str, np.ndarray]],
                       with_all: Mapping[str, float]) -> list[dict]:
        """Output cosine with every override against without each one in turn."""
        rows = []
        matched = {ov: [] for ov in self.options.overrides}
        for state in self.states:
            for ov in self.options.overrides:
                matched[ov] += resolve_overrides([ov], state.graph.model)[3]
        for ov in self.options.overrides:
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


@dataclass(frozen=True)
class AutoTarget:
    """``quantization.auto`` as the library sees it (None: no limit)."""

    min_cosine: float
    precision: str = "int16"
    max_overrides: int | None = None
    candidates: int | None = None


@dataclass
class AutoResult:
    target: AutoTarget
    before: float
    after: float
    chosen: list[OverrideSpec]
    tried: list[dict]

    @property
    def reached(self) -> bool:
        return self.after >= self.target.min_cosine

    def as_dict(self) -> dict:
        return {"min_cosine": self.target.min_cosine, "precision": self.target.precision,
                "output_cosine_before": self.before, "output_cosine_after": self.after,
                "reached": self.reached,
                "overrides": [{"tensors": list(o.tensors), "precision": o.precision}
                              for o in self.chosen],
                "tried": self.tried}


class AutoSearch:
    """Mixed-precision search (as TPU-MLIR's qtable search): rank every NPU layer's output by
    the cosine it loses over its inputs, find the shortest prefix of that ranking whose
    overrides reach the target (a binary search, as if the prefixes' output cosine grew with
    their length: it mostly does), then drop the overrides of the prefix the target does not
    need, in blocks from the least sensitive (``_drop_unneeded``). Each step quantizes the
    graphs again and runs the pipeline on the compare samples, so a search costs about
    log2(candidates) + DROP_EVALUATIONS evaluations, not candidates × chosen. A deterministic
    function of the calibration statistics and the compare samples, so the stage's cache key
    covers it."""

    def __init__(self, workflow: "Workflow", samples: Sequence[Mapping[str, np.ndarray]]):
        self.workflow = workflow
        self.samples = list(samples)
        self.references = [workflow.pipeline.float_values(f) for f in workflow.progress(
            self.samples, total=len(self.samples), description="precision search: float references")]
        self.tried: list[dict] = []

    def output_cosine(self, overrides: Sequence[OverrideSpec]) -> float:
        """The cosine verify judges: per output, over all compare samples together and on
        the worst (non-quiet) sample; the lowest of these over the outputs."""
        wf = self.workflow
        qgraphs = {s.graph.index: wf._quantized(s, overrides)[0] for s in wf.states}
        ev = Evaluation({}, {})
        label = (f"precision search: try {len(self.tried) + 1} ({len(overrides)} overrides"
                 + (f", best so far {max(t['output_cosine'] for t in self.tried):.4f})"
                    if self.tried else ")"))
        for feeds, ref in wf.progress(list(zip(self.samples, self.references)),
                                      total=len(self.samples), description=label):
            ev.add_outputs(ref, wf.run_quantized_pipeline(feeds, qgraphs), wf.pipeline.outputs)
        return ev.figure()

    def ranked(self, evaluation: "Evaluation") -> list[str]:
        """NPU tensors that a layer rounds, largest cosine drop over the layer first."""
        rows = []
        for state in self.workflow.states:
            cos = {r["tensor"]: r["cosine"] for r in evaluation.tensors[state.graph.index].rows()}
            for layer in state.qgraph.layers:
                if layer.device != "npu" or layer.kind not in ROUNDING_KINDS:
                    continue
                ins = [cos[t] for t in layer.inputs if t in cos]
                for t in layer.outputs:
                    if t in cos:
                        rows.append((-(min(ins, default=1.0) - cos[t]), t))
        return [t for _, t in sorted(rows)]

    def _cosine_of(self, base, tensors: Sequence[str], target: AutoTarget, step: str) -> float:
        cos = self.output_cosine([*base, *self._overrides(tensors, target)])
        self.tried.append({"step": step, "tensors": len(tensors), "output_cosine": cos})
        return cos

    @staticmethod
    def _overrides(tensors: Sequence[str], target: AutoTarget) -> list[OverrideSpec]:
        return [OverrideSpec(tensors=(t,), precision=target.precision) for t in tensors]

    def run(self, target: AutoTarget, base: Sequence[OverrideSpec],
            evaluation: "Evaluation") -> AutoResult:
        before = self.output_cosine(base)
        if before >= target.min_cosine:
            return AutoResult(target, before, before, [], self.tried)
        ranking = self.ranked(evaluation)[:target.candidates]
        limit = min(len(ranking), target.max_overrides or len(ranking))
        best = self._cosine_of(base, ranking[:limit], target, "prefix")
        if best < target.min_cosine:  # unreachable within the limit: keep what helps most
            if best <= before:
                return AutoResult(target, before, before, [], self.tried)
            return AutoResult(target, before, best, self._overrides(ranking[:limit], target),
                              self.tried)
        low, high, at_high = 0, limit, best  # cos(prefix low) < target <= cos(prefix high)
        while high - low > 1:
            mid = (low + high) // 2
            cos = self._cosine_of(base, ranking[:mid], target, "prefix")
            if cos >= target.min_cosine:
                high, at_high = mid, cos
            else:
                low = mid
        chosen, current = self._drop_unneeded(base, list(ranking[:high]), at_high, target)
        return AutoResult(target, before, current, self._overrides(chosen, target), self.tried)

    def _drop_unneeded(self, base, chosen: list[str], current: float,
                       target: AutoTarget) -> tuple[list[str], float]:
        """Drop the overrides of ``chosen`` the target does not need, least sensitive first,
        in blocks: a block that can go goes whole and the next block is twice as long; one
        that cannot is halved, down to a single tensor, which then stays. A prefix often
        holds a few tensors that matter and many that do not (PP-OCRv4 det: the 44th tensor
        of the ranking alone buys 0.011), so this keeps the few in about
        ``needed · log2(prefix)`` evaluations, capped at ``DROP_EVALUATIONS``."""
        order = list(reversed(chosen))
        start, block = 0, max(1, len(order) // 2)
        for _ in range(DROP_EVALUATIONS):
            if start >= len(order):
                break
            dropped = set(order[start:start + block])
            rest = [t for t in chosen if t not in dropped]
            cos = self._cosine_of(base, rest, target, "drop")
            if cos >= target.min_cosine:
                chosen, current = rest, cos
                start, block = start + len(dropped), block * 2
            elif block > 1:
                block //= 2
            else:
                start += 1
        return chosen, current


# The drop pass stops after this many evaluations however long the prefix: a search stays
# about log2(candidates) + DROP_EVALUATIONS evaluations of the whole pipeline.
DROP_EVALUATIONS = 24
ROUNDING_KINDS = {"conv", "add", "mul", "rescale", "concat", "avgpool", "resize", "lut", "softmax"}


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
