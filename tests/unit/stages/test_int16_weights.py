"""Models bound by int8 weights (issue 21's class: PP-OCRv2's recognizer, BlazePose's landmark
model): with every activation in float and only the weights in int8 they still miss verify's
bar, so no activation precision helps. On a chip with int16 the precision search then gives
the layers that need it int16 weights too (W16A16, `w16a16`), and the recipe as a user writes
it passes verify: compile's simulator bit-exact with the integer reference, the choice in the
report, the lock file's quantize stage and the qgraph."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tests.conftest import build_on_npy_data

SHAPE = [1, 8, 4, 4]
# one large weight on a channel that is nearly constant (a bias-like input) beside small
# weights on the channels that carry the signal: int8's step (3 / 127) rounds the small ones
# to 0 or ±1 step, whatever the activations' precision; int16's (3 / 32767) keeps them
HEAD = np.array([3.0, 0.011, -0.017, 0.006, 0.014, -0.009, 0.019, -0.004])

def _model() -> onnx.ModelProto:
    """x (8 channels) → Conv (8 → 1, 1×1, weights ``HEAD``, bias -3: the constant channel's
    contribution taken off)."""
    inits = [numpy_helper.from_array(HEAD.reshape(1, 8, 1, 1).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([-3.0], np.float32), "b")]
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "outlier", [helper.make_tensor_value_info("x", 1, SHAPE)],
                              [helper.make_tensor_value_info("y", 1, [1, 1, 4, 4])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _data() -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    data = {}
    for kind, count in (("cal", 4), ("ver", 3)):
        data[kind] = []
        for _ in range(count):
            x = rng.uniform(-1.0, 1.0, SHAPE)
            x[:, 0] = rng.uniform(0.999, 1.0, SHAPE[2:])  # nearly constant
            data[kind].append(x)
    return data


def _run(root, name: str, target: str = "npu-16m", auto: str = ""):
    return build_on_npy_data(root, name, "outlier.onnx", _model, _data, target=target,
                             quantization=auto)


def test_a_model_int8_weights_bound_passes_verify_with_int16_weights_as_written(tmp_path):
    result, out = _run(tmp_path, "outlier")
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    quantization = report["quantization"]
    assert not quantization["int8_verdict"]["passed"]
    search = quantization["search"]
    assert search["passed"] and {c["precision"] for c in search["chosen"]} == {"w16a16"}
    assert report["simulator"]["bit_exact"]
    qgraph = json.loads((out / "quantize" / "graph_0.qgraph.json").read_text())
    head = next(layer for layer in qgraph["layers"] if layer["name"] == "head")
    assert head["arrays"]["weight"]["dtype"] == "int16"
    assert head["arrays"]["bias"]["dtype"] == "int64"
    assert report["accuracy"]["outputs"]["y"]["cosine"] >= 0.99


def test_int16_activations_alone_cannot_pass_it_and_the_note_says_what_was_measured(tmp_path):
    result, out = _run(tmp_path, "outlier-int16", auto="  auto: {precision: int16}\n")
    assert result.returncode == 1
    search = json.loads((out / "quantize" / "search.json").read_text())
    assert not search["passed"]
    assert "int8 weights bound this model" in search["note"]
    assert ("int16 weights with int16 activations (w16a16) on every candidate tensor pass "
            "(cosine margin +0.0100): allow them with quantization.auto.precision: w16a16"
            in search["note"])
