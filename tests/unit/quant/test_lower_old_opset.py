"""Lowering a fused model whose opset is older than 13: fused functions are inlined before the
opset conversion (which does not convert function bodies)."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npubuild.fusions import load_builtins
from npubuild.quant.lower import lower


def test_fused_conv_relu_at_opset_9_lowers():
    rng = np.random.default_rng(0)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], "conv", pads=[1, 1, 1, 1]),
         helper.make_node("Relu", ["c"], ["y"], "relu")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])], [w])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)])
    model.ir_version = 8
    fused, report = load_builtins()["conv_act"].apply(model)
    assert report.fired == 1 and fused.functions
    float_graph, probe = lower(fused)
    assert [n.domain for n in fused.graph.node] == ["npubuild.fused"]
    x = rng.standard_normal((1, 3, 8, 8)).astype(np.float32)
    assert probe.run({"x": x})["y"].shape == (1, 4, 8, 8)
