"""The body of a fused node (an ONNX model-local function) seen at the node's real shapes.

The fused node alone is put in a one-node model with the calling model's functions, its
constant inputs as initializers and its other inputs typed as inferred; ONNX's inliner expands
the call (nested fused calls too) and shape inference gives every body node its shapes. The
result is cached per call signature, so 58 identical SiLU calls cost one inference.
"""

from __future__ import annotations

import onnx
import onnx.inliner
from onnx import helper

from npubuild.targets.view import GraphFacts, NodeView


def body_views(view: NodeView) -> list[NodeView] | None:
    """Views of the inlined body nodes; None when the function is not in the model."""
    facts, node = view.facts, view.node
    if (node.domain, node.op_type, node.overload) not in facts.functions:
        return None
    key = ("fused-body", node.domain, node.op_type, node.overload, _signature(view))
    if key not in facts.cache:
        facts.cache[key] = _inline(view)
    body, nodes = facts.cache[key]
    return [NodeView(n, body) for n in nodes]


def _signature(view: NodeView) -> tuple:
    facts = view.facts
    inputs = tuple(("const", name) if facts.is_const(name)
                   else (facts.elem_type(name), tuple(facts.shape(name) or ()))
                   for name in view.node.input)
    attrs = tuple(a.SerializeToString() for a in view.node.attribute)
    return inputs, attrs


def _inline(view: NodeView) -> tuple[GraphFacts, list[onnx.NodeProto]]:
    facts, node = view.facts, view.node
    inputs, inits = [], []
    for name in dict.fromkeys(i for i in node.input if i):
        if facts.is_const(name):
            inits.append(facts.consts[name])
        else:
            shape = facts.shape(name)
            inputs.append(helper.make_tensor_value_info(
                name, facts.elem_type(name) or onnx.TensorProto.FLOAT, shape))
    outputs = [helper.make_empty_tensor_value_info(o) for o in node.output if o]
    graph = helper.make_graph([node], "fused_body", inputs, outputs, initializer=inits)
    model = helper.make_model(graph, opset_imports=facts.opset_imports,
                              functions=list(facts.functions.values()))
    model.ir_version = facts.ir_version
    inlined = onnx.inliner.inline_local_functions(model)
    try:
        inferred = onnx.shape_inference.infer_shapes(inlined, data_prop=True)
    except Exception:  # inference errors leave shapes unknown; the checks say so
        inferred = inlined
    return GraphFacts.from_model(inferred), list(inferred.graph.node)
