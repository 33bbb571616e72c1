"""A full-integer model's int8 input and output run on the NPU (issue "closer to the limit").

A TFLite export with ``inference_input_type=tf.int8`` (microcontroller models: TFLite Micro,
Silicon Labs MLTK) reads its int8 input through a DequantizeLinear and writes its int8 output
through a QuantizeLinear. Both used to run on the host, each an ONNX Runtime session that took
most of the frame; the NPU takes the integers at its boundary itself.
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild import api, onnx_io
from tests.conftest import write_recipe

IN_SCALE, IN_ZERO = 0.05, -3      # not a power of two, nor zero-centred: npu-strict's pow2
OUT_SCALE, OUT_ZERO = 0.1, 5      # scheme cannot take them, so it requantizes on the NPU


def _integer_model(nhwc: bool) -> onnx.ModelProto:
    """int8 x → [NHWC→NCHW Transpose of the integers] → DequantizeLinear → Conv → Relu →
    Conv → QuantizeLinear → int8 y, as tf2onnx writes a full-integer TFLite."""
    rng = np.random.default_rng(7)
    init = [numpy_helper.from_array(np.float32(IN_SCALE), "s_in"),
            numpy_helper.from_array(np.int8(IN_ZERO), "z_in"),
            numpy_helper.from_array(np.float32(OUT_SCALE), "s_out"),
            numpy_helper.from_array(np.int8(OUT_ZERO), "z_out"),
            numpy_helper.from_array(rng.normal(0, 0.3, (4, 3, 3, 3)).astype(np.float32), "w1"),
            numpy_helper.from_array(rng.normal(0, 0.1, 4).astype(np.float32), "b1"),
            numpy_helper.from_array(rng.normal(0, 0.3, (2, 4, 1, 1)).astype(np.float32), "w2")]
    nodes = []
    integers = "x_q"
    if nhwc:
        nodes.append(helper.make_node("Transpose", ["x_q"], ["x_nchw"], "to_nchw", perm=[0, 3, 1, 2]))
        integers = "x_nchw"
    nodes += [helper.make_node("DequantizeLinear", [integers, "s_in", "z_in"], ["x"], "dq_x"),
              helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], "conv1", pads=[1, 1, 1, 1]),
              helper.make_node("Relu", ["c1"], ["r1"], "relu1"),
              helper.make_node("Conv", ["r1", "w2"], ["c2"], "conv2"),
              helper.make_node("QuantizeLinear", ["c2", "s_out", "z_out"], ["y_q"], "q_y")]
    shape = [1, 8, 8, 3] if nhwc else [1, 3, 8, 8]
    graph = helper.make_graph(nodes, "int8_io", [helper.make_tensor_value_info("x_q", TensorProto.INT8, shape)],
                              [helper.make_tensor_value_info("y_q", TensorProto.INT8, [1, 2, 8, 8])], init)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=9)


RECIPE = """\
version: 1
name: int8io
model:
  path: {model}
  inputs: [{{name: x_q, shape: {shape}}}]
target: {chip}
quantization:
  {scheme}calibration: {{data: "cal_*.npz", samples: 4}}
verify: {{data: "ver_*.npz", samples: 2, min_cosine: 0.9}}
"""


@pytest.mark.parametrize("chip, nhwc, scheme", [("npu-16m", True, None),
                                                ("npu-strict", False, "pow2_symmetric")])
def test_a_models_integer_input_and_output_run_on_the_npu(tmp_path, chip, nhwc, scheme):
    model = _integer_model(nhwc)
    onnx.save(model, str(tmp_path / "m.onnx"))
    shape = [1, 8, 8, 3] if nhwc else [1, 3, 8, 8]
    rng = np.random.default_rng(0)
    samples = [rng.integers(-128, 128, shape).astype(np.int8) for _ in range(6)]
    for i, x in enumerate(samples):
        np.savez(tmp_path / (f"cal_{i}.npz" if i < 4 else f"ver_{i}.npz"), x_q=x)
    recipe = write_recipe(tmp_path, RECIPE.format(
        model=tmp_path / "m.onnx", shape=shape, chip=chip,
        scheme=f"scheme: {scheme}\n  " if scheme else ""))
    session = api.session_for(recipe, build_root=tmp_path / "build", cache=tmp_path / "cache")
    report = api.build(session, None)

    # one NPU segment: no host part converts the integers
    assert (report["split"]["npu_segments"], report["split"]["cpu_segments"]) == (1, 0), report["split"]
    assert report["simulator"]["bit_exact"] is True
    assert report["stages"]["verify"]["status"] == "built", report["stages"]

    # the NPU's input is the model's int8 input itself (scale 1, zero point 0), fed unchanged,
    # and its output the model's int8 output
    calibration = json.loads((tmp_path / "build" / "int8io" / "quantize" / "calibration.json").read_text())
    (tensors,) = [g["tensors"] for g in calibration["graphs"].values()]
    for name in ("x_q", "y_q"):
        assert (tensors[name]["scale"], tensors[name]["zero_point"], tensors[name]["dtype"]) == (1.0, 0, "int8")
    # import moved the DequantizeLinear ahead of the Transpose: it reads the input itself
    dequantized = tensors[next(t for t in tensors if t.startswith("x_q_dequantized"))
                          if nhwc else "x"]
    if scheme is None:  # asymmetric: the DequantizeLinear's own parameters, the identity
        assert (dequantized["scale"], dequantized["zero_point"]) == (pytest.approx(IN_SCALE), IN_ZERO)
    else:  # pow2: no such scale, a requantize on the NPU
        assert dequantized["zero_point"] == 0 and np.log2(dequantized["scale"]).is_integer()

    x = samples[5]
    (want,) = onnx_io.run(model, {"x_q": x}).values()
    got = api.infer(session, {"x_q": x})["y_q"]
    assert got.dtype == np.int8  # handed back as the model's own QuantizeLinear wrote it
    # within a few output steps of the integer model (the NPU quantizes the float layers itself)
    assert np.abs(got.astype(np.int32) - want.astype(np.int32)).max() <= 4


def test_the_precision_search_feeds_a_models_integer_input(tmp_path):
    """Where int8 misses verify's threshold the search scores its choices on the fake-quant
    export, whose inputs are float: the model's int8 input is fed as the floats it holds
    (ONNX Runtime refused the int8 array: "Unexpected input data type")."""
    onnx.save(_integer_model(True), str(tmp_path / "m.onnx"))
    rng = np.random.default_rng(0)
    for i in range(6):
        np.savez(tmp_path / (f"cal_{i}.npz" if i < 4 else f"ver_{i}.npz"),
                 x_q=rng.integers(-128, 128, [1, 8, 8, 3]).astype(np.int8))
    recipe = write_recipe(tmp_path, RECIPE.format(
        model=tmp_path / "m.onnx", shape=[1, 8, 8, 3], chip="npu-16m", scheme="")
        .replace("min_cosine: 0.9}", "min_cosine: 0.99999}"))
    session = api.session_for(recipe, build_root=tmp_path / "build", cache=tmp_path / "cache")
    report = api.build(session, "quantize")
    assert report["stages"]["quantize"]["status"] == "built", report["stages"]
    assert report["split"]["cpu_segments"] == 0, report["split"]
    dtypes = report["quantization"]["graphs"]["graph_0"]["tensor_dtypes"]
    assert dtypes.get("int16"), dtypes  # the search ran and widened tensors
