"""Products by one constant weight of moved parts of one tensor computed once
(`npubuild.frontends.products`): the hoisted graph computes what ONNX Runtime computes for the
per-step products, and nothing moves where the move touches the multiplied axis, the parts do
not cover the tensor, or a bias differs per row."""

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild import onnx_io
from npubuild.frontends import products

STEPS, FEATURES, UNITS = 5, 6, 4


def _model(nodes, inits, outputs, x_shape=(STEPS, 1, FEATURES), opset=17) -> onnx.ModelProto:
    graph = helper.make_graph(
        nodes, "steps", [helper.make_tensor_value_info("X", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info(o, TensorProto.FLOAT, None) for o in outputs], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    return onnx_io.reinfer_shapes(model)


def per_step_gemms(steps=range(STEPS), trans_b=0, alpha=1.0, first_bias=None, per_row_bias=False,
                   axis=0) -> onnx.ModelProto:
    """An unrolled recurrence's input products as tf2onnx's Loop leaves them: step ``t`` reads
    ``Gather(X, t)`` [1, F] and multiplies it by one weight (its bias folded per iteration under
    its own name; ``first_bias``: the first step's differs)."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((UNITS, FEATURES) if trans_b else (FEATURES, UNITS))
    bias = rng.standard_normal((2, UNITS) if per_row_bias else (UNITS,))
    inits = [numpy_helper.from_array(weight.astype(np.float32), "W")]
    nodes, outputs = [], []
    for t in steps:
        value = bias if first_bias is None or t else first_bias
        inits += [numpy_helper.from_array(np.array(t, np.int64), f"t{t}"),
                  numpy_helper.from_array(np.asarray(value, np.float32), f"b{t}")]
        nodes += [helper.make_node("Gather", ["X", f"t{t}"], [f"x{t}"], axis=axis),
                  helper.make_node("Gemm", [f"x{t}", "W", f"b{t}"], [f"y{t}"], name=f"step{t}",
                                   transB=trans_b, alpha=alpha)]
        outputs.append(f"y{t}")
    x_shape = (STEPS, 2, FEATURES) if per_row_bias else (STEPS, 1, FEATURES)
    if axis != 0:  # the multiplied axis itself moved: X [1, F, steps]
        x_shape = (1, FEATURES, STEPS)
    return _model(nodes, inits, outputs, x_shape)


def per_step_matmuls_through_squeeze() -> onnx.ModelProto:
    """A traced PyTorch cell: ``x[t]`` as Slice then Squeeze, ``x_t @ W``."""
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(rng.standard_normal((FEATURES, UNITS)).astype(np.float32), "W"),
             numpy_helper.from_array(np.array([0], np.int64), "axis0")]
    nodes, outputs = [], []
    for t in range(STEPS):
        inits += [numpy_helper.from_array(np.array([t], np.int64), f"s{t}"),
                  numpy_helper.from_array(np.array([t + 1], np.int64), f"e{t}")]
        nodes += [helper.make_node("Slice", ["X", f"s{t}", f"e{t}", "axis0"], [f"r{t}"]),
                  helper.make_node("Squeeze", [f"r{t}", "axis0"], [f"x{t}"]),
                  helper.make_node("MatMul", [f"x{t}", "W"], [f"y{t}"], name=f"step{t}")]
        outputs.append(f"y{t}")
    return _model(nodes, inits, outputs)


def assert_same_outputs(source: onnx.ModelProto, hoisted: onnx.ModelProto) -> None:
    onnx.checker.check_model(hoisted, full_check=True)
    x = np.random.default_rng(2).standard_normal(
        onnx_io.value_shape(source.graph.input[0])).astype(np.float32)
    want, got = onnx_io.run(source, {"X": x}), onnx_io.run(hoisted, {"X": x})
    for name in want:
        assert want[name].shape == got[name].shape, name
        np.testing.assert_allclose(got[name], want[name], rtol=1e-5, atol=1e-5)


def ops(model: onnx.ModelProto) -> list[str]:
    return [n.op_type for n in model.graph.node]


@pytest.mark.parametrize("trans_b, alpha", [(0, 1.0), (1, 1.0), (0, 0.5)])
def test_per_step_products_by_one_weight_become_one_product_of_the_whole_sequence(trans_b, alpha):
    """nakdimon's four LSTM directions (tf2onnx Loops, unrolled) multiplied each of 64 steps by
    the same input weights: 256 Gemms, each loading a 400x1600 weight on the NPU for one row."""
    source = per_step_gemms(trans_b=trans_b, alpha=alpha)
    hoisted, counts = products.hoisted_over_moves(source)
    assert counts == {"products": STEPS, "hoisted": 1}
    assert ops(hoisted).count("MatMul") == 1 and "Gemm" not in ops(hoisted)
    assert ops(hoisted).count("Add") == 1  # the bias every step shares, added once
    assert_same_outputs(source, hoisted)


def test_a_step_with_its_own_bias_adds_it_after_the_shared_product():
    """A loop's first step folds the zero initial state's product into its bias."""
    source = per_step_gemms(first_bias=np.arange(UNITS, dtype=np.float32))
    hoisted, counts = products.hoisted_over_moves(source)
    assert counts["hoisted"] == 1 and ops(hoisted).count("MatMul") == 1
    assert ops(hoisted).count("Add") == STEPS
    assert_same_outputs(source, hoisted)


def test_a_chain_of_moves_that_keeps_the_last_axis_is_taken_over_whole():
    source = per_step_matmuls_through_squeeze()
    hoisted, counts = products.hoisted_over_moves(source)
    assert counts == {"products": STEPS, "hoisted": 1}
    assert ops(hoisted).count("MatMul") == 1
    assert ops(hoisted).count("Slice") == STEPS and ops(hoisted).count("Squeeze") == STEPS
    assert_same_outputs(source, hoisted)


@pytest.mark.parametrize("source, why", [
    (per_step_gemms(steps=[0, 3]), "two of five rows: the whole product multiplies more"),
    (per_step_gemms(steps=[2]), "one product shares nothing"),
    (per_step_gemms(per_row_bias=True), "a bias per row does not move with the rows"),
    (per_step_gemms(axis=2), "the move picks along the multiplied axis"),
])
def test_products_stay_where_hoisting_would_not_compute_the_same_or_would_cost_more(source, why):
    hoisted, counts = products.hoisted_over_moves(source)
    assert hoisted is source and counts == {}, why
