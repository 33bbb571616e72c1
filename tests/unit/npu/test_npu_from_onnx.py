"""LayerSpecs from a float ONNX graph written inline."""

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from npubuild.npu import layers_from_onnx


def tiny_model() -> onnx.ModelProto:
    w = numpy_helper.from_array(np.zeros((8, 3, 3, 3), np.float32), "w")
    b = numpy_helper.from_array(np.zeros(8, np.float32), "b")
    dw = numpy_helper.from_array(np.zeros((8, 1, 3, 3), np.float32), "dw")
    scales = numpy_helper.from_array(np.array([1, 1, 2, 2], np.float32), "scales")
    shape = numpy_helper.from_array(np.array([1, -1], np.int64), "shape")
    nodes = [
        helper.make_node("Conv", ["x", "w", "b"], ["c"], "conv", pads=[1, 1, 1, 1], strides=[2, 2]),
        helper.make_node("Sigmoid", ["c"], ["s"], "sig"),
        helper.make_node("Mul", ["c", "s"], ["m"], "silu"),
        helper.make_node("Conv", ["m", "dw"], ["d"], "dw", group=8, pads=[1, 1, 1, 1]),
        helper.make_node("MaxPool", ["d"], ["p"], "pool", kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Resize", ["p", "", "scales"], ["r"], "up", mode="nearest"),
        helper.make_node("Concat", ["r", "m"], ["cat"], "cat", axis=1),
        helper.make_node("Reshape", ["cat", "shape"], ["y"], "flatten"),
    ]
    graph = helper.make_graph(
        nodes, "tiny", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], [w, b, dw, scales, shape])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_layers_ops_geometry_and_skipped_nodes():
    graph = layers_from_onnx(tiny_model())
    ops = {layer.name: layer.op for layer in graph.layers}
    assert ops == {"conv": "conv", "sig": "lut", "silu": "eltwise", "dw": "dwconv",
                   "pool": "pool", "up": "resize", "cat": "concat"}
    conv = graph.layers[0]
    assert (conv.kernel_h, conv.stride_h, conv.pad_top, conv.pad_bottom) == (3, 2, 1, 1)
    assert conv.out_shapes == ((1, 8, 8, 8),)
    assert conv.macs == 8 * 8 * 8 * 3 * 3 * 3 and conv.weight_bytes == 8 * 27 + 4 * 8
    assert graph.layers[5].scale_h == 2
    assert graph.inputs == ("x",) and graph.outputs == ("cat",)  # Reshape is skipped
    assert dict(graph.skipped) == {"flatten": "Reshape is not an op the NPU tiler models"}
