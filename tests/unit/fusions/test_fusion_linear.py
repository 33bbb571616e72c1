"""gemm_act and matmul_add: fully connected layers fused into GemmAct / MatmulAdd."""

import pytest

A = {"a": [2, 5]}


@pytest.mark.parametrize("act, attrs, overload", [("Relu", {}, "Relu"),
                                                   ("LeakyRelu", {"alpha": 0.1}, "LeakyRelu")])
def test_gemm_act_fuses_gemm_and_activation_keeping_gemm_attributes(tiny, make_node, act, attrs,
                                                                     overload):
    nodes = [make_node("Gemm", ["a", "w", "c"], ["g"], transB=1, alpha=0.5),
             make_node(act, ["g"], ["y"], **attrs)]
    model = tiny.model(nodes, A, ["y"], {"w": tiny.rand(3, 5), "c": tiny.rand(3)})
    fused, report = tiny.fuse_and_check("gemm_act", model)
    assert report.fired == 1 and tiny.ops(fused) == {f"GemmAct:{overload}": 1}
    got = tiny.attrs(tiny.fused(fused)[0])
    assert (got["transA"], got["transB"], got["beta"]) == (0, 1, 1.0)
    assert got["alpha"] == pytest.approx(0.5) and got["activation"] == act


def test_gemm_act_does_not_fuse_when_the_gemm_output_has_another_consumer(tiny, make_node):
    nodes = [make_node("Gemm", ["a", "w"], ["g"], transB=1), make_node("Relu", ["g"], ["y"]),
             make_node("Sub", ["g", "y"], ["z"])]
    _, report = tiny.fuse_and_check("gemm_act", tiny.model(nodes, A, ["z"], {"w": tiny.rand(3, 5)}))
    assert report.fired == 0 and "also feeds Sub" in report.near_misses[0]


@pytest.mark.parametrize("order", [("m", "bias"), ("bias", "m")], ids=["mm+b", "b+mm"])
def test_matmul_add_fuses_a_matmul_and_its_constant_bias(tiny, make_node, order):
    nodes = [make_node("MatMul", ["a", "w"], ["m"]), make_node("Add", list(order), ["y"])]
    model = tiny.model(nodes, A, ["y"], {"w": tiny.rand(5, 3), "bias": tiny.rand(3)})
    fused, report = tiny.fuse_and_check("matmul_add", model)
    assert report.fired == 1 and tiny.ops(fused) == {"MatmulAdd:": 1}
    assert list(tiny.fused(fused)[0].input) == ["a", "w", "bias"]


def test_matmul_add_leaves_a_residual_add_alone(tiny, make_node):
    nodes = [make_node("MatMul", ["a", "w"], ["m"]), make_node("Add", ["m", "r"], ["y"])]
    model = tiny.model(nodes, {**A, "r": [2, 3]}, ["y"], {"w": tiny.rand(5, 3)})
    _, report = tiny.fuse_and_check("matmul_add", model)
    assert report.fired == 0 and "not a constant bias" in report.near_misses[0]


def test_matmul_add_does_not_fuse_when_the_matmul_output_is_a_graph_output(tiny, make_node):
    nodes = [make_node("MatMul", ["a", "w"], ["m"]), make_node("Add", ["m", "bias"], ["y"])]
    model = tiny.model(nodes, A, ["y", "m"], {"w": tiny.rand(5, 3), "bias": tiny.rand(3)})
    _, report = tiny.fuse_and_check("matmul_add", model)
    assert report.fired == 0 and "graph output" in report.near_misses[0]
