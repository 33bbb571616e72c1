"""Reductions the chip has no kernel for, written as the MaxPool or conv it runs
(`npubuild.split.reductions`): DeepCut's Keras ``Maximum`` (a Max of two tensors), AttaCut's
``torch.max(stack(...), -1)`` (a ReduceMax) and OSKut's attention sum over time (a ReduceSum),
equal to the original in ONNX Runtime and placed on the NPU."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild import onnx_io
from npubuild.split import check_placement, split_model
from npubuild.split.reductions import legal_reductions
from npubuild.targets import load_chip


def model_of(nodes, inits, x_shape, out_shape, opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, x_shape)],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, out_shape)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def maximum_model(operands: int = 2) -> onnx.ModelProto:
    """DeepCut's shape: [64, 21, 5] branches (scaled copies of the input), their Max, a Relu."""
    inits = [numpy_helper.from_array(np.float32(0.5 + i), f"s{i}") for i in range(operands)]
    scaled = [helper.make_node("Mul", ["x", f"s{i}"], [f"b{i}"], name=f"branch{i}")
              for i in range(operands)]
    top = helper.make_node("Max", [f"b{i}" for i in range(operands)], ["m"], name="maximum")
    relu = helper.make_node("Relu", ["m"], ["z"], name="relu")
    return model_of([*scaled, top, relu], inits, [64, 21, 5], [64, 21, 5])


def reduce_model(axes, keepdims=0, opset=18, x_shape=(1, 64, 196, 3), op="ReduceMax"
                 ) -> onnx.ModelProto:
    """AttaCut's shape: the maximum over the last axis of three stacked conv branches."""
    out = [d for i, d in enumerate(x_shape) if i not in [a % len(x_shape) for a in axes]] \
        if not keepdims else [1 if i in [a % len(x_shape) for a in axes] else d
                              for i, d in enumerate(x_shape)]
    inits, inputs, attrs = [], ["x"], {"keepdims": keepdims}
    if opset >= 18 or (op == "ReduceSum" and opset >= 13):
        inits.append(numpy_helper.from_array(np.array(axes, np.int64), "axes"))
        inputs.append("axes")
    else:
        attrs["axes"] = list(axes)
    top = helper.make_node(op, inputs, ["m"], name="reduce", **attrs)
    relu = helper.make_node("Relu", ["m"], ["z"], name="relu")
    return model_of([top, relu], inits, list(x_shape), out, opset=opset)


def run(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def on_npu(model) -> dict[str, str]:
    return {p.name: p.device for p in check_placement(model, load_chip("npu-16m"))
            if p.op != "Constant"}


@pytest.mark.parametrize("model", [
    pytest.param(maximum_model(), id="max_of_two"),
    pytest.param(maximum_model(3), id="max_of_three"),
    pytest.param(reduce_model([-1]), id="reduce_last_axis_opset18"),
    pytest.param(reduce_model([3], keepdims=1, opset=13), id="reduce_keepdims_opset13"),
    pytest.param(reduce_model([1], x_shape=(1, 4, 10, 6)), id="reduce_channels"),
    # OSKut's attention: a sum over 21 steps (past max_kernel 15: then cut as a long conv)
    pytest.param(reduce_model([1], x_shape=(64, 21, 384), op="ReduceSum"), id="sum_over_time"),
    pytest.param(reduce_model([2, 3], keepdims=1, op="ReduceSum", opset=13), id="sum_keepdims"),
    # GTCRN's temporal attention: the mean energy of 33 subbands (opset 11: axes attribute)
    pytest.param(reduce_model([-1], x_shape=(1, 8, 1, 33), op="ReduceMean", opset=11),
                 id="mean_over_the_last_axis"),
])
def test_a_reduction_is_a_pool_or_conv_equal_to_it_on_the_npu(model):
    chip = load_chip("npu-16m")
    ops = ("Max", "ReduceMax", "ReduceSum", "ReduceMean")
    reduction = next(n for n in model.graph.node if n.op_type in ops)
    rewritten, names = legal_reductions(model, chip)
    kind = {"ReduceSum": "sum", "ReduceMean": "mean"}.get(reduction.op_type, "pool")
    assert names == [f"{reduction.name}/{kind}"]
    assert not set(ops) & {n.op_type for n in rewritten.graph.node}
    x = np.random.default_rng(1).standard_normal(
        [d.dim_value for d in model.graph.input[0].type.tensor_type.shape.dim]).astype(np.float32)
    if kind == "pool":  # a maximum picks a value: bit-equal
        np.testing.assert_array_equal(run(rewritten, x), run(model, x))
    else:  # a sum adds in another order
        np.testing.assert_allclose(run(rewritten, x), run(model, x), rtol=1e-5, atol=1e-5)
    assert set(on_npu(model).values()) == {"npu"}, on_npu(model)


def test_a_mean_of_the_whole_tensor_or_over_h_and_w_is_left_to_its_kernel():
    whole = reduce_model([0, 1, 2], op="ReduceMean", x_shape=(1, 8, 33), opset=11)
    assert legal_reductions(whole, load_chip("npu-16m")) == (whole, [])
    pooled = reduce_model([2, 3], keepdims=1, op="ReduceMean", x_shape=(1, 4, 8, 8), opset=11)
    assert legal_reductions(pooled, load_chip("npu-16m")) == (pooled, [])  # the quantizer's


def test_a_max_with_a_constant_stays_a_table():
    # one tensor and a constant: the quantizer's lookup table, already on the NPU
    inits = [numpy_helper.from_array(np.float32(-0.4), "c")]
    top = helper.make_node("Max", ["x", "c"], ["z"], name="maximum")
    model = model_of([top], inits, [1, 4, 8, 8], [1, 4, 8, 8])
    assert legal_reductions(model, load_chip("npu-16m")) == (model, [])
    assert on_npu(model) == {"maximum": "npu"}


def test_a_sum_of_the_whole_tensor_stays_whole():
    model = reduce_model([0, 1, 2, 3], op="ReduceSum", x_shape=(1, 4, 8, 8))
    assert legal_reductions(model, load_chip("npu-16m")) == (model, [])


def test_a_broadcasting_max_stays_whole():
    inits = [numpy_helper.from_array(np.float32(2.0), "s")]
    row = helper.make_node("ReduceMean", ["x"], ["r"], name="row", axes=[3], keepdims=1)
    top = helper.make_node("Max", ["x", "r"], ["z"], name="maximum")
    model = model_of([row, top], inits, [1, 4, 8, 8], [1, 4, 8, 8], opset=13)
    rewritten, names = legal_reductions(model, load_chip("npu-16m"))
    assert names == ["row/mean"]  # the mean over one axis of four is a conv; the Max stays
    assert [n.name for n in rewritten.graph.node if n.op_type == "Max"] == ["maximum"]


def test_split_proves_the_rewrite_and_is_deterministic(tmp_path):
    model = maximum_model()
    report = split_model(model, load_chip("npu-16m"), None, tmp_path)
    assert report["npu_segments"] == 1 and report["cpu_segments"] == 0
    assert report["legal_convs"]["convs"] == ["maximum/pool"]
    assert report["legal_convs"]["max_rel"] == 0.0
    one, _ = legal_reductions(model, load_chip("npu-16m"))
    two, _ = legal_reductions(onnx_io.clone(model), load_chip("npu-16m"))
    assert one.SerializeToString() == two.SerializeToString()
