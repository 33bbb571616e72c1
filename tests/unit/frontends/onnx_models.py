"""Small ONNX models, written inline, that reproduce what real exports do to the import stage."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper


def _const(name: str, value) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.asarray(value)))


def paddle_reshape(opset: int = 12) -> onnx.ModelProto:
    """Paddle's Flatten before a classifier (PP-OCR's cls and rec heads): the Reshape's shape is
    Concat(Cast(Slice(Cast(Shape(x), float))), [-1]); the float Cast stops onnx's data
    propagation, so inference leaves the Reshape, the MatMul after it and the output unshaped."""
    weight = numpy_helper.from_array(np.arange(12, dtype=np.float32).reshape(4, 3) / 10, "w")
    nodes = [
        helper.make_node("GlobalAveragePool", ["x"], ["pooled"]),
        helper.make_node("Shape", ["pooled"], ["shape"]),
        helper.make_node("Cast", ["shape"], ["shape_f"], to=TensorProto.FLOAT),
        _const("starts", np.array([0], np.int64)), _const("ends", np.array([1], np.int64)),
        _const("axes", np.array([0], np.int64)),
        helper.make_node("Slice", ["shape_f", "starts", "ends", "axes"], ["batch_f"]),
        helper.make_node("Cast", ["batch_f"], ["batch"], to=TensorProto.INT64),
        _const("rest_f", np.array([4.0], np.float32)),
        helper.make_node("Cast", ["rest_f"], ["rest"], to=TensorProto.INT64),
        helper.make_node("Concat", ["batch", "rest"], ["target"], axis=0),
        helper.make_node("Reshape", ["pooled", "target"], ["flat"]),
        helper.make_node("MatMul", ["flat", "w"], ["logits"]),
    ]
    graph = helper.make_graph(
        nodes, "paddle_reshape",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4, "H", "W"])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, None)], [weight])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)], ir_version=8)


def if_branches(declare_output: bool) -> onnx.ModelProto:
    """An If whose branches give different ranks (a flag picks the flattened map or the map):
    inference cannot give its output a shape; the exporter may or may not declare one."""
    def branch(name: str, op: str) -> onnx.GraphProto:
        node = (helper.make_node("Flatten", ["x"], [f"{name}_out"]) if op == "flatten"
                else helper.make_node("Relu", ["x"], [f"{name}_out"]))
        return helper.make_graph([node], name, [],
                                 [helper.make_tensor_value_info(f"{name}_out", TensorProto.FLOAT, None)])

    node = helper.make_node("If", ["flag"], ["y"], then_branch=branch("then", "flatten"),
                            else_branch=branch("else", "relu"))
    out_shape = ["N", "C", "A", "B"] if declare_output else None
    graph = helper.make_graph(
        [node], "if_branches",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 2, 4, 4]),
         helper.make_tensor_value_info("flag", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, out_shape)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def old_ir_conv_bn() -> onnx.ModelProto:
    """IR 3 as the onnx wheel's light_* models are written: every initializer is also a graph
    input. A Conv + BatchNormalization + Relu, so fusion rewrites it and split extracts it."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
             numpy_helper.from_array(rng.random(4).astype(np.float32) + 0.5, "scale"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "bias"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "mean"),
             numpy_helper.from_array(rng.random(4).astype(np.float32) + 0.5, "var")]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("BatchNormalization", ["c", "scale", "bias", "mean", "var"], ["b"]),
             helper.make_node("Relu", ["b"], ["y"])]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])]
    inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits]
    graph = helper.make_graph(nodes, "old_ir", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
                              inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 9)], ir_version=3)
