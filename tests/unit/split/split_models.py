"""Tiny ONNX models written inline for the split, support-check and runner tests."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

FLOAT = TensorProto.FLOAT


class Net:
    """A small graph builder: ``net.op("Relu", [x])`` returns the output name."""

    def __init__(self, seed: int = 0):
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.inputs: list[onnx.ValueInfoProto] = []
        self.functions: list[onnx.FunctionProto] = []
        self.rng = np.random.default_rng(seed)

    def input(self, name: str, shape: list[int], dtype: int = FLOAT) -> str:
        self.inputs.append(helper.make_tensor_value_info(name, dtype, shape))
        return name

    def init(self, name: str, value) -> str:
        self.inits.append(numpy_helper.from_array(np.asarray(value), name))
        return name

    def op(self, op_type: str, inputs: list[str], name: str | None = None, outputs: int = 1,
           domain: str = "", **attrs) -> str | list[str]:
        name = name or f"{op_type.lower()}{len(self.nodes)}"
        outs = [f"{name}_out{k}" if outputs > 1 else f"{name}_out" for k in range(outputs)]
        self.nodes.append(helper.make_node(op_type, inputs, outs, name=name, domain=domain, **attrs))
        return outs if outputs > 1 else outs[0]

    def conv(self, x: str, cin: int, cout: int, k: int = 3, name: str | None = None,
             group: int = 1, **attrs) -> str:
        name = name or f"conv{len(self.nodes)}"
        w = self.init(f"{name}.w", self.rng.standard_normal((cout, cin // group, k, k)).astype(np.float32) * 0.3)
        b = self.init(f"{name}.b", self.rng.standard_normal(cout).astype(np.float32) * 0.1)
        attrs.setdefault("pads", [k // 2] * 4)
        return self.op("Conv", [x, w, b], name=name, kernel_shape=[k, k], group=group, **attrs)

    def model(self, outputs: list[str], opset: int = 17, infer: bool = True) -> onnx.ModelProto:
        graph = helper.make_graph(self.nodes, "net", self.inputs,
                                  [helper.make_empty_tensor_value_info(o) for o in outputs],
                                  initializer=self.inits)
        imports = [helper.make_opsetid("", opset)]
        if self.functions:
            imports.append(helper.make_opsetid("npubuild.fused", 1))
        model = helper.make_model(graph, opset_imports=imports, functions=self.functions)
        model.ir_version = 10
        if not infer:
            return model
        model = onnx.shape_inference.infer_shapes(model, data_prop=True)
        typed = {v.name: v for v in model.graph.value_info}
        for out in model.graph.output:
            if out.name in typed:
                out.CopyFrom(typed[out.name])
        onnx.checker.check_model(model)
        return model


def conv_lstm_conv() -> onnx.ModelProto:
    """Conv → Reshape → LSTM → Reshape → Conv: the LSTM has to stay on the CPU."""
    net = Net()
    x = net.input("x", [1, 3, 8, 8])
    y = net.conv(x, 3, 4, name="conv_in")
    seq = net.op("Reshape", [y, net.init("to_seq", np.array([8, 1, 32]))], name="to_seq")
    rng = net.rng
    w = net.init("lstm.W", rng.standard_normal((1, 64, 32)).astype(np.float32) * 0.2)
    r = net.init("lstm.R", rng.standard_normal((1, 64, 16)).astype(np.float32) * 0.2)
    h, _, _ = net.op("LSTM", [seq, w, r], name="lstm", outputs=3, hidden_size=16)
    img = net.op("Reshape", [h, net.init("to_img", np.array([1, 8, 4, 4]))], name="to_img")
    out = net.conv(img, 8, 2, k=1, name="conv_out")
    return net.model([out])


def if_model() -> onnx.ModelProto:
    """Conv → If (branches read the Conv's output, an initializer and a Constant from the
    outer scope) → Conv."""
    net = Net()
    x = net.input("x", [1, 3, 6, 6])
    y = net.conv(x, 3, 4, name="conv_in")
    total = net.op("ReduceSum", [y], name="total", keepdims=0)
    cond = net.op("Greater", [total, net.init("zero", np.array(0.0, dtype=np.float32))], name="positive")
    net.init("scale", np.array(2.0, dtype=np.float32))
    net.nodes.append(helper.make_node("Constant", [], ["shift"], name="shift_const",
                                      value=numpy_helper.from_array(np.array(0.5, dtype=np.float32))))
    then = helper.make_graph([helper.make_node("Mul", ["conv_in_out", "scale"], ["then_y"]),
                              helper.make_node("Add", ["then_y", "shift"], ["then_z"])],
                             "then", [], [helper.make_tensor_value_info("then_z", FLOAT, [1, 4, 6, 6])])
    other = helper.make_graph([helper.make_node("Neg", ["conv_in_out"], ["else_z"])],
                              "else", [], [helper.make_tensor_value_info("else_z", FLOAT, [1, 4, 6, 6])])
    net.nodes.append(helper.make_node("If", [cond], ["branch_out"], name="branch",
                                      then_branch=then, else_branch=other))
    out = net.conv("branch_out", 4, 2, name="conv_out")
    return net.model([out])


def chain(*ops: str, shape=(1, 4, 8, 8)) -> onnx.ModelProto:
    """x → op0 → op1 → … (unary ops; ``Conv`` means a 3×3 conv keeping the channels)."""
    net = Net()
    t = net.input("x", list(shape))
    for k, op in enumerate(ops):
        t = net.conv(t, shape[1], shape[1], name=f"n{k}") if op == "Conv" else \
            net.op(op, [t], name=f"n{k}")
    return net.model([t])


def fused_conv_act(kernel: int = 3) -> onnx.ModelProto:
    """x → ConvAct (a model-local function: Conv + Relu) → y."""
    net = Net()
    x = net.input("x", [1, 4, 8, 8])
    body = [helper.make_node("Conv", ["X", "W", "B"], ["c"], pads=[kernel // 2] * 4,
                             kernel_shape=[kernel, kernel]),
            helper.make_node("Relu", ["c"], ["Y"])]
    net.functions.append(helper.make_function(
        "npubuild.fused", "ConvAct", ["X", "W", "B"], ["Y"], body,
        [helper.make_opsetid("", 17)]))
    w = net.init("w", net.rng.standard_normal((4, 4, kernel, kernel)).astype(np.float32))
    b = net.init("b", np.zeros(4, dtype=np.float32))
    y = net.op("ConvAct", [x, w, b], name="fused", domain="npubuild.fused")
    return net.model([y])
