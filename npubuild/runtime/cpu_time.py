"""How long the float (CPU) part of a deployment takes on this machine, measured with ONNX Runtime.

The performance estimate adds it to the NPU's cycles: every CPU submodel of the split, and every
layer quantize kept in float inside an NPU graph (a quantization override), each run after the
NPU work it depends on (no overlap is assumed, as in a single-threaded deployment loop).

Measured, not modelled, on the values the deployment computes: the split's submodels run in
order, in float, on the proof inputs (``split/proof_inputs.npz``), so a CPU submodel reads what
the submodels before it really hand over (an int64 shape one of them computes, a state an LSTM
carries); each part is then timed in a session opened as the proofs open theirs (one that runs
what the proofs ran, its threads spinning as a deployment's do): the median wall time of up to ``REPEATS`` runs after one warm-up, stopping
early once ``BUDGET_SECONDS`` is spent. A part that cannot be measured never fails the build: it
is reported as not measured, with the reason, and left out of the sum. The figures change from
machine to machine and from run to run, so they go into ``report.json`` only, never into an
artifact.
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Mapping

import numpy as np
import onnx

from npubuild import onnx_io

REPEATS = 20
BUDGET_SECONDS = 1.0
METHOD = ("measured with ONNX Runtime on the build machine on the proof inputs and the values "
          f"the submodels before each part compute (median of up to {REPEATS} runs, <= 2 "
          "threads, spinning, sessions as the proofs open them otherwise); added to the NPU time, no overlap")


def median_seconds(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> float:
    """The median time of one run of ``model`` on ``feeds``."""
    # Spinning, as a deployment's own session runs: without it the pool's second thread wakes
    # late, and YOLOv8n-320's CPU part timed 1.2 or 2.3 ms from one build to the next on a
    # quiet machine (1.16-1.19 ms in six processes with it; the session is timed alone).
    sess = onnx_io.session(model, spinning=True)
    onnx_io.run(sess, feeds)
    times: list[float] = []
    while len(times) < REPEATS and sum(times) < BUDGET_SECONDS:
        start = time.perf_counter()
        onnx_io.run(sess, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measured(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray | None],
             missing_because: str = "") -> dict:
    """``{"seconds": s}``, or ``{"seconds": None, "not_measured": why}`` when an input has no
    value (``missing_because`` says why) or ONNX Runtime cannot run the part."""
    absent = [name for name, value in feeds.items() if value is None]
    if absent:
        return {"seconds": None, "not_measured": f"no value for {absent[0]!r}"
                + (f": {missing_because}" if missing_because else "")}
    try:
        return {"seconds": round(median_seconds(model, feeds), 6)}
    except Exception as exc:  # noqa: BLE001 - an estimate is never worth a failed build
        return {"seconds": None, "not_measured": _brief(exc)}


def deployment_parts(split_dir: Path | None, qgraphs) -> dict[str, dict]:
    """Measured seconds of every CPU submodel in ``split_dir`` (``graph_<i>``; none without a
    split directory) and of every float layer inside the quantized NPU graphs ``qgraphs``
    (``graph_<i>/<layer>``), each on the values the deployment feeds it."""
    if split_dir is None:
        return {}
    from npubuild.quant.pipeline import SplitPipeline

    pipeline = SplitPipeline(split_dir)
    values, why = pipeline_values(pipeline)
    parts: dict[str, dict] = {}
    for graph in pipeline.graphs:
        if graph.device == "cpu":
            parts[graph.info.name] = {**measured(graph.model, {t: values.get(t) for t in graph.inputs},
                                                 why), "nodes": len(graph.model.graph.node)}
    by_name = {g.info.name: g for g in pipeline.graphs}
    for qgraph in qgraphs:
        layers = [layer for layer in qgraph.cpu_layers() if "model" in layer.arrays]
        inner = _inner_values(by_name.get(qgraph.name), values,
                              [t for layer in layers for t in layer.inputs])
        for layer in layers:
            model = onnx.load_from_string(layer.arrays["model"].tobytes())
            feeds = {t: inner.get(t) for t in layer.inputs}
            shapes = {t: qgraph.tensors[t].shape for t in layer.inputs if t in qgraph.tensors}
            zeros = _zeros_for_inner(model, feeds, shapes)
            parts[f"{qgraph.name}/{layer.name}"] = {
                **measured(model, {**feeds, **zeros}, why), "nodes": 1,
                "reason": layer.attrs.get("reason", ""),
                **({"timed_on_zeros": sorted(zeros)} if zeros else {})}
            inner.update(_outputs(model, feeds))
    return parts


def _zeros_for_inner(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray | None],
                     shapes: Mapping[str, list[int]]) -> dict[str, np.ndarray]:
    """Zeros for the float inputs no float model computes (an integer layer's output inside a
    fused layer, e.g. the Conv of a ConvSilu whose Mul is kept in float), at the shape the
    quantized graph gives them (``shapes``): a float kernel takes as long on zeros, and the
    part is marked ``timed_on_zeros``. Integer inputs (shapes, indices) never get made-up
    values."""
    types = {i.name: i.type.tensor_type for i in model.graph.input}
    out = {}
    for name, value in feeds.items():
        kind = types.get(name)
        if value is not None or kind is None or kind.elem_type != onnx.TensorProto.FLOAT:
            continue
        dims = shapes.get(name)
        if dims and all(isinstance(d, int) and d > 0 for d in dims):
            out[name] = np.zeros(dims, np.float32)
    return out


def _outputs(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray | None]) -> dict[str, np.ndarray]:
    """A float layer's outputs on ``feeds`` (none when an input has no value or it does not
    run): the layers after it read tensors the float submodel never computes (a fused
    ConvSilu kept in float is a Conv and a Mul, handing over the Conv's output)."""
    if any(value is None for value in feeds.values()):
        return {}
    try:
        return onnx_io.run(model, feeds)
    except Exception:  # noqa: BLE001 - the layers after it are then reported as not measured
        return {}


def pipeline_values(pipeline) -> tuple[dict[str, np.ndarray], str]:
    """Every tensor between the submodels, the float pipeline run in order on the proof inputs;
    ``({}, why)`` when it cannot run."""
    from npubuild import proofs

    graph = onnx.helper.make_graph([], "inputs", pipeline.input_values(), [])
    try:
        feeds = proofs.load(pipeline.split_dir, onnx.helper.make_model(graph))
        return pipeline.float_values(feeds), ""
    except Exception as exc:  # noqa: BLE001
        return {}, f"the float pipeline did not run on the proof inputs ({_brief(exc)})"


def _inner_values(graph, values: Mapping[str, np.ndarray], names: list[str]
                  ) -> dict[str, np.ndarray]:
    """The values of tensors inside the NPU submodel ``graph`` (its float model run on the
    pipeline's ``values``); those it does not compute are left out."""
    if graph is None or not names:
        return {}
    computed = {o for n in graph.model.graph.node for o in n.output}
    wanted = [t for t in dict.fromkeys(names) if t in computed]
    inner = {t: values[t] for t in names if t in values}
    try:
        inner.update(onnx_io.run(onnx_io.with_outputs(graph.model, wanted),
                                 {t: values[t] for t in graph.inputs}, wanted) if wanted else {})
    except Exception:  # noqa: BLE001 - those layers are then reported as not measured
        pass
    return inner


def _brief(exc: BaseException) -> str:
    """The exception in one line: its type and its message's last line (ONNX Runtime puts the
    cause there)."""
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[-1][:300] if text else ''}".rstrip(": ")
