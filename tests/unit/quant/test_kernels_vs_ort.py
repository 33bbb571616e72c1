"""Every layer kind on a tiny inline model: the integer reference must agree with ONNX Runtime
running the QDQ export (layer by layer, same integer inputs) and stay close to float."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from npubuild import onnx_io
from npubuild.quant import quantizer
from tests.unit.quant.helpers import check_against_ort, feeds_for, model, samples

rng = np.random.default_rng(42)
W3 = rng.normal(0, 0.3, (8, 4, 3, 3))
B8 = rng.normal(0, 0.2, 8)
X = {"x": [1, 4, 12, 10]}


def conv(**attrs):
    return model([helper.make_node("Conv", ["x", "w", "b"], ["y"], **attrs)], X, {"y": None},
                 {"w": W3, "b": B8})


def conv_act(act, *extra):
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node(act, ["c", *extra], ["y"])]
    inits = {"w": W3, "b": B8, "lo": np.float32(-0.5), "hi": np.float32(1.5)}
    return model(nodes, X, {"y": None}, inits)


def unary(op, **attrs):
    return model([helper.make_node(op, ["x"], ["y"], **attrs)], X, {"y": None})


def silu():
    return model([helper.make_node("Sigmoid", ["x"], ["s"]), helper.make_node("Mul", ["x", "s"], ["y"])],
                 X, {"y": None})


def binary(op, b_shape=None, const=None):
    inputs = dict(X) if const is not None else {**X, "z": b_shape}
    inits = {"z": const} if const is not None else {}
    return model([helper.make_node(op, ["x", "z"], ["y"])], inputs, {"y": None}, inits)


def relu_then(op, **attrs):
    """Average pools mostly follow a Relu: their window sums are then never negative (see the
    avgpool note in npubuild.quant.schemes about exact ties of negative sums in pow2 graphs)."""
    return model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node(op, ["r"], ["y"], **attrs)],
                 X, {"y": None})


def attention():
    """Self-attention's two MatMuls of activations: softmax(x·xᵀ / 4)·x per head."""
    nodes = [helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 1, 3, 2]),
             helper.make_node("MatMul", ["x", "xt"], ["s"]),
             helper.make_node("Mul", ["s", "k"], ["sk"]),
             helper.make_node("Softmax", ["sk"], ["a"], axis=-1),
             helper.make_node("MatMul", ["a", "x"], ["y"])]
    return model(nodes, X, {"y": None}, {"k": np.float32(0.25)})


def layer_norm(shape, axis=-1, bias=True):
    """LayerNormalization with a trained-looking Scale and B over the axes from ``axis``."""
    normalized = shape[axis:]
    inits = {"g": rng.normal(1, 0.3, normalized), "b": rng.normal(0, 0.2, normalized)}
    return model([helper.make_node("LayerNormalization", ["x", "g", "b"][:3 if bias else 2], ["y"],
                                   axis=axis, epsilon=1e-5)], {"x": shape}, {"y": None},
                 inits if bias else {"g": inits["g"]})


def two(op):
    return model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node(op, ["x", "r"], ["y"])],
                 X, {"y": None})


CASES = {
    "conv_pads": lambda: conv(pads=[1, 0, 2, 1]),
    "conv_stride_dilation": lambda: conv(strides=[2, 1], dilations=[1, 2], pads=[1, 2, 1, 2]),
    "conv_same_upper": lambda: conv(auto_pad="SAME_UPPER", strides=[2, 2]),
    "conv_grouped": lambda: model([helper.make_node("Conv", ["x", "w"], ["y"], group=2, pads=[1, 1, 1, 1])],
                                  X, {"y": None}, {"w": rng.normal(0, 0.3, (6, 2, 3, 3))}),
    "conv_depthwise": lambda: model([helper.make_node("Conv", ["x", "w", "b"], ["y"], group=4,
                                                      strides=[2, 2], pads=[1, 1, 1, 1])],
                                    X, {"y": None}, {"w": rng.normal(0, 0.3, (8, 1, 3, 3)), "b": B8}),
    "conv_relu": lambda: conv_act("Relu"),
    "conv_clip": lambda: conv_act("Clip", "lo", "hi"),
    "gemm": lambda: model([helper.make_node("Flatten", ["x"], ["f"]),
                           helper.make_node("Gemm", ["f", "w", "b"], ["y"], transB=1, alpha=0.5)],
                          X, {"y": None}, {"w": rng.normal(0, 0.1, (5, 480)), "b": rng.normal(0, 1, 5)}),
    "matmul_3d": lambda: model([helper.make_node("MatMul", ["x", "w"], ["y"])], X, {"y": None},
                               {"w": rng.normal(0, 0.3, (10, 6))}),
    "batchnorm": lambda: model([helper.make_node("BatchNormalization", ["x", "g", "be", "m", "v"], ["y"])],
                               X, {"y": None}, {"g": [1.0, 2.0, 0.5, -1.0], "be": [0.1, 0, -0.2, 0.3],
                                                "m": [0.5, 0, 0.1, -0.3], "v": [1.0, 4.0, 0.5, 2.0]}),
    "add": lambda: binary("Add", [1, 4, 12, 10]),
    "sub_broadcast": lambda: binary("Sub", [1, 4, 1, 1]),
    "add_const": lambda: binary("Add", const=rng.normal(0, 2, (1, 4, 1, 10))),
    "mul": lambda: binary("Mul", [1, 4, 12, 10]),
    "mul_scalar": lambda: binary("Mul", const=np.float32(0.375)),
    "div_scalar": lambda: binary("Div", const=np.float32(3.0)),
    "div_tensor": lambda: binary("Div", const=rng.uniform(1, 4, (1, 4, 1, 1))),
    "add_relu": lambda: model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["x", "r"], ["a"]),
                               helper.make_node("Relu", ["a"], ["y"])], X, {"y": None}),
    "mul_two_inputs": lambda: two("Mul"),
    "matmul_two_inputs": lambda: model([helper.make_node("Transpose", ["x"], ["xt"], perm=[0, 1, 3, 2]),
                                        helper.make_node("MatMul", ["xt", "x"], ["y"])], X, {"y": None}),
    "matmul_broadcast": lambda: model([helper.make_node("MatMul", ["x", "z"], ["y"])],
                                      {**X, "z": [1, 1, 10, 7]}, {"y": None}),
    "attention": attention,
    "layer_norm_last_axis": lambda: layer_norm([1, 12, 32]),
    "layer_norm_two_axes": lambda: layer_norm([1, 4, 6, 10], axis=-2),
    "layer_norm_no_bias": lambda: layer_norm([2, 16], bias=False),
    "pow_cube": lambda: binary("Pow", const=np.float32(3.0)),
    "concat": lambda: model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Sigmoid", ["x"], ["s"]),
                             helper.make_node("Concat", ["x", "r", "s"], ["y"], axis=1)], X, {"y": None}),
    "maxpool": lambda: model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                               pads=[1, 1, 1, 1])], X, {"y": None}),
    "maxpool_ceil": lambda: model([helper.make_node("MaxPool", ["x"], ["y"], kernel_shape=[3, 3], strides=[2, 2],
                                                    ceil_mode=1)], X, {"y": None}),
    "avgpool": lambda: relu_then("AveragePool", kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1]),
    "avgpool_include_pad": lambda: relu_then("AveragePool", kernel_shape=[2, 3], pads=[1, 1, 1, 1],
                                             count_include_pad=1),
    "global_avgpool": lambda: unary("GlobalAveragePool"),
    "global_maxpool": lambda: unary("GlobalMaxPool"),
    "reduce_mean_spatial": lambda: unary("ReduceMean", axes=[2, 3], keepdims=1),
    "reduce_mean_spatial_axes_input": lambda: model(
        [helper.make_node("ReduceMean", ["x", "ax"], ["y"])], X, {"y": None},
        {"ax": np.array([-1, -2], np.int64)}, opset=18),
    "resize_nearest": lambda: model([helper.make_node("Resize", ["x", "", "s"], ["y"], mode="nearest")],
                                    X, {"y": None}, {"s": np.array([1, 1, 2, 2], np.float32)}),
    "resize_linear": lambda: model([helper.make_node("Resize", ["x", "", "s"], ["y"], mode="linear")],
                                   X, {"y": None}, {"s": np.array([1, 1, 2, 2], np.float32)}),
    "sigmoid": lambda: unary("Sigmoid"),
    "tanh": lambda: unary("Tanh"),
    "leaky_relu": lambda: unary("LeakyRelu", alpha=0.1),
    "hardsigmoid": lambda: unary("HardSigmoid"),
    "hardswish": lambda: unary("HardSwish"),
    "prelu_one_slope": lambda: binary("PRelu", const=np.float32([0.25])),
    "prelu_per_channel": lambda: binary("PRelu", const=rng.uniform(-0.6, 0.6, (4, 1, 1))),
    "prelu_per_column": lambda: binary("PRelu", const=rng.uniform(-0.6, 0.6, (10,))),
    "max_scalar": lambda: binary("Max", const=np.float32([[[[-0.4]]]])),
    "min_scalar_first": lambda: model([helper.make_node("Min", ["z", "x"], ["y"])], X, {"y": None},
                                      {"z": np.float32(0.7)}),
    "silu_pattern": silu,
    "relu_alone": lambda: unary("Relu"),
    "transpose": lambda: unary("Transpose", perm=[0, 2, 3, 1]),
    "depth_to_space_crd": lambda: unary("DepthToSpace", blocksize=2, mode="CRD"),
    "depth_to_space_dcr": lambda: unary("DepthToSpace", blocksize=2, mode="DCR"),
    "reshape": lambda: model([helper.make_node("Reshape", ["x", "s"], ["y"])], X, {"y": None},
                             {"s": np.array([1, 4, 120], np.int64)}),
    "slice_split": lambda: model([helper.make_node("Slice", ["x", "st", "en", "ax", "sp"], ["a"]),
                                  helper.make_node("Split", ["a"], ["y", "z"], axis=1, num_outputs=2)],
                                 X, {"y": None, "z": None},
                                 {"st": np.array([11, 1], np.int64), "en": np.array([-100, 9], np.int64),
                                  "ax": np.array([2, 3], np.int64), "sp": np.array([-2, 3], np.int64)}, opset=18),
    "pad": lambda: model([helper.make_node("Pad", ["x", "p"], ["y"])], X, {"y": None},
                         {"p": np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)}),
    "lrn_alexnet": lambda: relu_then("LRN", size=5, alpha=1e-4, beta=0.75, bias=1.0),
    "lrn_signed": lambda: unary("LRN", size=3, alpha=0.02, beta=0.5, bias=2.0),
    "softmax_channels": lambda: unary("Softmax", axis=1),
    "softmax_last_axis": lambda: unary("Softmax", axis=-1),
    "softmax_dfl_bins": lambda: model([helper.make_node("Softmax", ["x"], ["y"], axis=1)],
                                      {"x": [1, 16, 4, 30]}, {"y": None}),
}
SCHEMES = ["pow2_symmetric", "symmetric", "asymmetric"]


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_matches_onnxruntime(case, scheme):
    m = CASES[case]()
    qg, cc, cos = check_against_ort(m, feeds_for(m), scheme=scheme)
    assert cc.elements > 0 or all(layer.device == "cpu" for layer in qg.layers)
    assert cc.ok, cc.summary()
    assert cc.max_lsb <= 1
    assert cos > (0.97 if scheme == "pow2_symmetric" else 0.99), (case, cos)


def test_a_mean_over_h_and_w_is_an_integer_global_average_pool():
    """Paddle's squeeze-excite means (ReduceMean over H and W, dimensions kept) ran in float
    on the CPU ("no integer kernel"): PP-OCRv6's detector left the NPU 5 times for them. A
    mean over the channels, or one that drops its dimensions, still does."""
    for case in ("reduce_mean_spatial", "reduce_mean_spatial_axes_input"):
        qg, _, _ = check_against_ort(CASES[case](), samples(X))
        assert [(layer.kind, layer.device) for layer in qg.layers] == [("avgpool", "npu")], case
    for attrs in ({"axes": [1], "keepdims": 1}, {"axes": [2, 3], "keepdims": 0}):
        qg, _, _ = check_against_ort(unary("ReduceMean", **attrs), samples(X))
        assert [layer.device for layer in qg.layers] == ["cpu"], attrs


def test_depth_to_space_is_an_integer_data_movement_layer():
    """A pixel shuffle ran in float on the CPU ("no integer kernel"): it moves integers only,
    so it keeps its input's scale and zero point, in both modes (they place channels apart)."""
    for mode in ("CRD", "DCR"):
        qg, cc, _ = check_against_ort(unary("DepthToSpace", blocksize=2, mode=mode), samples(X))
        assert [(layer.kind, layer.device) for layer in qg.layers] == [("depth_to_space", "npu")]
        x, y = qg.tensors["x"], qg.tensors["y"]
        assert (x.scale, x.zero_point, y.shape) == (y.scale, y.zero_point, [1, 1, 24, 20])
        assert cc.ok and cc.max_lsb == 0, cc.summary()


def test_folded_activations_and_patterns_make_one_layer():
    for build, kind in [(lambda: conv_act("Relu"), "conv"), (silu, "lut"),
                        (lambda: conv_act("Clip", "lo", "hi"), "conv")]:
        qg, _, _ = check_against_ort(build(), samples(X), scheme="symmetric")
        assert [layer.kind for layer in qg.layers] == [kind]


@pytest.mark.parametrize("scheme", ["symmetric", "asymmetric"])
def test_attention_matmuls_of_two_activations_are_integer_layers(scheme):
    """Q·Kᵀ and weights·V ran in float on the CPU ("MatMul needs a constant 2-D right
    operand"), so a transformer's attention left the NPU twice per layer; the 1/√d scale
    after Q·Kᵀ folds into its requantization."""
    qg, cc, cos = check_against_ort(attention(), samples(X), scheme=scheme)
    kinds = [(layer.kind, layer.device) for layer in qg.layers]
    assert kinds == [("transpose", "npu"), ("matmul", "npu"), ("softmax", "npu"), ("matmul", "npu")]
    assert qg.layers[1].attrs["factor"] == 0.25
    assert cc.ok and cc.max_lsb <= 1 and cos > 0.99


def test_layer_normalization_is_one_integer_layer_and_gelus_cube_a_table():
    """LayerNormalization and Pow ran in float on the CPU ("no integer kernel"), so every
    transformer block left the NPU for its norms and its tanh-form GELU."""
    qg, _, _ = check_against_ort(layer_norm([1, 12, 32]), samples({"x": [1, 12, 32]}))
    assert [(layer.kind, layer.device) for layer in qg.layers] == [("layernorm", "npu")]
    qg, _, _ = check_against_ort(binary("Pow", const=np.float32(3.0)), samples(X))
    assert [(layer.kind, layer.device) for layer in qg.layers] == [("lut", "npu")]
    root = model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Pow", ["r", "e"], ["y"])],
                 X, {"y": None}, {"e": np.float32(1.5)})
    qg, _, _ = check_against_ort(root, samples(X))
    assert [layer.kind for layer in qg.layers] == ["lut", "float"]
    assert "whole exponents" in qg.layers[1].attrs["reason"]


def test_an_op_without_an_integer_kernel_stays_float_with_a_reason():
    qg, cc, _ = check_against_ort(unary("LogSoftmax", axis=1), samples(X))
    (layer,) = qg.layers
    assert layer.device == "cpu" and "LogSoftmax" in layer.attrs["reason"]
    assert qg.tensors["y"].dtype == "float32"  # only the CPU touches it


@pytest.mark.parametrize("case", ["max_scalar", "min_scalar_first"])
def test_max_or_min_with_a_constant_is_one_integer_table(case):
    """TensorFlow's tf.maximum(x, -0.4) after each LeakyReLU (openWakeWord's embedding model)
    ran on the CPU between every pair of NPU segments."""
    qg, cc, _ = check_against_ort(CASES[case](), samples(X))
    (layer,) = qg.layers
    assert (layer.kind, layer.device) == ("lut", "npu") and cc.ok and cc.max_lsb <= 1


def test_max_of_two_tensors_stays_float_and_says_why():
    qg, cc, _ = check_against_ort(two("Max"), samples(X))
    (relu, layer) = qg.layers
    assert layer.device == "cpu" and "2 tensor operands" in layer.attrs["reason"]
    assert cc.ok


@pytest.mark.parametrize("scheme", ["symmetric", "asymmetric"])
@pytest.mark.parametrize("length", [8, 1000])
def test_an_int16_softmax_input_runs_on_the_npu_and_matches_onnxruntime(scheme, length):
    """An int16 input (the precision search keeps attention scores in int16) ran in float on
    the CPU: "an integer softmax reads int8", so PP-OCRv4 rec's three attention softmaxes left
    the NPU (0.13 of its 0.33 ms). Its exp table ends at the first step whose exp rounds to 0
    (the kernel clamps farther steps there) instead of holding 65,536 entries."""
    shape = {"x": [1, 4, length]}
    m = model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], shape, {"y": None})
    feeds = [{"x": (rng.normal(size=shape["x"]) * 6).astype(np.float32)} for _ in range(3)]
    qg, cc, cos = check_against_ort(m, feeds, scheme=scheme, int16_tensors=["x"])
    (layer,) = qg.layers
    assert (layer.kind, layer.device) == ("softmax", "npu") and qg.tensors["x"].dtype == "int16"
    table = layer.arrays["exp_table"]
    assert table[-1] == 0 and np.all(table[:-1] > 0) and len(table) < 2 ** 16
    assert cc.elements > 0 and cc.ok and cc.max_lsb <= 1, cc.summary()
    assert cos > 0.999  # the output stays int8


def test_seed_004_int8_bias_with_shift():
    """pow2 + bias int8_shift: the bias is int8 at bias_log2scale, shifted left by bias_shift
    into the accumulator (seed 004); the kernel sees the same int32 either way."""
    m = conv(pads=[1, 1, 1, 1])
    qg, cc, cos = check_against_ort(m, feeds_for(m), scheme="pow2_symmetric", bias="int8_shift")
    (layer,) = qg.layers
    p = layer.params
    b8, shift = np.array(p["bias_int8"]), np.array(p["bias_shift"])
    assert np.all(shift >= 0) and b8.dtype.kind == "i" and np.abs(b8).max() <= 128
    assert np.array_equal(layer.arrays["bias"], b8 << shift)
    assert np.all(shift == np.array(p["input_log2scale"]) + np.array(p["weight_log2scale"]) - p["bias_log2scale"])
    assert cc.ok and cos > 0.97


def test_pow2_conv_fields_follow_seed_004():
    m = conv(pads=[1, 1, 1, 1])
    qg, _, _ = check_against_ort(m, feeds_for(m), scheme="pow2_symmetric", granularity="per_tensor")
    p = qg.layers[0].params
    assert p["output_shift"] == [p["input_log2scale"] + w - p["output_log2scale"] for w in p["weight_log2scale"]]
    assert list(qg.layers[0].arrays["multiplier"]) == [1] * 8  # pure shifts


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("slope", [(4, 1, 1), (1,)], ids=["per_channel", "one_slope"])
def test_an_int16_prelu_runs_on_the_npu_without_a_table_and_matches_onnxruntime(scheme, slope):
    """PRelu is piecewise linear: a multiplier and shift per side (per channel on the negative
    side) take an int16 input where a table per channel (65,536 entries each) would not fit
    LMEM, and the layer ran in float on the CPU (MediaPipe's face landmark: 23 of them)."""
    m = binary("PRelu", const=rng.uniform(-0.6, 0.6, slope).astype(np.float32))
    qg, cc, cos = check_against_ort(m, feeds_for(m), scheme=scheme, int16_tensors=["x", "y"])
    (layer,) = qg.layers
    assert layer.kind == "rescale" and layer.device == "npu" and "table" not in layer.arrays
    assert qg.tensors["x"].dtype == "int16"
    assert layer.arrays["negative_multiplier"].shape == (slope[0],)
    assert cc.elements > 0 and cc.ok and cc.max_lsb <= 1, cc.summary()
    assert cos > 0.9999


def test_a_long_confident_softmax_row_with_an_int16_output_matches_onnxruntime():
    """Rows of one or two peaks and a long flat tail whose exp is 0.49 unit of a 24-bit exp
    table: every tail entry rounds the same way, so the row's sum drifts by ``length / 2``
    table units, which an int16 output (65,535 steps per unit probability) sees as several
    steps at the peaks (PP-OCRv5's 18,385-class recogniser: 10 steps). The table's fraction
    bits follow the row length and the output scale instead."""
    length, peak = 8192, 8.0
    tail = peak - np.log(2.0 ** 24 / 0.49)  # exp(tail - peak) · 2^24 = 0.49: rounds to 0
    x = np.full((1, 4, length), tail, np.float32)
    x[0, :, 0] = peak
    x[0, 1:, 1] = peak  # rows 1-3: two peaks of ~0.5 each, off the clamp
    m = model([helper.make_node("Softmax", ["x"], ["y"], axis=-1)], {"x": [1, 4, length]}, {"y": None})
    qg, cc, cos = check_against_ort(m, [{"x": x}], scheme="asymmetric", int16_tensors=["y"])
    (layer,) = qg.layers
    assert layer.device == "npu" and qg.tensors["y"].dtype == "int16"
    assert cc.max_lsb <= 1 and cc.ok, cc.summary()
    assert cos > 0.9999


@pytest.mark.parametrize("length", [2, 16, 1000, 6625, 18385, 2 ** 18])
@pytest.mark.parametrize("levels", [255.0, 256.0, 32767.0, 65535.0, 65535.297, 65536.0, 65541.0])
def test_the_integer_softmax_constants_keep_int64_and_the_guard_bits(length, levels):
    """``(2·e·multiplier + den) // (2·den)`` for the largest ``e`` (2^exp_bits) and ``den``
    (every ``e`` at 2^exp_bits) stays in int64, for scales just under a power of two too
    (PP-OCRv5's 1/65535.297, where a multiplier one bit wider wrapped to 44,025 steps off);
    the table's summed rounding and the multiplier's stay under 2^-5 output step."""
    arithmetic = quantizer.softmax_arithmetic(length, 1.0 / levels)
    if arithmetic is None:  # runs in float: only rows far longer than any model's
        assert length * levels > 2 ** 32
        return
    top = 1 << arithmetic.exp_bits
    den = (length * top) << arithmetic.shift
    assert 2 * top * arithmetic.multiplier + den < 2 ** 63 and 2 * den < 2 ** 63
    assert length * levels / 2 ** (arithmetic.exp_bits + 1) <= 2 ** -quantizer.SOFTMAX_GUARD_BITS
    assert abs(arithmetic.multiplier / 2 ** arithmetic.shift - levels) * 2 ** quantizer.SOFTMAX_GUARD_BITS <= 1


def outlier_weights(shape, seed=7):
    """Weights whose every output channel has one large outlier beside small weights: int8's
    step (the outlier over 127) rounds the small ones to a few levels or to zero."""
    w = np.random.default_rng(seed).normal(0, 0.01, shape)
    flat = w.reshape(shape[0], -1)
    flat[:, 0] = 3.0
    return flat.reshape(shape).astype(np.float32)


W16_CASES = {
    "conv3x3": lambda: model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
                             X, {"y": None}, {"w": outlier_weights((8, 4, 3, 3)), "b": B8 * 40}),
    "depthwise": lambda: model([helper.make_node("Conv", ["x", "w", "b"], ["y"], group=4,
                                                 pads=[1, 1, 1, 1])],
                               X, {"y": None}, {"w": outlier_weights((4, 1, 3, 3)), "b": B8[:4]}),
    "gemm": lambda: model([helper.make_node("Gemm", ["x", "w", "b"], ["y"], transB=1)],
                          {"x": [2, 48]}, {"y": None},
                          {"w": outlier_weights((16, 48)), "b": rng.normal(0, 5, 16)}),
    "matmul_const": lambda: model([helper.make_node("MatMul", ["x", "w"], ["y"])],
                                  {"x": [1, 6, 48]}, {"y": None},
                                  {"w": outlier_weights((16, 48)).T.copy()}),
}


@pytest.mark.parametrize("scheme", SCHEMES)
@pytest.mark.parametrize("case", sorted(W16_CASES))
def test_int16_weights_match_onnxruntime_and_beat_int8_weights(case, scheme):
    """W16A16 (`w16a16` on a layer's input): int16 weights, an int64 bias and an int16 input
    and output; the integer reference agrees with ONNX Runtime on the QDQ export (int16
    DequantizeLinear at opset 21) to one step, and the small weights int8 loses come back."""
    m = W16_CASES[case]()
    feeds = feeds_for(m)
    out = next(o.name for o in m.graph.output)
    qg16, cc, cos16 = check_against_ort(m, feeds, scheme=scheme, int16_tensors=["x", out],
                                        int16_weight_inputs=["x"])
    layer = next(la for la in qg16.layers if la.kind == "conv")
    assert layer.arrays["weight"].dtype == np.int16 and layer.arrays["bias"].dtype == np.int64
    assert cc.elements > 0 and cc.ok and cc.max_lsb <= 1, cc.summary()
    _, _, cos8 = check_against_ort(m, feeds, scheme=scheme, int16_tensors=["x", out])
    assert cos16 > 0.99999 and 1 - cos16 < 0.1 * (1 - cos8), (cos8, cos16)


def test_local_response_normalization_is_one_integer_layer():
    """AlexNet's, ZFNet's and GoogLeNet's LRNs ran in float on the CPU ("op LRN is not
    supported"), two hand-overs of their largest feature maps each."""
    qg, cc, _ = check_against_ort(relu_then("LRN", size=5, alpha=1e-4, beta=0.75), samples(X))
    assert [(layer.kind, layer.device) for layer in qg.layers][-1] == ("lrn", "npu")
    assert cc.ok and cc.max_lsb <= 1, cc.summary()


def rms_norm(shape, divide, axis=-1, square="Pow", gain=None):
    """T5's RMS norm as PyTorch exports it: ``x · (1 / Sqrt(mean(x²) + eps)) · g``, the
    reciprocal written ``Div(1, s)`` (``divide="Div"``), ``Reciprocal(s)``, or ``x`` divided
    by the root (``divide="Over"``); ``square="Mul"`` writes x² as ``x · x``; the mean over
    ``axis`` (not the last: not an RMS norm, its primitives stay); ``gain`` False: no scale."""
    inverse = {"Div": [helper.make_node("Div", ["one", "s"], ["r"])],
               "Reciprocal": [helper.make_node("Reciprocal", ["s"], ["r"])], "Over": []}[divide]
    normed = (helper.make_node("Div", ["x", "s"], ["n"]) if divide == "Over" else
              helper.make_node("Mul", ["x", "r"], ["n"]))
    nodes = [helper.make_node("Pow", ["x", "two"], ["p"]) if square == "Pow" else
             helper.make_node("Mul", ["x", "x"], ["p"]),
             helper.make_node("ReduceMean", ["p"], ["m"], axes=[axis], keepdims=1),  # opset 17
             helper.make_node("Add", ["m", "eps"], ["v"]),
             helper.make_node("Sqrt", ["v"], ["s"]), *inverse, normed]
    inits = {"two": np.float32(2.0), "eps": np.float32(1e-6), "one": np.float32(1.0)}
    if gain is not False:
        nodes.append(helper.make_node("Mul", ["g", "n"], ["y"]))
        inits["g"] = rng.normal(1, 0.3, shape[-1:]) if gain is None else gain
    else:
        nodes[-1].output[0] = "y"
    return model(nodes, {"x": shape}, {"y": None},
                 {k: v for k, v in inits.items() if any(k in n.input for n in nodes)})


@pytest.mark.parametrize("divide", ["Div", "Reciprocal"])
def test_a_reciprocal_of_a_tensor_is_one_integer_table(divide):
    """T5's RMS norms (traceforge's flan-t5-small titler) divide a constant 1 by the root
    mean square: "division by a tensor that is not constant" kept each Div on the CPU, 17
    round trips between 18 NPU segments in the encoder. A constant over one tensor is a
    function of that tensor alone: a lookup table, as the chip table's Div note says. (Import
    writes the whole norm as one RMSNormalization, below; these are its primitives.)"""
    shape = [1, 12, 32]
    qg, cc, cos = check_against_ort(rms_norm(shape, divide), samples({"x": shape}))
    (table,) = [layer for layer in qg.layers if layer.attrs.get("function") == divide]
    assert (table.kind, table.device) == ("lut", "npu")
    assert cc.ok and cc.max_lsb <= 1 and cos > 0.99


def outlier_rows(shape, value=300.0, channels=(5, 17, 40)):
    """Samples like T5's residual stream: rows of magnitudes 0.5 to 4, and in three of them a
    few channels 300 times larger, so x² and its row means span six decades."""
    out = samples({"x": shape}, low=-1.0, high=1.0)
    for feed in out:
        feed["x"][0] *= np.resize(np.float32([0.5, 1, 2, 4]), shape[1])[:, None]
        for row in range(3):
            feed["x"][0, row, list(channels)] *= value
    return out


def as_one_op(graph):
    """``graph`` as import writes it: its RMS norm in primitives as one RMSNormalization."""
    from npubuild.frontends.onnx import rms_norms_as_op

    op, kept = rms_norms_as_op(graph)
    assert kept is None
    return op


@pytest.mark.parametrize("square", ["Pow", "Mul"])
@pytest.mark.parametrize("divide", ["Div", "Reciprocal", "Over"])
def test_an_rms_norm_in_primitives_is_one_rms_normalization_and_one_integer_layer(divide, square):
    """T5's layer norm is an RMS norm in primitives: x² (3.5e10 in the encoder's block 7) and
    its row means (0..1.1e8) were each quantized per tensor, so the rows of ordinary
    magnitude read a mean of 0 and the encoder verified at cosine 0.057. Import writes it as
    one RMSNormalization (opset 23; the same values as ONNX Runtime's float primitives), which
    is one ``layernorm`` layer with ``rms``: the squares summed exactly in integers."""
    shape = [1, 12, 64]
    gain = rng.normal(1, 0.3, shape[-1:]).astype(np.float32)
    gain[[5, 17, 40]] = 0.02  # T5's outlier channels carry small weights
    graph = rms_norm(shape, divide, square=square, gain=gain)
    op = as_one_op(graph)
    assert [n.op_type for n in op.graph.node] == ["RMSNormalization"]
    assert onnx_io.opset_of(op) == 23
    feeds = outlier_rows(shape)
    for feed in feeds:
        want, got = (onnx_io.run(onnx_io.session(m), feed)["y"] for m in (graph, op))
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    qg, cc, cos = check_against_ort(op, feeds, int16_tensors=frozenset({"x"}))
    assert [(layer.kind, layer.device) for layer in qg.layers] == [("layernorm", "npu")]
    assert qg.layers[0].attrs["rms"]
    assert cc.ok and cc.max_lsb <= 1, cc.summary()
    assert cos > 0.999


def test_rms_norm_primitives_miss_where_the_one_layer_passes():
    """The seven primitives of the same norm, the input int16 too, quantize x² and its mean:
    0.892 (0.899 with every tensor int16) where the one layer above reads 0.9998."""
    shape = [1, 12, 64]
    _, _, cos = check_against_ort(rms_norm(shape, "Div"), outlier_rows(shape),
                                  int16_tensors=frozenset({"x"}))
    assert cos < 0.95


def test_an_rms_norm_without_a_scale_and_its_near_misses():
    """No scale: one op all the same (a scale of ones). A mean over an axis that is not the
    last, or a square that also feeds another node, is not an RMS norm of the rows: the
    primitives stay."""
    shape = [1, 12, 32]
    op = as_one_op(rms_norm(shape, "Div", gain=False))
    assert [n.op_type for n in op.graph.node] == ["RMSNormalization"]
    qg, cc, cos = check_against_ort(op, samples({"x": shape}))
    assert [layer.kind for layer in qg.layers] == ["layernorm"] and cos > 0.99
    across = rms_norm(shape, "Div", axis=1)
    assert as_one_op(across) is across
    shared = rms_norm(shape, "Div")
    shared.graph.node.append(helper.make_node("Add", ["p", "y"], ["z"]))
    shared.graph.output.append(helper.make_tensor_value_info("z", 1, None))
    assert "RMSNormalization" not in [n.op_type for n in as_one_op(shared).graph.node]
