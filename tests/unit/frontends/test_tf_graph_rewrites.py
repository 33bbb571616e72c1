"""The frozen graph's rewrites before tf2onnx (`frontends.tf_loops`) leave the nodes they do not
rewrite as they were: a SavedModel leaves out attributes at their defaults, and indexing a
protobuf map to read one adds it, empty. basic-pitch's SavedModel and s2super's (Keras 2) then
stopped in tf2onnx on "Failed to bind all placeholders in <Unknown AttrValue type>"."""

from __future__ import annotations

import pytest

from npubuild.frontends import tf_loops


def _graph_def():
    """One function: a BiasAdd of a MatMul and a constant (a layer: not the recurrent sum),
    and a BiasAdd of a MatMul and the Squeeze of another MatMul (the recurrent sum), every
    attribute at its default left out, as a SavedModel writes them."""
    from tensorflow.core.framework import graph_pb2

    graph = graph_pb2.GraphDef()
    fn = graph.library.function.add()
    fn.signature.name = "cell"
    for name, op, inputs in [("x", "Placeholder", []), ("w", "Const", []), ("b", "Const", []),
                             ("u", "Const", []), ("xw", "MatMul", ["x", "w"]),
                             ("layer", "BiasAdd", ["xw:product:0", "b:output:0"]),
                             ("hu", "MatMul", ["x", "u"]),
                             ("sq", "Squeeze", ["hu:product:0"]),
                             ("sum", "BiasAdd", ["xw:product:0", "sq:output:0"])]:
        node = fn.node_def.add(name=name, op=op)
        node.input.extend(inputs)
    fn.ret["out"] = "sum:output:0"
    return graph


def test_nodes_left_alone_gain_no_attribute():
    graph = _graph_def()
    before = {n.name: sorted(n.attr) for n in graph.library.function[0].node_def}
    tf_loops.for_tf2onnx(graph)
    nodes = {n.name: n for n in graph.library.function[0].node_def}
    assert {name: sorted(n.attr) for name, n in nodes.items()} == before
    assert all(v.WhichOneof("value") is not None for n in nodes.values() for v in n.attr.values())
    # the recurrent sum is still rewritten
    assert nodes["sum"].op == "AddV2" and list(nodes["sum"].input) == ["xw:product:0", "hu:product:0"]
    assert nodes["layer"].op == "BiasAdd"
    assert graph.library.function[0].ret["out"] == "sum:z:0"


@pytest.mark.parametrize("attr, value", [("transpose_b", True), ("squeeze_dims", [1])])
def test_a_sum_it_cannot_read_as_two_products_is_left_alone(attr, value):
    graph = _graph_def()
    nodes = {n.name: n for n in graph.library.function[0].node_def}
    target = nodes["hu"] if attr == "transpose_b" else nodes["sq"]
    if isinstance(value, bool):
        target.attr[attr].b = value
    else:
        target.attr[attr].list.i.extend(value)
    tf_loops.for_tf2onnx(graph)
    assert nodes["sum"].op == "BiasAdd"
