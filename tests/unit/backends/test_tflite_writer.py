"""The int8 TFLite npubuild writes for Vela: each op on a tiny model written inline, run in
TensorFlow Lite's reference kernels, against ONNX Runtime's float result."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from npubuild import onnx_io
from npubuild.backends.tflite_writer import (
    Unwritable,
    activation_quant,
    shared_ranges,
    weight_quant,
    write_tflite,
)
from npubuild.backends.vela import TfliteModel, minmax_ranges
from tests.unit.split.split_models import Net

pytest.importorskip("tensorflow")
X = [1, 4, 8, 8]


def feeds(model, n=6, seed=0):
    rng = np.random.default_rng(seed)
    return [{i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
             .astype(np.float32) for i in model.graph.input} for _ in range(n)]


def cosine_through_tflite(model: onnx.ModelProto, tmp_path) -> float:
    data = feeds(model)
    path = tmp_path / "m.tflite"
    path.write_bytes(write_tflite(model, minmax_ranges(model, data)))
    tflite, out = TfliteModel(path), model.graph.output[0].name
    ref = np.concatenate([onnx_io.run(model, f, [out])[out].ravel() for f in data])
    got = np.concatenate([tflite.run(f, [out])[out].ravel() for f in data])
    return float(ref @ got / np.linalg.norm(ref) / np.linalg.norm(got))


def conv_net(**conv_attrs) -> onnx.ModelProto:
    net = Net()
    y = net.conv(net.input("x", X), 4, 8, **conv_attrs)
    return net.model([net.op("Relu", [y])])


@pytest.mark.parametrize("attrs", [{}, {"strides": [2, 2]}, {"pads": [0, 0, 0, 0]},
                                   {"pads": [0, 1, 2, 1]}, {"dilations": [2, 2], "pads": [2] * 4}],
                         ids=["same", "stride2-explicit-pad", "valid", "uneven-pads", "dilated"])
def test_a_convolution_matches_onnx_runtime_whatever_its_padding(attrs, tmp_path):
    assert cosine_through_tflite(conv_net(**attrs), tmp_path) > 0.999


def test_a_depthwise_convolution_and_silu_match(tmp_path):
    net = Net()
    y = net.conv(net.input("x", X), 4, 4, group=4)
    y = net.op("Mul", [y, net.op("Sigmoid", [y])])
    assert cosine_through_tflite(net.model([y]), tmp_path) > 0.995


def test_pools_resize_concat_and_a_classifier_head_match(tmp_path):
    net = Net()
    x = net.input("x", X)
    p = net.op("MaxPool", [x], kernel_shape=[3, 3], pads=[1, 1, 1, 1])
    a = net.op("AveragePool", [x], kernel_shape=[2, 2], strides=[2, 2])
    up = net.op("Resize", [a, "", net.init("scales", np.array([1, 1, 2, 2], np.float32))],
                mode="nearest", coordinate_transformation_mode="asymmetric", nearest_mode="floor")
    cat = net.op("Concat", [p, up], axis=1)
    s = net.op("Add", [cat, net.init("k", np.full((1, 8, 1, 1), 0.5, np.float32))])
    g = net.op("GlobalAveragePool", [s])
    f = net.op("Flatten", [g], axis=1)
    y = net.op("Gemm", [f, net.init("w", np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)),
                        net.init("b", np.zeros(3, np.float32))], transB=1)
    assert cosine_through_tflite(net.model([y]), tmp_path) > 0.999


def test_a_flatten_of_a_feature_map_keeps_onnx_order(tmp_path):
    net = Net()
    y = net.op("Flatten", [net.conv(net.input("x", X), 4, 2)], axis=1)
    assert cosine_through_tflite(net.model([y]), tmp_path) > 0.999


def test_a_grouped_convolution_is_refused_naming_the_node():
    net = Net()
    model = net.model([net.conv(net.input("x", X), 4, 4, group=2, name="g")])
    with pytest.raises(Unwritable, match="'g'.*grouped convolution"):
        write_tflite(model, minmax_ranges(model, feeds(model)))


def test_the_same_model_and_ranges_give_the_same_bytes():
    model = conv_net()
    ranges = minmax_ranges(model, feeds(model))
    assert write_tflite(model, ranges) == write_tflite(model, ranges)


def test_activation_parameters_hold_zero_and_the_range():
    q = activation_quant(-1.0, 3.0)
    scale, zero = float(q.scale[0]), int(q.zero_point[0])
    assert scale == pytest.approx(4 / 255)
    assert (-128 - zero) * scale == pytest.approx(-1.0, abs=scale)  # the codes span the range
    assert (127 - zero) * scale == pytest.approx(3.0, abs=scale)


def test_weights_are_symmetric_per_output_channel():
    w = np.array([[1.0, -2.0], [0.5, 0.25]], np.float32)
    q, quant = weight_quant(w, 0)
    assert q.tolist() == [[64, -127], [127, 64]]
    assert list(quant.zero_point) == [0, 0] and quant.scale[0] == pytest.approx(2 / 127)


def test_tensors_tflite_needs_at_one_quantization_share_the_union_of_their_ranges():
    net = Net()
    a, b = net.input("a", X), net.input("b", X)
    cat = net.op("Concat", [a, net.op("Sigmoid", [b], name="s")], axis=1, name="c")
    model = net.model([net.op("MaxPool", [cat], kernel_shape=[2, 2], name="m")])
    ranges = shared_ranges(model, {"a": (-2.0, 0.5), "s_out": (0.0, 1.0), "c_out": (-2.0, 1.0)})
    # the sigmoid's fixed 1/256 output quantization wins its group: a, the concat, the pool
    assert ranges["a"] == ranges["c_out"] == ranges["m_out"] == (0.0, 255 / 256)


def test_a_reshape_into_a_feature_map_keeps_onnx_order(tmp_path):
    net = Net()
    y = net.conv(net.input("x", X), 4, 8)
    y = net.op("Reshape", [y, net.init("s", np.array([1, 2, 32, 8]))])
    assert cosine_through_tflite(net.model([net.op("Relu", [y])]), tmp_path) > 0.999


def test_a_channel_split_shares_its_input_quantization_and_matches(tmp_path):
    net = Net()
    y = net.conv(net.input("x", X), 4, 8)
    a, b = net.op("Split", [y, net.init("sizes", np.array([3, 5]))], outputs=2, axis=1)
    out = net.op("Concat", [net.op("Relu", [b]), a], axis=1)
    assert cosine_through_tflite(net.model([out]), tmp_path) > 0.999


def test_hard_swish_as_onnx_writes_it_and_a_division_by_a_constant_is_a_multiplication(tmp_path):
    net = Net()
    x = net.conv(net.input("x", X), 4, 4)
    clip = net.op("Clip", [net.op("Add", [x, net.init("three", np.array(3.0, np.float32))]),
                           net.init("lo", np.array(0.0, np.float32)), net.init("hi", np.array(6.0, np.float32))])
    y = net.op("Div", [net.op("Mul", [x, clip]), net.init("six", np.array(6.0, np.float32))])
    assert cosine_through_tflite(net.model([y]), tmp_path) > 0.999
