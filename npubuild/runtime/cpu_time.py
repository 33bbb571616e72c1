"""How long the float (CPU) part of a deployment takes on this machine, measured with ONNX Runtime.

The performance estimate adds it to the NPU's cycles: every CPU submodel of the split, and every
layer quantize kept in float inside an NPU graph (a quantization override), each run after the
NPU work it depends on (no overlap is assumed, as in a single-threaded deployment loop).

Measured, not modelled: the median wall time of up to ``REPEATS`` runs (after one warm-up, and
stopping early once ``BUDGET_SECONDS`` is spent) of an ONNX Runtime session with its default
graph optimisations and at most two intra-op threads, on seeded random inputs of the model's own
shapes and types. The figures change from machine to machine and from run to run, so they go
into ``report.json`` only, never into an artifact.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Mapping

import numpy as np
import onnx

from npubuild import onnx_io

REPEATS = 20
BUDGET_SECONDS = 1.0
METHOD = ("measured with ONNX Runtime on the build machine (median of up to "
          f"{REPEATS} runs, <= 2 threads, default graph optimisations); added to the NPU time, "
          "no overlap")


def session(model: onnx.ModelProto):
    """An ONNX Runtime CPU session as a deployment would open it (graph optimisations on)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    options.intra_op_num_threads = max(1, min(2, os.cpu_count() or 1))
    source = onnx_io.with_loadable_ir(model).SerializeToString()
    return ort.InferenceSession(source, options, providers=["CPUExecutionProvider"])


def median_seconds(model: onnx.ModelProto, shapes: Mapping[str, list[int]] | None = None) -> float:
    """The median time of one run of ``model`` (inputs of ``shapes`` when its own are unknown)."""
    from npubuild.proofs import make_feeds

    sess = session(model)
    feeds = _feeds(sess, shapes or {}) if shapes else make_feeds(model)
    sess.run(None, feeds)
    times: list[float] = []
    while len(times) < REPEATS and sum(times) < BUDGET_SECONDS:
        start = time.perf_counter()
        sess.run(None, feeds)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


_TYPES = {"tensor(float)": np.float32, "tensor(float16)": np.float16, "tensor(double)": np.float64,
          "tensor(int64)": np.int64, "tensor(int32)": np.int32, "tensor(int8)": np.int8,
          "tensor(uint8)": np.uint8, "tensor(bool)": np.bool_}


def _feeds(sess, shapes: Mapping[str, list[int]]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {i.name: rng.standard_normal(shapes[i.name]).astype(_TYPES.get(i.type, np.float32))
            for i in sess.get_inputs()}


def deployment_parts(split_dir, qgraphs) -> dict[str, dict]:
    """Measured seconds of every CPU submodel in ``split_dir`` (``graph_<i>``; none without a
    split directory) and of every float layer inside the quantized NPU graphs ``qgraphs``
    (``graph_<i>/<layer>``)."""
    from npubuild.runtime.runner import Runner

    parts: dict[str, dict] = {}
    for graph in Runner(split_dir).graphs if split_dir is not None else []:
        if graph.device == "cpu":
            model = onnx_io.load_model(graph.model_path)
            parts[graph.name] = {"seconds": round(median_seconds(model), 6),
                                 "nodes": len(model.graph.node)}
    for qgraph in qgraphs:
        for layer in qgraph.cpu_layers():
            if "model" not in layer.arrays:
                continue
            model = onnx.load_from_string(layer.arrays["model"].tobytes())
            shapes = {t: qgraph.tensors[t].shape for t in layer.inputs if t in qgraph.tensors}
            parts[f"{qgraph.name}/{layer.name}"] = {
                "seconds": round(median_seconds(model, shapes), 6), "nodes": 1,
                "reason": layer.attrs.get("reason", "")}
    return parts
