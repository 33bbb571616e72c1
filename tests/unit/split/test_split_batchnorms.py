"""Inference BatchNormalizations the chip refuses (npu-tiny, npu-strict list none) as the
per-channel affine step they are: a depthwise 1x1 conv, or a Mul and an Add
(`npubuild.split.batchnorms`)."""

from __future__ import annotations

import numpy as np

from npubuild.onnx_io import run
from npubuild.recipe.model import SplitSpec
from npubuild.split import plan_split
from npubuild.targets import load_chip
from tests.unit.split.split_models import Net

TINY = load_chip("npu-tiny")
STRICT = load_chip("npu-strict")


def _bn(net: Net, x: str, channels: int, name: str) -> str:
    rng = net.rng
    params = [net.init(f"{name}.{p}", v.astype(np.float32)) for p, v in (
        ("scale", rng.uniform(0.5, 1.5, channels)), ("bias", rng.standard_normal(channels)),
        ("mean", rng.standard_normal(channels)), ("var", rng.uniform(0.2, 2.0, channels)))]
    return net.op("BatchNormalization", [x, *params], name=name, epsilon=1e-3)


def _dense():
    """A DenseNet layer: Concat of two convs -> BatchNormalization -> Relu -> conv (no conv
    right before the BN, so conv_bn cannot fold it)."""
    net = Net()
    x = net.input("x", [1, 4, 6, 6])
    cat = net.op("Concat", [net.conv(x, 4, 4, name="a"), net.conv(x, 4, 4, name="b")],
                 name="cat", axis=1)
    act = net.op("Relu", [_bn(net, cat, 8, "norm")], name="relu")
    return net.model([net.conv(act, 8, 4, k=3, name="c")])


def _feeds(shape):
    return {"x": np.random.default_rng(0).standard_normal(shape, np.float32)}


def test_a_batchnorm_the_chip_lacks_runs_as_a_depthwise_conv_on_the_npu():
    """Before, the BN went to the CPU ("not in the chip's table"): two NPU graphs and a round
    trip (light-densenet121 on npu-tiny: 63 NPU graphs). Now a depthwise 1x1 conv of the same
    name, on the NPU, equal in float and lowered to the same int8 layer as the BN was."""
    from npubuild.quant.lower import lower

    model = _dense()
    for chip in (TINY, STRICT):
        plan = plan_split(model, chip, SplitSpec())
        assert all(plan.on_npu), (chip.name, plan.reasons)
        assert len(plan.segments) == 1
        ops = {plan.graph.label(i): n for i, n in enumerate(plan.graph.nodes)}
        assert ops["norm"].op_type == "Conv"
        assert {a.name: a.i for a in ops["norm"].attribute}["group"] == 8
        [want], [got] = run(model, _feeds([1, 4, 6, 6])).values(), \
            run(plan.model, _feeds([1, 4, 6, 6])).values()
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
        (before,), (after,) = ([(layer.kind, layer.attrs["group"]) for layer in lower(m)[0].layers
                                if layer.name == "norm"] for m in (model, plan.model))
        assert before == after


def test_a_batchnorm_of_another_rank_is_a_mul_and_an_add():
    """A 3-D BN (a 1-D feature map) is no conv of the chip's ranks: a Mul and an Add."""
    net = Net()
    x = net.input("x", [1, 8, 10])
    model = net.model([net.op("Relu", [_bn(net, net.op("Relu", [x]), 8, "norm")], name="relu")])
    plan = plan_split(model, TINY, SplitSpec())
    assert all(plan.on_npu), plan.reasons
    ops = [n.op_type for n in plan.graph.nodes]
    assert "BatchNormalization" not in ops and ops.count("Mul") == ops.count("Add") == 1, ops
    [want], [got] = run(model, _feeds([1, 8, 10])).values(), \
        run(plan.model, _feeds([1, 8, 10])).values()
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_a_batchnorm_forced_to_the_cpu_stays_whole():
    forced = plan_split(_dense(), TINY, SplitSpec(force_cpu=["norm"]))
    ops = {forced.graph.label(i): n.op_type for i, n in enumerate(forced.graph.nodes)}
    assert ops["norm"] == "BatchNormalization"
