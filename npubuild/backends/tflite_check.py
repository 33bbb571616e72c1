"""npubuild's integer reference against TensorFlow Lite's reference kernels on the same integer
model: the TFLite `npubuild.backends.tflite_writer` wrote from a qgraph holds that qgraph's
tensors, parameters, weights and biases, so both runtimes compute the same integers but for
their rounding conventions. Compared tensor by tensor in integer steps, two ways:

- **end to end**: both run the whole graph from the same integer inputs (a difference in one
  layer travels on through the next);
- **per layer**: npubuild's kernel of each layer fed TFLite's own integers at its inputs, so a
  difference is that layer's arithmetic alone (requantization rounding, a fixed-point sigmoid).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from npubuild.quant.qgraph import QGraph

#: Rows of the report's worst layers.
WORST = 8


def tflite_tensors(path: Path, int_inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor of the TFLite at ``path`` (by name, ONNX layout) after one run of TFLite's
    reference kernels on ``int_inputs`` (integers, ONNX layout)."""
    import warnings

    from npubuild.frontends.tensorflow import _tensorflow

    tf = _tensorflow()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        interpreter = tf.lite.Interpreter(
            model_path=str(path), experimental_preserve_all_tensors=True,
            experimental_op_resolver_type=tf.lite.experimental.OpResolverType.BUILTIN_REF)
    interpreter.allocate_tensors()
    for detail in interpreter.get_input_details():
        value = np.asarray(int_inputs[detail["name"]])
        interpreter.set_tensor(detail["index"], value.transpose(0, 2, 3, 1) if value.ndim == 4 else value)
    interpreter.invoke()
    out = {}
    for detail in interpreter.get_tensor_details():
        try:
            value = interpreter.get_tensor(detail["index"])
        except ValueError:  # a tensor the interpreter did not keep
            continue
        out[detail["name"]] = value.transpose(0, 3, 1, 2) if value.ndim == 4 else value
    return out


def _steps(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return np.abs(np.asarray(a, np.int64) - np.asarray(b, np.int64))


def integer_agreement(qgraph: QGraph, path: Path, feeds: Sequence[dict]) -> dict:
    """npubuild's integer reference and TFLite's kernels on ``feeds`` (float, quantized by
    npubuild's input parameters), per qgraph tensor: the largest difference in integer steps
    end to end and per layer, the fraction of elements that differ, and the layer kinds where
    they do (see the module docstring)."""
    from npubuild.quant.reference import quantize_inputs, run_layer, run_reference

    rows: dict[str, dict] = {}
    for feed in feeds:
        ints = quantize_inputs(qgraph, feed)
        ours = run_reference(qgraph, ints)
        theirs = tflite_tensors(path, ints)
        for layer in qgraph.layers:
            if not all(t in theirs for t in [*layer.inputs, *layer.outputs]):
                continue
            local = run_layer(layer, [theirs[t] for t in layer.inputs])
            for name, alone in zip(layer.outputs, local):
                e2e, own = _steps(ours[name], theirs[name]), _steps(alone, theirs[name])
                row = rows.setdefault(name, {"tensor": name, "kind": layer.kind,
                                             "function": layer.attrs.get("function"),
                                             "max_steps": 0, "layer_max_steps": 0,
                                             "differing": 0, "layer_differing": 0, "elements": 0})
                row["max_steps"] = max(row["max_steps"], int(e2e.max(initial=0)))
                row["layer_max_steps"] = max(row["layer_max_steps"], int(own.max(initial=0)))
                row["differing"] += int(np.count_nonzero(e2e))
                row["layer_differing"] += int(np.count_nonzero(own))
                row["elements"] += int(e2e.size)
    return summary(list(rows.values()))


def summary(rows: list[dict]) -> dict:
    """The report's figures: how many tensors agree bit for bit, the largest differences, and
    per layer kind the largest difference a layer's own arithmetic makes."""
    by_kind: dict[str, dict] = {}
    for r in rows:
        kind = r["kind"] + (f" {r['function']}" if r["function"] else "")
        k = by_kind.setdefault(kind, {"layers": 0, "layer_max_steps": 0, "layer_differing": 0,
                                      "elements": 0})
        k["layers"] += 1
        k["layer_max_steps"] = max(k["layer_max_steps"], r["layer_max_steps"])
        k["layer_differing"] += r["layer_differing"]
        k["elements"] += r["elements"]
    for k in by_kind.values():
        k["layer_differing_fraction"] = round(k.pop("layer_differing") / max(k.pop("elements"), 1), 6)
    worst = sorted(rows, key=lambda r: (-r["max_steps"], -r["layer_max_steps"], r["tensor"]))
    return {"tensors": len(rows), "bit_exact": sum(r["max_steps"] == 0 for r in rows),
            "max_steps": max((r["max_steps"] for r in rows), default=0),
            "layer_max_steps": max((r["layer_max_steps"] for r in rows), default=0),
            "by_kind": dict(sorted(by_kind.items())),
            "worst": [{**r, "differing_fraction": round(r["differing"] / max(r["elements"], 1), 6)}
                      for r in worst[:WORST] if r["max_steps"] or r["layer_max_steps"]]}
