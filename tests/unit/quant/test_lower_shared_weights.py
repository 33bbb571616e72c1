"""Lowering layers that read one constant weight: one float64 weight for all of them."""

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from npubuild.quant.lower import lower


def test_fully_connected_layers_reading_one_weight_share_one_read_only_array():
    """An unrolled recurrence's steps read the same recurrent weights: nakdimon lowered 256
    layers of four 400x1600 weights into 1.1 GB of float64 copies."""
    rng = np.random.default_rng(0)
    weight = rng.standard_normal((4, 4)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "W"], ["h"], "step0"),
         helper.make_node("MatMul", ["h", "W"], ["g"], "step1"),
         helper.make_node("Gemm", ["g", "W"], ["y"], "step2", alpha=0.5)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(weight, "W")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    float_graph, probe = lower(model)
    step0, step1, step2 = (layer.weights["weight"] for layer in float_graph.layers)
    assert step0 is step1 and not step0.flags.writeable
    np.testing.assert_array_equal(step0[:, :, 0, 0], weight.T.astype(np.float64))
    np.testing.assert_array_equal(step2[:, :, 0, 0], (weight.T * 0.5).astype(np.float64))
    x = rng.standard_normal((1, 4)).astype(np.float32)
    np.testing.assert_allclose(probe.run({"x": x})["y"], (x @ weight @ weight @ weight) * 0.5,
                               rtol=1e-5, atol=1e-5)
