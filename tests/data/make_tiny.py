"""Writes tiny.onnx: Conv(3→4, 3x3) → Relu → MaxPool → Add, input x [N, 3, H, W] with dynamic
N/H/W. Checked in so recipe tests have a real model file; rerun to regenerate.

Also the broken variants the golden error texts (tests/recipes/bad_*) point at:
``tiny_any_dims.onnx`` (every input dim dynamic, so only shape inference can tell an NHWC shape
from an NCHW one), ``tiny_dangling.onnx`` (a node reads a tensor nothing makes: onnx.checker
refuses it) and ``tiny_pad_10000.onnx`` (a Pad of 10,000 before the Conv: a 4.8 GB tensor)."""

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


def variants() -> dict[str, onnx.ModelProto]:
    """The broken variants of `tiny_model`, by file name."""
    any_dims = tiny_model()
    dims = any_dims.graph.input[0].type.tensor_type.shape.dim
    dims[1].Clear()
    dims[1].dim_param = "C"
    dangling = tiny_model()
    dangling.graph.node[1].input[0] = "nowhere"
    padded = tiny_model()
    padded.graph.initializer.append(numpy_helper.from_array(
        np.array([0, 0, 10_000, 10_000, 0, 0, 10_000, 10_000], np.int64), "pads"))
    padded.graph.node.insert(0, helper.make_node("Pad", ["x", "pads"], ["padded"], "pad"))
    padded.graph.node[1].input[0] = "padded"
    return {"tiny_any_dims.onnx": any_dims, "tiny_dangling.onnx": dangling,
            "tiny_pad_10000.onnx": padded}


if __name__ == "__main__":
    onnx.save(tiny_model(), str(Path(__file__).with_name("tiny.onnx")))
    for name, model in variants().items():
        onnx.save(model, str(Path(__file__).with_name(name)))
