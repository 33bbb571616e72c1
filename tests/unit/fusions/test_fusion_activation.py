"""silu and hard_swish: composite activations fused into Silu / HardSwish function nodes."""

import numpy as np
import pytest

X = {"x": [1, 4, 5, 5]}


@pytest.mark.parametrize("order", [("x", "s"), ("s", "x")], ids=["x*sig", "sig*x"])
def test_silu_fuses_x_times_sigmoid_in_either_operand_order(tiny, make_node, order):
    nodes = [make_node("Sigmoid", ["x"], ["s"]), make_node("Mul", list(order), ["y"])]
    fused, report = tiny.fuse_and_check("silu", tiny.model(nodes, X, ["y"]))
    assert report.fired == 1 and tiny.ops(fused) == {"Silu:": 1}
    (function,) = fused.functions
    assert [n.op_type for n in function.node] == ["Sigmoid", "Mul"]


def test_silu_does_not_fuse_when_the_sigmoid_output_has_another_consumer(tiny, make_node):
    nodes = [make_node("Sigmoid", ["x"], ["s"]), make_node("Mul", ["x", "s"], ["y"]),
             make_node("Add", ["y", "s"], ["z"])]
    fused, report = tiny.fuse_and_check("silu", tiny.model(nodes, X, ["z"]))
    assert report.fired == 0 and not fused.functions
    assert "'s'" in report.near_misses[0] and "also feeds Add" in report.near_misses[0]


def test_silu_does_not_fuse_when_the_sigmoid_output_is_a_graph_output(tiny, make_node):
    nodes = [make_node("Sigmoid", ["x"], ["s"]), make_node("Mul", ["x", "s"], ["y"])]
    _, report = tiny.fuse_and_check("silu", tiny.model(nodes, X, ["y", "s"]))
    assert report.fired == 0 and "graph output" in report.near_misses[0]


def test_silu_does_not_fuse_a_product_of_two_different_tensors(tiny, make_node):
    nodes = [make_node("Sigmoid", ["x"], ["s"]), make_node("Mul", ["x2", "s"], ["y"])]
    _, report = tiny.fuse_and_check("silu", tiny.model(nodes, {**X, "x2": [1, 4, 5, 5]}, ["y"]))
    assert report.fired == 0 and "not the same tensor" in " ".join(report.near_misses)


CONSTS = {"three": np.float32(3), "zero": np.float32(0), "six": np.float32(6),
          "sixth": np.float32(1 / 6), "five": np.float32(5)}


def relu6_of_x_plus_3(node, high="six"):
    return [node("Add", ["x", "three"], ["a"]), node("Clip", ["a", "zero", high], ["r"])]


def hard_swish_variants(node):
    yield "HardSigmoid", [node("HardSigmoid", ["x"], ["h"], alpha=1 / 6, beta=0.5),
                          node("Mul", ["h", "x"], ["y"])]
    yield "Relu6Div", [*relu6_of_x_plus_3(node), node("Mul", ["x", "r"], ["m"]),
                       node("Div", ["m", "six"], ["y"])]
    yield "Relu6Mul", [*relu6_of_x_plus_3(node), node("Mul", ["x", "r"], ["m"]),
                       node("Mul", ["sixth", "m"], ["y"])]
    yield "Relu6DivFirst", [*relu6_of_x_plus_3(node), node("Div", ["r", "six"], ["d"]),
                            node("Mul", ["d", "x"], ["y"])]
    yield "Relu6MulFirst", [*relu6_of_x_plus_3(node), node("Mul", ["r", "sixth"], ["d"]),
                            node("Mul", ["x", "d"], ["y"])]


def used_consts(nodes):
    return {k: v for k, v in CONSTS.items() if any(k in n.input for n in nodes)}


@pytest.mark.parametrize("variant", ["HardSigmoid", "Relu6Div", "Relu6Mul", "Relu6DivFirst",
                                     "Relu6MulFirst"])
def test_hard_swish_fuses_every_exported_spelling(tiny, make_node, variant):
    nodes = dict(hard_swish_variants(make_node))[variant]
    fused, report = tiny.fuse_and_check("hard_swish", tiny.model(nodes, X, ["y"], used_consts(nodes)))
    assert report.fired == 1 and tiny.ops(fused) == {f"HardSwish:{variant}": 1}
    assert not fused.graph.initializer, "the baked constants leave the graph"


def test_hard_swish_refuses_a_hard_sigmoid_that_is_not_one_sixth(tiny, make_node):
    nodes = [make_node("HardSigmoid", ["x"], ["h"], alpha=0.2), make_node("Mul", ["h", "x"], ["y"])]
    _, report = tiny.fuse_and_check("hard_swish", tiny.model(nodes, X, ["y"]))
    assert report.fired == 0 and "alpha=0.2" in report.near_misses[0]


def test_hard_swish_refuses_a_clip_that_is_not_relu6(tiny, make_node):
    nodes = [*relu6_of_x_plus_3(make_node, high="five"), make_node("Mul", ["x", "r"], ["m"]),
             make_node("Div", ["m", "six"], ["y"])]
    _, report = tiny.fuse_and_check("hard_swish", tiny.model(nodes, X, ["y"], used_consts(nodes)))
    assert report.fired == 0 and "(0.0, 5.0)" in report.near_misses[0]


def test_hard_swish_does_not_fuse_when_the_clip_output_has_another_consumer(tiny, make_node):
    nodes = [*relu6_of_x_plus_3(make_node), make_node("Mul", ["x", "r"], ["m"]),
             make_node("Div", ["m", "six"], ["y"]), make_node("Add", ["r", "y"], ["z"])]
    _, report = tiny.fuse_and_check("hard_swish", tiny.model(nodes, X, ["z"], used_consts(nodes)))
    assert report.fired == 0 and "also feeds Add" in " ".join(report.near_misses)
