"""Real models: YOLOv8n (nudenet's 320n.onnx) and the light models shipped in the onnx wheel."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from npubuild.fusions import DEFAULT_RULES
from npubuild.onnx_io import fix_input_shapes
from npubuild.onnx_io import graph_inputs, run
from npubuild.proofs import make_feeds as random_feeds
from npubuild.stages.fusion import fuse

pytestmark = pytest.mark.slow

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


@pytest.fixture(scope="module")
def yolov8n() -> onnx.ModelProto:
    nudenet = pytest.importorskip("nudenet")
    model = onnx.load(Path(nudenet.__file__).parent / "320n.onnx")
    return fix_input_shapes(model, {"images": [1, 3, 320, 320]})


def silu_count(model: onnx.ModelProto) -> int:
    producer = {o: n for n in model.graph.node for o in n.output}
    return sum(1 for n in model.graph.node if n.op_type == "Mul" and any(
        producer.get(s) is not None and producer[s].op_type == "Sigmoid" and producer[s].input[0] == x
        for x, s in (n.input, n.input[::-1])))


def test_yolov8n_has_57_silus_beside_one_plain_sigmoid(yolov8n):
    sigmoids = [n.name for n in yolov8n.graph.node if n.op_type == "Sigmoid"]
    assert silu_count(yolov8n) == 57 and len(sigmoids) == 58


def test_yolov8n_silu_fuses_every_silu_with_bit_identical_outputs(yolov8n):
    log = fuse(yolov8n, ["conv_bn", "silu"])
    fused = log["model"]
    assert log["fused_ops"] == {"Silu": 57} and silu_count(fused) == 0
    assert [n.name for n in fused.graph.node if n.op_type == "Sigmoid"] == ["/model.22/Sigmoid"]
    assert log["rules"][1]["check"]["identical"] is True


def test_yolov8n_conv_silu_before_silu_fuses_each_conv_with_its_silu(yolov8n):
    log = fuse(yolov8n, ["conv_bn", "conv_silu", "silu", "conv_act"])
    fused = log["model"]
    assert {e["rule"]: e["fired"] for e in log["rules"]} == {
        "conv_bn": 0, "conv_silu": 57, "silu": 0, "conv_act": 0}
    ops = Counter(n.op_type for n in fused.graph.node)
    assert ops["ConvSilu"] == 57 and ops["Conv"] == 64 - 57 and ops["Mul"] == 61 - 57
    assert [(f.name, f.overload) for f in fused.functions] == [("ConvSilu", "Silu")]
    node = next(n for n in fused.graph.node if n.op_type == "ConvSilu")
    attrs = {a.name for a in node.attribute}
    assert {"kernel_shape", "strides", "pads", "dilations", "group", "activation"} <= attrs
    feeds = random_feeds(yolov8n, seed=11)
    np.testing.assert_array_equal(run(fused, feeds)["output0"], run(yolov8n, feeds)["output0"])


LIGHT_FUSIONS = {"resnet50": (53, 33), "squeezenet": (0, 26), "shufflenet": (49, 17),
                 "inception_v1": (0, 57)}


@pytest.mark.parametrize("name", list(LIGHT_FUSIONS))
def test_light_model_with_default_rules_reproduces_its_reference_output(name):
    model = onnx.load(LIGHT / f"light_{name}.onnx")
    log = fuse(model, list(DEFAULT_RULES))
    fused = log["model"]
    fired = {e["rule"]: e["fired"] for e in log["rules"]}
    assert (fired["conv_bn"], fired["conv_act"]) == LIGHT_FUSIONS[name]
    assert not any(n.op_type == "BatchNormalization" for n in fused.graph.node)
    # onnx's backend runner feeds these models arange(n).reshape(shape) / n (Runner.generate_dummy_data)
    (value,) = graph_inputs(fused)
    shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
    feed = (np.arange(np.prod(shape)).reshape(shape) / np.prod(shape)).astype(np.float32)
    expected = numpy_helper.to_array(onnx.load_tensor(str(LIGHT / f"light_{name}_output_0.pb")))
    (got,) = run(fused, {value.name: feed}).values()
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-7)
