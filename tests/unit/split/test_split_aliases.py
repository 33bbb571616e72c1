"""Ops the chip lacks written as the op it lists that computes the same (`npubuild.split.aliases`)."""

from __future__ import annotations

import numpy as np

from npubuild.onnx_io import run
from npubuild.recipe.model import SplitSpec
from npubuild.split import plan_split
from npubuild.targets import load_chip
from tests.unit.split.split_models import Net

TINY = load_chip("npu-tiny")
STRICT = load_chip("npu-strict")


def _residual(operands: int = 2):
    """conv -> Sum of the conv and the input (a Caffe2 residual add) -> conv."""
    net = Net()
    x = net.input("x", [1, 8, 6, 6])
    a = net.conv(x, 8, 8, k=3, name="a")
    extra = [net.conv(x, 8, 8, k=1, name="c")] if operands == 3 else []
    total = net.op("Sum", [a, x, *extra], name="residual")
    return net.model([net.conv(total, 8, 4, k=3, name="b")])


def test_a_sum_of_two_tensors_runs_as_an_add_where_the_chip_lists_add_not_sum():
    """npu-strict lists Add but not Sum: the residual Sum was a CPU round trip between two NPU
    parts (light-shufflenet: 13 of them, 14 NPU graphs). Now it is an Add on the NPU, equal in
    float and lowered to the same integer add; npu-tiny, which lists Sum, keeps it."""
    model = _residual()
    plan = plan_split(model, STRICT, SplitSpec())
    assert all(plan.on_npu), plan.reasons
    assert len(plan.segments) == 1
    ops = {plan.graph.label(i): n.op_type for i, n in enumerate(plan.graph.nodes)}
    assert ops["residual"] == "Add"
    feeds = {"x": np.random.default_rng(0).standard_normal((1, 8, 6, 6), np.float32)}
    [want], [got] = run(model, feeds).values(), run(plan.model, feeds).values()
    np.testing.assert_array_equal(got, want)
    from npubuild.quant.lower import lower

    (before,), (after,) = ([layer.kind for layer in lower(m)[0].layers if layer.name == "residual"]
                           for m in (model, plan.model))
    assert before == after == "add"
    tiny = plan_split(model, TINY, SplitSpec())
    assert [n.op_type for n in tiny.graph.nodes].count("Sum") == 1 and all(tiny.on_npu)


def test_a_sum_of_three_or_one_forced_to_the_cpu_stays_a_sum():
    three = plan_split(_residual(3), STRICT, SplitSpec())
    assert "Sum" in [n.op_type for n in three.graph.nodes]
    forced = plan_split(_residual(), STRICT, SplitSpec(force_cpu=["residual"]))
    ops = {forced.graph.label(i): n.op_type for i, n in enumerate(forced.graph.nodes)}
    assert ops["residual"] == "Sum"
