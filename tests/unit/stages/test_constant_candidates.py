"""A quantized constant operand (a BatchNorm's per-channel scale written as a Mul constant, a
window) is a precision-search candidate like an activation (issue 21's class): one int8 scale
for a scale vector that spans 0.15 … 100 rounds the small entries to 0 or 1 step, whatever
the activations' precision. On a chip with int16 the search may keep that constant in int16
(or in float, its reader on the CPU), and the fake-quant model the search scores with reads
the constant at the precision the choice gives it, its float value where the choice runs the
reader in float."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npubuild.quant import calibrate, fakequant, quantizer
from npubuild.quant.lower import lower
from tests.conftest import build_on_npy_data

SHAPE = [1, 4, 6, 6]
SCALE = np.array([100.0, 0.15, 0.2, 0.25])  # one per channel, as a BatchNorm's
HEAD = np.array([0.0, 1.0, -1.0, 1.0])     # the output reads the small channels only

def scaled_model() -> onnx.ModelProto:
    """x → Relu → Mul by a per-channel constant ``scale`` (4 values) → Conv 1×1 (4 → 1)."""
    inits = [numpy_helper.from_array(SCALE.reshape(1, 4, 1, 1).astype(np.float32), "scale"),
             numpy_helper.from_array(HEAD.reshape(1, 4, 1, 1).astype(np.float32), "head_w")]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "scale"], ["m"], name="bn_scale"),
             helper.make_node("Conv", ["m", "head_w"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "scaled", [helper.make_tensor_value_info("x", 1, SHAPE)],
                              [helper.make_tensor_value_info("y", 1, [1, 1, 6, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _samples(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1.0, 2.0, SHAPE).astype(np.float32) for _ in range(n)]


def _run(root, name: str, extra: str = ""):
    return build_on_npy_data(root, name, "scaled.onnx", scaled_model,
                             lambda: {"cal": _samples(4, 0), "ver": _samples(3, 1)},
                             quantization=extra)


def test_the_search_keeps_a_constant_in_int16_where_int16_activations_are_not_enough(tmp_path):
    result, out = _run(tmp_path, "scaled", "  auto: {precision: int16}\n")
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert not report["quantization"]["int8_verdict"]["passed"]
    search = json.loads((out / "quantize" / "search.json").read_text())
    chosen = {c["tensor"]: c["precision"] for c in search["chosen"]}
    assert search["passed"] and chosen.get("scale") == "int16"
    qgraph = json.loads((out / "quantize" / "graph_0.qgraph.json").read_text())
    assert qgraph["tensors"]["scale"]["dtype"] == "int16"
    assert report["simulator"]["bit_exact"]
    assert report["accuracy"]["outputs"]["y"]["cosine"] >= 0.99
    assert "scale" in (out / "recipe.lock").read_text()


def _fake_quant_output(choice_float: bool) -> tuple[np.ndarray, np.ndarray]:
    """The fake-quant model's output with the constant's reader in float (``choice_float``)
    or int8 everywhere, and the float model's."""
    from npubuild import onnx_io

    model = scaled_model()
    fg, probe = lower(model)
    observer = calibrate.Observer(fg, probe, "minmax", every_tensor=True)
    for x in _samples(4, 0):
        observer.update({"x": x})
    config = quantizer.QuantConfig(scheme="symmetric")
    qg, _ = quantizer.quantize_graph(fg, observer.stats, config, "g")
    fq, tensors, layers, _ = fakequant.export_fake_quant(qg, fg)
    floats = frozenset({"r", "scale", "m"} if choice_float else ())
    q = quantizer.Quantizer(fg, observer.stats, quantizer.QuantConfig(
        scheme="symmetric", float_tensors=floats))
    params, cpu = q.tensor_params()
    feeds = {"x": _samples(1, 1)[0], **fakequant.params_feed(tensors, params, layers, cpu)}
    got = onnx_io.run(fq, feeds)["y"]
    return got, onnx_io.run(model, {"x": feeds["x"]})["y"]


def test_a_constant_whose_reader_runs_in_float_is_read_in_float_by_the_fake_quant_model():
    in_float, ref = _fake_quant_output(True)
    int8, _ = _fake_quant_output(False)
    assert np.abs(int8 - ref).max() > 0.05  # int8 rounds 0.15 … 0.25 to 0 or 1 step (0.39)
    np.testing.assert_allclose(in_float, ref, rtol=1e-5, atol=1e-3)  # the head's int8 input only
