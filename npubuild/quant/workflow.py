"""Quantize every NPU submodel of a split pipeline: the library behind ``stages/quantize.py``.

    lower each NPU submodel → calibrate through the whole float pipeline → quantize →
    write qgraph / QDQ / calibration files → compare on the verify samples (every tensor vs
    float, integer reference vs ONNX Runtime on the QDQ model, pipeline outputs vs float) →
    measure what each override bought.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable, Iterable, Iterator, Mapping, Sequence

import numpy as np

from npubuild import metrics, onnx_io
from npubuild.atomic import write_json
from npubuild.errors import BuildError, UserError
from npubuild.quant import calibrate, check, qdq, quantizer
from npubuild.quant.floatgraph import FloatGraph, Probe
from npubuild.quant.lower import lower
from npubuild.quant.pipeline import SplitPipeline, SubGraph
from npubuild.quant.qgraph import QGraph
from npubuild.quant.reference import quantize_inputs, run_reference

MAX_CROSSCHECK_SAMPLES = 4


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
        fg, probe = lower(graph.model, float_nodes=float_nodes)
        method = self.options.config.method
        return GraphState(graph, fg, probe, calibrate.Observer(fg, probe, method, every_tensor=True),
                          float_nodes)

    # ---- calibration and quantization ---------------------------------------------------

    def calibrate(self, samples: Iterable[Mapping[str, np.ndarray]], total: int | None = None) -> int:
        count = 0
        for feeds in self.progress(samples, total=total, description="calibrating"):
            values = self.pipeline.float_values(feeds)
            for state in self.states:
                state.observer.update({t: values[t] for t in state.fg.inputs})
            count += 1
        if count == 0:
            raise BuildError("no calibration sample was read", stage="quantize")
        return count

    def quantize(self) -> None:
        for state in self.states:
            state.qgraph, state.records = self._quantized(state, self.options.overrides)
            check.check_quantized(state.qgraph)

    def _quantized(self, state: GraphState, overrides: Sequence[OverrideSpec]):
        config, float_nodes = _config_for(self.options, overrides, state.graph.model)
        fg = state.fg
        if float_nodes != state.float_nodes:  # a node override left out: lower again
            fg, _ = lower(state.graph.model, float_nodes=float_nodes)
        return quantizer.quantize_graph(fg, state.observer.stats, config, f"graph_{state.graph.index}")

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
                "tensors": {t: r.as_dict() for t, r in state.records.items()}}
        write_json(out / "calibration.json", calibration)
        return files

    # ---- checks -------------------------------------------------------------------------

    def evaluate(self, samples: Sequence[Mapping[str, np.ndarray]]) -> "Evaluation":
        ev = Evaluation({s.graph.index: check.TensorComparison(s.qgraph) for s in self.states},
                        {s.graph.index: check.CrossChecker(s.qgraph) for s in self.states})
        for k, feeds in enumerate(self.progress(samples, total=len(samples), description="verifying")):
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


@dataclass
class Evaluation:
    tensors: dict[int, check.TensorComparison]
    crosscheck: dict[int, check.CrossChecker]
    _outputs: dict[str, list[metrics.Similarity]] = field(default_factory=dict)

    def add_outputs(self, reference: Mapping[str, np.ndarray], actual: Mapping[str, np.ndarray],
                    names: Sequence[str]) -> None:
        for name in names:
            self._outputs.setdefault(name, []).append(metrics.similarity(reference[name], actual[name]))

    def outputs(self) -> dict[str, dict]:
        """Mean of each metric over the samples (max_abs: the maximum)."""
        out = {}
        for name, sims in self._outputs.items():
            sqnr = [s.sqnr_db for s in sims if np.isfinite(s.sqnr_db)]
            out[name] = {"cosine": float(np.mean([s.cosine for s in sims])),
                         "euclid": float(np.mean([s.euclid for s in sims])),
                         "sqnr_db": float(np.mean(sqnr)) if sqnr else None,
                         "max_abs": float(max(s.max_abs for s in sims)), "samples": len(sims)}
        return out

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
