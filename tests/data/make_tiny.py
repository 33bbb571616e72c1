"""Writes tiny.onnx: Conv(3→4, 3x3) → Relu → MaxPool → Add, input x [N, 3, H, W] with dynamic
N/H/W. Checked in so recipe tests have a real model file; rerun to regenerate."""

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def tiny_model() -> onnx.ModelProto:
    rng = np.random.default_rng(7)
    w = numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w")
    b = numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")
    c = numpy_helper.from_array(np.full((1, 4, 1, 1), 0.5, np.float32), "c")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["conv"], "conv", pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["conv"], ["relu"], "relu"),
        helper.make_node("MaxPool", ["relu"], ["pool"], "pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Add", ["pool", "c"], ["y"], "add"),
    ]
    graph = helper.make_graph(
        nodes, "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 3, "H", "W"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4, "h", "w"])], [w, b, c])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


if __name__ == "__main__":
    onnx.save(tiny_model(), str(Path(__file__).with_name("tiny.onnx")))
