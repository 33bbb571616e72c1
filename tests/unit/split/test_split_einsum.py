"""Linear layers written as an Einsum of a constant weight, as the MatMul or grouped conv the
chip runs (`npubuild.split.einsum`): DeepFilterNet3's ``GroupedLinearEinsum``
(``btgi,gih->btgh``, three in its encoder, each a CPU part on main), equal to the original in
ONNX Runtime and placed on the NPU."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild.split import check_placement
from npubuild.split.einsum import legal_einsums, linear_form
from npubuild.targets import load_chip


def einsum_model(equation: str, x_shape, w_shape, out_shape) -> onnx.ModelProto:
    """An Einsum of the input and a constant weight, then a Relu (as DFN3's layers)."""
    w = np.random.default_rng(0).standard_normal(w_shape).astype(np.float32)
    nodes = [helper.make_node("Einsum", ["x", "w"], ["e"], name="einsum", equation=equation),
             helper.make_node("Relu", ["e"], ["z"], name="relu")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, list(x_shape))],
        [helper.make_tensor_value_info("z", TensorProto.FLOAT, list(out_shape))],
        [numpy_helper.from_array(w, "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)], ir_version=7)
    return onnx.shape_inference.infer_shapes(model)


def run(model, x):
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"x": x})[0]


def on_npu(model) -> dict[str, str]:
    return {p.name: p.device for p in check_placement(model, load_chip("npu-16m"))}


@pytest.mark.parametrize("equation, x_shape, w_shape, out_shape, made", [
    # DFN3's encoder: df_fc_emb (32 groups of 96 -> 16) and the GRU's linear_in (16 of 32 -> 16)
    ("btgi,gih->btgh", (1, 100, 32, 96), (32, 96, 16), (1, 100, 32, 16), "einsum/grouped_conv"),
    ("btgi,gih->btgh", (1, 100, 16, 32), (16, 32, 16), (1, 100, 16, 16), "einsum/grouped_conv"),
    ("bti,ih->bth", (1, 100, 64), (64, 32), (1, 100, 32), "einsum/matmul"),
])
def test_a_linear_einsum_is_a_conv_or_matmul_equal_to_it_on_the_npu(equation, x_shape, w_shape,
                                                                      out_shape, made):
    model = einsum_model(equation, x_shape, w_shape, out_shape)
    rewritten, names = legal_einsums(model, load_chip("npu-16m"))
    assert names == [made]
    assert "Einsum" not in {n.op_type for n in rewritten.graph.node}
    x = np.random.default_rng(1).standard_normal(x_shape).astype(np.float32)
    np.testing.assert_allclose(run(rewritten, x), run(model, x), rtol=1e-5, atol=1e-4)
    placed = on_npu(model)  # the split plans the rewritten model
    assert set(placed.values()) == {"npu"}, placed


@pytest.mark.parametrize("equation", [
    "btgi,gih->bthg",   # the output's axes in another order
    "bij,bjk->bik",     # a batched product of two activations' shape (no shared weight form)
    "...gi,gih->...gh",  # an ellipsis: not read here
    "bi,bi->b",
])
def test_other_equations_are_not_linear_layers(equation):
    assert linear_form(equation) is None


def test_an_einsum_of_two_activations_stays_whole():
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4, 8])
    node = helper.make_node("Einsum", ["x", "x"], ["z"], name="einsum", equation="bti,bti->bt")
    graph = helper.make_graph([node], "g", [x],
                              [helper.make_tensor_value_info("z", TensorProto.FLOAT, [1, 4])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 12)], ir_version=7)
    assert legal_einsums(model, load_chip("npu-16m")) == (model, [])
