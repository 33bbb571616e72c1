"""Fusion rules written in the recipe: chains, edges, constants and attribute conditions."""

import numpy as np
import pytest
from pydantic import ValidationError

from npubuild.fusions.user import apply_user_rule
from npubuild.recipe.model import UserFusionRule

X = {"x": [1, 3, 6, 6]}


def fuse(tiny, rule: dict, model):
    fused, report = apply_user_rule(model, UserFusionRule.model_validate(rule))
    tiny.assert_equivalent(model, fused)
    return fused, report


def conv_relu(tiny, node, group=1):
    nodes = [node("Conv", ["x", "w", "b"], ["c"], kernel_shape=[3, 3], group=group),
             node("Relu", ["c"], ["y"])]
    return tiny.model(nodes, X, ["y"], {"w": tiny.rand(3, 3 // group, 3, 3), "b": tiny.rand(3)})


def test_a_chain_rule_fuses_into_its_camel_case_op_with_the_conv_attributes(tiny, make_node):
    fused, report = fuse(tiny, {"name": "conv_relu", "pattern": ["Conv", "Relu"]},
                         conv_relu(tiny, make_node))
    assert report.fired == 1 and tiny.ops(fused) == {"ConvRelu:": 1}
    node = tiny.fused(fused)[0]
    assert list(node.input) == ["x", "w", "b"]
    assert tiny.attrs(node)["kernel_shape"] == [3, 3] and tiny.attrs(node)["group"] == 1


def test_an_attribute_condition_that_fails_is_explained(tiny, make_node):
    rule = {"name": "conv_relu", "pattern": ["Conv", "Relu"], "attributes": {"Conv": {"group": 1}}}
    _, report = fuse(tiny, rule, conv_relu(tiny, make_node, group=3))
    assert report.fired == 0 and "has group=3, the pattern needs 1" in report.near_misses[0]


def test_an_edge_rule_matches_a_shared_input_in_either_operand_order(tiny, make_node):
    nodes = [make_node("Sigmoid", ["x"], ["s"]), make_node("Mul", ["s", "x"], ["y"])]
    rule = {"name": "swish", "pattern": [{"op": "Sigmoid", "inputs": ["v"]},
                                         {"op": "Mul", "inputs": ["v", "Sigmoid"]}]}
    fused, report = fuse(tiny, rule, tiny.model(nodes, X, ["y"]))
    assert report.fired == 1 and tiny.ops(fused) == {"Swish:": 1}


def test_a_numeric_input_matches_only_that_constant(tiny, make_node):
    rule = {"name": "plus_three_relu", "pattern": [{"op": "Add", "inputs": ["v", 3]}, "Relu"]}
    nodes = [make_node("Add", ["x", "k"], ["a"]), make_node("Relu", ["a"], ["y"])]
    three, _ = fuse(tiny, rule, tiny.model(nodes, X, ["y"], {"k": np.float32(3)}))
    four, report = fuse(tiny, rule, tiny.model(nodes, X, ["y"], {"k": np.float32(4)}))
    assert tiny.ops(three) == {"PlusThreeRelu:": 1} and not three.graph.initializer
    assert tiny.ops(four) == {"Add": 1, "Relu": 1} and "is 4, the pattern needs 3" in report.near_misses[0]


def test_ops_sharing_an_attribute_name_expose_it_under_their_ids(tiny, make_node):
    nodes = [make_node("MaxPool", ["x"], ["p"], kernel_shape=[2, 2]),
             make_node("Conv", ["p", "w"], ["y"], kernel_shape=[1, 1])]
    model = tiny.model(nodes, X, ["y"], {"w": tiny.rand(2, 3, 1, 1)})
    fused, _ = fuse(tiny, {"name": "pool_conv", "pattern": ["MaxPool", "Conv"]}, model)
    attrs = tiny.attrs(tiny.fused(fused)[0])
    assert attrs["MaxPool_kernel_shape"] == [2, 2] and attrs["Conv_kernel_shape"] == [1, 1]


def test_a_user_rule_never_fuses_across_a_tensor_with_other_consumers(tiny, make_node):
    nodes = [make_node("Relu", ["x"], ["r"]), make_node("Sigmoid", ["r"], ["y"]),
             make_node("Add", ["r", "y"], ["z"])]
    _, report = fuse(tiny, {"name": "relu_sig", "pattern": ["Relu", "Sigmoid"]},
                     tiny.model(nodes, X, ["z"]))
    assert report.fired == 0 and "also feeds Add" in report.near_misses[0]


@pytest.mark.parametrize("pattern, message", [
    ([{"op": "Relu", "inputs": ["Sigmoid"]}, {"op": "Sigmoid", "inputs": ["x"]}], "not an earlier op"),
    ([{"op": "Relu", "inputs": ["x"]}, {"op": "Sigmoid", "inputs": ["x"]}], "does not feed the last op"),
    ([{"op": "Relu", "id": "a"}, {"op": "Sigmoid", "id": "a"}], "ids repeat"),
])
def test_a_malformed_pattern_is_rejected_when_the_recipe_is_read(pattern, message):
    with pytest.raises(ValidationError, match=message):
        UserFusionRule.model_validate({"name": "bad", "pattern": pattern})


def test_a_tensor_read_inside_an_if_branch_counts_as_another_consumer(tiny, make_node):
    from onnx import TensorProto, helper

    branch = helper.make_graph([helper.make_node("Neg", ["r"], ["n"])], "branch", [],
                               [helper.make_tensor_value_info("n", TensorProto.FLOAT, [1, 3, 6, 6])])
    nodes = [make_node("Relu", ["x"], ["r"]), make_node("Sigmoid", ["r"], ["y"]),
             make_node("ReduceSum", ["x"], ["total"], keepdims=0),
             make_node("Greater", ["total", "zero"], ["positive"]),
             make_node("If", ["positive"], ["z"], then_branch=branch, else_branch=branch)]
    model = tiny.model(nodes, X, ["y", "z"], {"zero": np.float32(0)})
    _, report = fuse(tiny, {"name": "relu_sig", "pattern": ["Relu", "Sigmoid"]}, model)
    assert report.fired == 0 and "also feeds If" in report.near_misses[0]
