"""Grouped convs the chip refuses (npu-tiny, npu-strict: groups 1 or depthwise) as a conv per
group: placed on the NPU, equal in float, and the same int8 result (`npubuild.split.groups`)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from npubuild.fusions.conv import conv_act
from npubuild.onnx_io import run
from npubuild.recipe.model import SplitSpec
from npubuild.split import plan_split
from npubuild.targets import load_chip
from tests.unit.npu.qstacks import compile_qgraph, quantize, simulate_and_compare
from tests.unit.split.split_models import Net

TINY = load_chip("npu-tiny")
STRICT = load_chip("npu-strict")


def _grouped(fused: bool = False):
    """conv -> grouped 1x1 conv (group 4, as ShuffleNet's) [-> Relu] -> conv."""
    net = Net()
    a = net.conv(net.input("x", [1, 8, 6, 6]), 8, 16, k=3, name="a")
    g = net.conv(a, 16, 12, k=1, group=4, name="grouped")
    if fused:
        g = net.op("Relu", [g], name="relu")
    model = net.model([net.conv(g, 12, 4, k=3, name="b")])
    return conv_act(model)[0] if fused else model


def test_a_grouped_conv_runs_on_chips_of_one_or_depthwise_groups_as_a_conv_per_group():
    """Before, the grouped conv went to the CPU ("Convolution groups are not 1 or depthwise"):
    three submodels, two hand-overs. Now a Split, four convs and a Concat, all on the NPU, the
    outputs equal in float; fused into ConvAct it stays fused, one per group."""
    for fused in (False, True):
        model = _grouped(fused)
        for chip in (TINY, STRICT):
            plan = plan_split(model, chip, SplitSpec())
            assert all(plan.on_npu), (chip.name, plan.reasons)
            assert len(plan.segments) == 1
            ops = [n.op_type for n in plan.graph.nodes]
            conv = "ConvAct" if fused else "Conv"
            assert ops.count("Split") == 1 and ops.count("Concat") == 1
            assert ops.count(conv) == 4 + (fused is False) * 2, ops
            feeds = {"x": np.random.default_rng(0).standard_normal((1, 8, 6, 6), np.float32)}
            [want], [got] = run(model, feeds).values(), run(plan.model, feeds).values()
            np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_conv_per_group_has_the_grouped_convs_int8_result_and_compiles_bit_exact():
    """Each output channel sums the same products in one accumulator and the convs write at
    the Concat's scale: with per-channel weight scales the int8 output is the grouped conv's,
    to the bit; compile puts it in one layer group, bit-exact."""
    model = _grouped()
    rewritten = plan_split(model, TINY, SplitSpec()).model
    before, after = (quantize(m, scheme="symmetric", granularity="per_channel")
                     for m in (model, rewritten))
    rng = np.random.default_rng(1)
    x = rng.uniform(-1, 1.5, (1, 8, 6, 6)).astype(np.float32)
    from npubuild.quant.reference import run_reference

    def int8_out(qgraph):
        t = qgraph.tensors["x"]
        q = np.clip(np.round(x / t.scale) + int(t.zero_point or 0), -128, 127).astype(np.int8)
        return run_reference(qgraph, {"x": q})[qgraph.outputs[0]]

    np.testing.assert_array_equal(int8_out(after), int8_out(before))
    _, program, program_file = compile_qgraph(after, TINY)
    assert len(program.groups) == 1
    simulate_and_compare(after, program_file)


def test_a_depthwise_or_forced_grouped_conv_is_left_whole():
    net = Net()
    a = net.conv(net.input("x", [1, 8, 6, 6]), 8, 8, k=3, group=8, name="dw")
    model = net.model([net.conv(a, 8, 8, k=1, group=2, name="grouped")])
    plan = plan_split(model, TINY, SplitSpec(force_cpu=["grouped"]))
    assert [n.op_type for n in plan.graph.nodes] == ["Conv", "Conv"]
    assert plan.on_npu == [True, False]
    on_16m = plan_split(model, load_chip("npu-16m"), SplitSpec())  # runs groups as they are
    assert [n.op_type for n in on_16m.graph.nodes] == ["Conv", "Conv"]


def test_a_grouped_conv_whose_bias_is_computed_at_run_time_is_left_whole():
    """Its bias cannot be cut into constant parts: the conv stays as it was, with its reason,
    instead of losing its bias."""
    net = Net()
    x = net.input("x", [1, 8, 6, 6])
    bias = net.op("Relu", [net.input("b", [12])], name="bias")
    w = net.init("w", net.rng.standard_normal((12, 2, 1, 1)).astype(np.float32))
    model = net.model([net.op("Conv", [x, w, bias], name="grouped", kernel_shape=[1, 1],
                              group=4)])
    plan = plan_split(model, TINY, SplitSpec())
    assert "Split" not in [n.op_type for n in plan.graph.nodes]
