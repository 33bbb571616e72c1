"""`npubuild.frontends.dequantize`: a QDQ model (as tf2onnx writes a full-integer TFLite model)
becomes the float model it quantizes, exactly where that is possible, and is left alone, with
the reason, where it is not."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild import onnx_io
from npubuild.frontends import dequantize

X_SHAPE = [1, 2, 4, 4]


def _qdq_model(*, zero_point: int = -128, reshape_between: bool = False,
               dq_scale: float = 0.05, extra_user: str | None = None) -> onnx.ModelProto:
    """x → Q → [Reshape → Reshape back] → DQ → Conv (int8 per-channel weights, int32 bias behind
    DequantizeLinear) → Q → DQ → y."""
    rng = np.random.default_rng(0)
    w_q = rng.integers(-127, 128, (3, 2, 1, 1)).astype(np.int8)
    inits = [
        numpy_helper.from_array(np.array(0.05, np.float32), "s_x"),
        numpy_helper.from_array(np.array(zero_point, np.int8), "z_x"),
        numpy_helper.from_array(np.array(dq_scale, np.float32), "s_x_read"),
        numpy_helper.from_array(w_q, "w_q"),
        numpy_helper.from_array(np.array([0.01, 0.02, 0.03], np.float32), "s_w"),
        numpy_helper.from_array(np.zeros(3, np.int8), "z_w"),
        numpy_helper.from_array(np.array([100, -50, 7], np.int32), "b_q"),
        numpy_helper.from_array(np.array([0.0005, 0.001, 0.0015], np.float32), "s_b"),
        numpy_helper.from_array(np.zeros(3, np.int32), "z_b"),
        numpy_helper.from_array(np.array(0.1, np.float32), "s_y"),
        numpy_helper.from_array(np.array(3, np.int8), "z_y"),
        numpy_helper.from_array(np.array([1, 32], np.int64), "flat"),
        numpy_helper.from_array(np.array(X_SHAPE, np.int64), "back"),
    ]
    nodes = [helper.make_node("QuantizeLinear", ["x", "s_x", "z_x"], ["x_q"], name="q_x")]
    integers = "x_q"
    if reshape_between:
        nodes += [helper.make_node("Reshape", ["x_q", "flat"], ["x_flat"], name="flat"),
                  helper.make_node("Reshape", ["x_flat", "back"], ["x_back"], name="back")]
        integers = "x_back"
    nodes += [
        helper.make_node("DequantizeLinear", [integers, "s_x_read", "z_x"], ["x_dq"], name="dq_x"),
        helper.make_node("DequantizeLinear", ["w_q", "s_w", "z_w"], ["w"], name="dq_w", axis=0),
        helper.make_node("DequantizeLinear", ["b_q", "s_b", "z_b"], ["b"], name="dq_b", axis=0),
        helper.make_node("Conv", ["x_dq", "w", "b"], ["conv"], name="conv"),
        helper.make_node("QuantizeLinear", ["conv", "s_y", "z_y"], ["y_q"], name="q_y"),
        helper.make_node("DequantizeLinear", ["y_q", "s_y", "z_y"], ["y"], name="dq_y"),
    ]
    if extra_user:
        nodes.append(helper.make_node(extra_user, ["x_q"], ["odd"], name="odd"))
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 4, 4])]
    if extra_user:
        outputs.append(helper.make_tensor_value_info("odd", TensorProto.INT8, None))
    graph = helper.make_graph(nodes, "qdq", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, X_SHAPE)], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=onnx_io.MAX_ORT_IR_VERSION)


def _float_reference(x: np.ndarray, model: onnx.ModelProto, relu: bool) -> np.ndarray:
    """What the float model must compute: the Conv on x (clamped at 0 when the input pair's
    range starts there), with the dequantized weights and bias."""
    inits = {t.name: numpy_helper.to_array(t) for t in model.graph.initializer}
    w = inits["w_q"].astype(np.float32) * inits["s_w"].reshape(3, 1, 1, 1)
    b = inits["b_q"].astype(np.float32) * inits["s_b"]
    x = np.maximum(x, 0) if relu else x
    return np.einsum("oi,bihw->bohw", w[:, :, 0, 0], x) + b.reshape(1, 3, 1, 1)


@pytest.mark.parametrize("reshape_between", [False, True])
def test_pairs_and_constant_dequantizes_are_removed_and_the_float_model_is_exact(reshape_between):
    model = _qdq_model(reshape_between=reshape_between)
    result = dequantize.to_float(model)
    assert not result.kept
    ops = [n.op_type for n in result.model.graph.node]
    assert "QuantizeLinear" not in ops and "DequantizeLinear" not in ops
    assert (result.pairs, result.constants) == (2, 2)
    onnx.checker.check_model(result.model, full_check=True)
    assert [o.name for o in result.model.graph.output] == ["y"]  # the output keeps its name
    x = np.random.default_rng(1).standard_normal(X_SHAPE).astype(np.float32)
    (y,) = onnx_io.run(result.model, {"x": x}).values()
    np.testing.assert_allclose(y, _float_reference(x, model, relu=True), rtol=1e-5, atol=1e-5)


def test_a_range_that_starts_at_zero_keeps_its_clamp_as_a_relu():
    clamped = dequantize.to_float(_qdq_model(zero_point=-128))
    free = dequantize.to_float(_qdq_model(zero_point=0))
    assert [n.op_type for n in clamped.model.graph.node].count("Relu") == 1
    assert "Relu" not in [n.op_type for n in free.model.graph.node]
    x = -np.ones(X_SHAPE, np.float32)
    (y,) = onnx_io.run(free.model, {"x": x}).values()
    np.testing.assert_allclose(y, _float_reference(x, _qdq_model(zero_point=0), relu=False),
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("kwargs, reason", [
    ({"dq_scale": 0.07}, "DequantizeLinear 'dq_x' reads 'x_q' with another scale"),
    ({"extra_user": "Cast"}, "Cast 'odd' computes on the integers of 'x_q'"),
])
def test_a_pair_that_cannot_be_removed_exactly_leaves_the_model_quantized(kwargs, reason):
    model = _qdq_model(**kwargs)
    result = dequantize.to_float(model)
    assert result.kept == reason
    assert result.model is model
    assert result.summary() == {"kept_quantized": reason}


def test_models_that_quantize_tensors_or_keep_weights_quantized_count_as_quantized():
    assert dequantize.is_quantized(_qdq_model())
    assert not dequantize.is_quantized(dequantize.to_float(_qdq_model()).model)
    assert dequantize.is_quantized(_weights_only_model())


def _weights_only_model() -> onnx.ModelProto:
    """Float activations, int8 weights behind a DequantizeLinear (weight-only quantization)."""
    w_q = np.random.default_rng(0).integers(-127, 128, (3, 2, 1, 1)).astype(np.int8)
    inits = [numpy_helper.from_array(w_q, "w_q"),
             numpy_helper.from_array(np.array([0.01, 0.02, 0.03], np.float32), "s_w")]
    nodes = [helper.make_node("DequantizeLinear", ["w_q", "s_w"], ["w"], name="dq_w", axis=0),
             helper.make_node("Conv", ["x", "w"], ["y"], name="conv")]
    graph = helper.make_graph(nodes, "weights_only", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, X_SHAPE)], [helper.make_tensor_value_info(
            "y", TensorProto.FLOAT, [1, 3, 4, 4])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=onnx_io.MAX_ORT_IR_VERSION)


def test_a_weight_only_quantized_model_becomes_its_float_model_exactly():
    model = _weights_only_model()
    result = dequantize.to_float(model)
    assert [n.op_type for n in result.model.graph.node] == ["Conv"] and result.constants == 1
    x = np.random.default_rng(1).standard_normal(X_SHAPE).astype(np.float32)
    np.testing.assert_array_equal(onnx_io.run(result.model, {"x": x})["y"],
                                  onnx_io.run(model, {"x": x})["y"])


def test_a_concat_of_integers_with_one_scale_is_moved_as_floats():
    """DenseNet's concatenations: tf2onnx joins the int8 tensors themselves (one scale), and
    the pair's integers may be any input of the Concat, not only the first."""
    inits = [numpy_helper.from_array(np.array(0.05, np.float32), "s"),
             numpy_helper.from_array(np.array(0, np.int8), "z")]
    nodes = [helper.make_node("QuantizeLinear", ["a", "s", "z"], ["a_q"], name="qa"),
             helper.make_node("QuantizeLinear", ["b", "s", "z"], ["b_q"], name="qb"),
             helper.make_node("Concat", ["b_q", "a_q"], ["ab_q"], name="join", axis=1),
             helper.make_node("DequantizeLinear", ["ab_q", "s", "z"], ["ab"], name="dq")]
    value = [1, 2, 2, 2]
    graph = helper.make_graph(nodes, "concat", [
        helper.make_tensor_value_info("a", TensorProto.FLOAT, value),
        helper.make_tensor_value_info("b", TensorProto.FLOAT, value)],
        [helper.make_tensor_value_info("ab", TensorProto.FLOAT, [1, 4, 2, 2])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                              ir_version=onnx_io.MAX_ORT_IR_VERSION)
    result = dequantize.to_float(model)
    assert not result.kept and [n.op_type for n in result.model.graph.node] == ["Concat"]
    a, b = np.full(value, 1.5, np.float32), np.full(value, -2.0, np.float32)
    (ab,) = onnx_io.run(result.model, {"a": a, "b": b}).values()
    np.testing.assert_array_equal(ab, np.concatenate([b, a], axis=1))


def test_integer_model_inputs_and_outputs_keep_their_boundary_nodes():
    """A full-int8 TFLite with int8 input and output (``inference_input_type=tf.int8``): the
    caller feeds and reads integers, so the first DequantizeLinear and the last
    QuantizeLinear stay; everything between them becomes float."""
    model = _qdq_model()
    graph = model.graph
    x_q = helper.make_tensor_value_info("x_q", TensorProto.INT8, X_SHAPE)
    kept = [n for n in graph.node if n.name not in ("q_x", "dq_y")]
    del graph.node[:]
    graph.node.extend(kept)
    del graph.input[:]
    graph.input.append(x_q)
    del graph.output[:]
    graph.output.append(helper.make_tensor_value_info("y_q", TensorProto.INT8, [1, 3, 4, 4]))
    result = dequantize.to_float(model)
    assert not result.kept
    assert [n.op_type for n in result.model.graph.node] == ["DequantizeLinear", "Conv",
                                                            "QuantizeLinear"]
    onnx.checker.check_model(result.model, full_check=True)
    x = np.random.default_rng(4).integers(-128, 128, X_SHAPE).astype(np.int8)
    (got,) = onnx_io.run(result.model, {"x_q": x}).values()
    (want,) = onnx_io.run(model, {"x_q": x}).values()
    assert got.dtype == np.int8 and np.array_equal(got, want)


def _float_conv_lstm_matmul() -> onnx.ModelProto:
    """A CRNN like ddddocr's older recognizer: Conv + bias + Relu, a bidirectional LSTM over the
    width, a MatMul + bias head (the float model before ``quantize_dynamic``)."""
    rng = np.random.default_rng(3)
    hidden, feat = 6, 8
    inits = {
        "cw": rng.standard_normal((feat, 1, 3, 3)).astype(np.float32) * 0.3,
        "cb": rng.standard_normal(feat).astype(np.float32) * 0.1,
        "shape": np.array([1, feat, 5], np.int64), "perm_shape": np.array([5, 1, feat], np.int64),
        "lw": rng.standard_normal((2, 4 * hidden, feat)).astype(np.float32) * 0.3,
        "lr": rng.standard_normal((2, 4 * hidden, hidden)).astype(np.float32) * 0.3,
        "lb": rng.standard_normal((2, 8 * hidden)).astype(np.float32) * 0.1,
        "flat": np.array([5, 2 * hidden], np.int64),
        "hw": rng.standard_normal((2 * hidden, 4)).astype(np.float32) * 0.3,
        "hb": rng.standard_normal(4).astype(np.float32) * 0.1,
    }
    nodes = [
        helper.make_node("Conv", ["x", "cw", "cb"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"]),
        helper.make_node("ReduceMean", ["relu"], ["pooled"], axes=[2], keepdims=0),
        helper.make_node("Transpose", ["pooled"], ["seq"], perm=[2, 0, 1]),
        helper.make_node("LSTM", ["seq", "lw", "lr", "lb"], ["states"], hidden_size=hidden,
                         direction="bidirectional"),
        helper.make_node("Reshape", ["states", "flat"], ["features"]),
        helper.make_node("MatMul", ["features", "hw"], ["logits_raw"]),
        helper.make_node("Add", ["logits_raw", "hb"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "crnn", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 1, 4, 5])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [5, 4])],
        [numpy_helper.from_array(v, k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_onnx_runtime_dynamic_quantization_becomes_its_float_model(tmp_path):
    # ddddocr's older recognizer is quantize_dynamic's output: ConvInteger, MatMulInteger and
    # DynamicQuantizeLSTM on activations quantized at run time, all of it on the CPU
    from onnxruntime.quantization import QuantType, quantize_dynamic

    source = _float_conv_lstm_matmul()
    onnx.save(source, tmp_path / "float.onnx")
    quantize_dynamic(tmp_path / "float.onnx", tmp_path / "dynamic.onnx", weight_type=QuantType.QInt8,
                     op_types_to_quantize=["Conv", "MatMul", "LSTM"])
    dynamic = onnx.load(tmp_path / "dynamic.onnx")
    assert {"ConvInteger", "MatMulInteger", "DynamicQuantizeLSTM"} <= {n.op_type for n in dynamic.graph.node}
    assert dequantize.is_quantized(dynamic)

    result = dequantize.to_float(dynamic)
    assert not result.kept and result.dynamic == 3
    ops = {n.op_type for n in result.model.graph.node}
    assert not ops & (dequantize.DYNAMIC | {"DynamicQuantizeLinear", "Cast"})
    assert {"Conv", "LSTM", "MatMul"} <= ops
    onnx.checker.check_model(result.model, full_check=True)
    x = np.random.default_rng(4).standard_normal((1, 1, 4, 5)).astype(np.float32)
    reference = onnx_io.run(source, {"x": x})["logits"]
    floated = onnx_io.run(result.model, {"x": x})["logits"]
    quantized = onnx_io.run(dynamic, {"x": x})["logits"]
    # only the int8 weights remain of the quantization: closer to the float model than the
    # source, whose activations were quantized too
    assert np.abs(floated - reference).max() < np.abs(quantized - reference).max()
    assert np.abs(floated - reference).max() < 0.02 * np.abs(reference).max()
