"""The integer TFLite npubuild writes for Vela from its own quantized graph: each layer kind on a
tiny model written inline, run in TensorFlow Lite's reference kernels, against ONNX Runtime's
float result and against npubuild's integer reference on the same integer model."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from npubuild import onnx_io
from npubuild.backends.tflite_check import integer_agreement
from npubuild.backends.tflite_writer import Unwritable, write_tflite
from npubuild.backends.vela import TfliteModel, converter_qgraph
from tests.unit.split.split_models import Net

pytest.importorskip("tensorflow")
X = [1, 4, 8, 8]


def feeds(model, n=6, seed=0):
    rng = np.random.default_rng(seed)
    return [{i.name: rng.standard_normal([d.dim_value for d in i.type.tensor_type.shape.dim])
             .astype(np.float32) for i in model.graph.input} for _ in range(n)]


def written(model: onnx.ModelProto, tmp_path):
    data = feeds(model)
    qgraph = converter_qgraph(model, data, "g")
    path = tmp_path / "m.tflite"
    result = write_tflite(qgraph)
    path.write_bytes(result.data)
    return qgraph, path, result, data


def cosine_through_tflite(model: onnx.ModelProto, tmp_path) -> float:
    _, path, _, data = written(model, tmp_path)
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


def test_a_grouped_convolution_is_refused_naming_the_layer(tmp_path):
    net = Net()
    model = net.model([net.conv(net.input("x", X), 4, 4, group=2, name="g")])
    with pytest.raises(Unwritable, match="'g'.*grouped convolution"):
        written(model, tmp_path)


def test_the_same_integer_graph_gives_the_same_bytes():
    model = conv_net()
    qgraph = converter_qgraph(model, feeds(model), "g")
    assert write_tflite(qgraph).data == write_tflite(qgraph).data


def test_a_reshape_into_a_feature_map_keeps_onnx_order(tmp_path):
    net = Net()
    y = net.conv(net.input("x", X), 4, 8)
    y = net.op("Reshape", [y, net.init("s", np.array([1, 2, 32, 8]))])
    assert cosine_through_tflite(net.model([net.op("Relu", [y])]), tmp_path) > 0.999


def test_a_channel_split_and_a_transpose_match(tmp_path):
    net = Net()
    y = net.conv(net.input("x", X), 4, 8)
    a, b = net.op("Split", [y, net.init("sizes", np.array([3, 5]))], outputs=2, axis=1)
    out = net.op("Concat", [net.op("Relu", [b]), a], axis=1)
    out = net.op("Transpose", [out], perm=[0, 2, 1, 3])
    assert cosine_through_tflite(net.model([out]), tmp_path) > 0.999


def test_hard_swish_as_onnx_writes_it_and_a_division_by_a_constant_is_a_multiplication(tmp_path):
    net = Net()
    x = net.conv(net.input("x", X), 4, 4)
    clip = net.op("Clip", [net.op("Add", [x, net.init("three", np.array(3.0, np.float32))]),
                           net.init("lo", np.array(0.0, np.float32)), net.init("hi", np.array(6.0, np.float32))])
    y = net.op("Div", [net.op("Mul", [x, clip]), net.init("six", np.array(6.0, np.float32))])
    assert cosine_through_tflite(net.model([y]), tmp_path) > 0.999


def tiny_net() -> onnx.ModelProto:
    """Conv + Relu, depthwise conv + SiLU, pools, an add and a classifier: every kind that
    rounds."""
    net = Net()
    y = net.op("Relu", [net.conv(net.input("x", X), 4, 8)])
    z = net.conv(y, 8, 8, group=8)
    s = net.op("Mul", [z, net.op("Sigmoid", [z])])
    a = net.op("Add", [net.op("MaxPool", [s], kernel_shape=[2, 2], strides=[2, 2]),
                       net.op("AveragePool", [s], kernel_shape=[2, 2], strides=[2, 2])])
    f = net.op("Flatten", [net.op("GlobalAveragePool", [a])], axis=1)
    w = np.random.default_rng(1).standard_normal((3, 8)).astype(np.float32)
    return net.model([net.op("Gemm", [f, net.init("w", w), net.init("b", np.zeros(3, np.float32))],
                              transB=1)])


@pytest.mark.filterwarnings("ignore:.*tf.lite.Interpreter is deprecated")
def test_every_tensor_of_the_integer_graph_keeps_npubuilds_parameters(tmp_path):
    """The TFLite is npubuild's integer model: no tensor npubuild quantized is given other
    parameters (what a TFLite kernel fixes gets a tensor of its own and a QUANTIZE)."""
    import tensorflow as tf

    qgraph, path, result, _ = written(tiny_net(), tmp_path)
    details = {d["name"]: d for d in tf.lite.Interpreter(model_path=str(path)).get_tensor_details()}
    activations = [t for t in qgraph.tensors if t not in qgraph.constants]
    for name in activations:
        scale, zero = details[name]["quantization"]
        assert (np.float32(scale), zero) == (np.float32(qgraph.tensors[name].scale),
                                             qgraph.tensors[name].zero_point), name
    coverage = result.coverage()
    assert coverage["npubuild"] == len(activations)
    # SiLU's sigmoid at LOGISTIC's fixed 1/256, the average pool at its input's quantization
    # (the global one is a MEAN, which requantizes itself)
    assert sorted(coverage["tflite_constraints"].values()) == [
        "AVERAGE_POOL_2D keeps its input's quantization", "fixed by LOGISTIC (SiLU's sigmoid)"]
    assert coverage["requantizations"] == 1


def test_npubuilds_integer_reference_and_tflites_kernels_agree_within_the_stated_bound(tmp_path):
    qgraph, path, _, data = written(tiny_net(), tmp_path)
    figures = integer_agreement(qgraph, path, data[:2])
    kinds = figures["by_kind"]
    assert figures["tensors"] == len([t for t in qgraph.tensors if t not in qgraph.constants]) - 1
    # data movement agrees bit for bit; a conv's, an add's or a table's own rounding differs by
    # at most one step, an average pool's two roundings by two (README: Real chips)
    assert kinds["maxpool"]["layer_max_steps"] == kinds["reshape"]["layer_max_steps"] == 0
    assert max(kinds[k]["layer_max_steps"] for k in ("conv", "add", "lut SiLU")) <= 1
    assert kinds["avgpool"]["layer_max_steps"] <= 2


def _conv_net_quantized(**config):
    """``conv_net`` quantized per channel with ``config`` (`QuantConfig` fields)."""
    from npubuild.quant import calibrate
    from npubuild.quant.lower import lower
    from npubuild.quant.quantizer import QuantConfig, quantize_graph

    model = conv_net()
    fg, probe = lower(model)
    observer = calibrate.Observer(fg, probe, "minmax")
    for feed in feeds(model):
        observer.update(feed)
    return quantize_graph(fg, observer.stats, QuantConfig(granularity="per_channel", **config),
                          "g")[0]


def test_an_int16_tensor_is_refused_and_no_ethos_chip_offers_int16(tmp_path):
    """TFLite's 16x8 kernels need symmetric int16 in and out of each layer; npubuild's int16 is
    per tensor with the scheme's zero point, so the Ethos-U chips say int16: false (the
    precision search never chooses it there) and the writer refuses it by name."""
    from npubuild.targets import load_chip

    qgraph = _conv_net_quantized(scheme="asymmetric", int16_tensors=frozenset({"x"}))
    with pytest.raises(Unwritable, match="tensor 'x' is int16: .*symmetric"):
        write_tflite(qgraph)
    assert not any(load_chip(c).int16 for c in ("ethos-u55-256", "ethos-u65-256", "ethos-u85-256"))


@pytest.mark.parametrize("op", ["LeakyRelu", "PRelu"])
def test_a_leaky_relu_and_a_prelu_of_one_slope_are_leaky_relu(op, tmp_path):
    """Both are a rescale with one negative slope in npubuild's graph; TFLite's LEAKY_RELU."""
    net = Net()
    y = net.conv(net.input("x", X), 4, 8)
    if op == "LeakyRelu":
        y = net.op("LeakyRelu", [y], alpha=0.2)
    else:
        y = net.op("PRelu", [y, net.init("slope", np.float32([0.2]))])
    assert cosine_through_tflite(net.model([y]), tmp_path) > 0.999


def test_a_prelu_with_one_slope_per_channel_is_refused_naming_the_layer(tmp_path):
    net = Net()
    y = net.conv(net.input("x", X), 4, 8)
    y = net.op("PRelu", [y, net.init("slope", np.linspace(0.1, 0.3, 8, dtype=np.float32).reshape(8, 1, 1))])
    with pytest.raises(Unwritable, match="one slope per channel"):
        written(net.model([y]), tmp_path)


def test_int16_weights_are_refused_with_the_reason():
    """W16A16 layers have no TFLite form (its 16x8 kernels keep weights int8): refused by
    name, never truncated to int8."""
    from npubuild.backends.tflite_ops import conv

    qgraph = _conv_net_quantized(scheme="symmetric", int16_tensors=frozenset({"x"}),
                                 int16_weight_inputs=frozenset({"x"}))
    layer = next(la for la in qgraph.layers if la.inputs[0] == "x")
    assert layer.arrays["weight"].dtype == np.int16
    with pytest.raises(Unwritable, match=r"weights are int16 \(w16a16\).*keep weights int8"):
        conv(None, layer)
