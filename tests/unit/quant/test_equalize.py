"""Cross-layer equalisation: the float function stays what it was (ONNX Runtime), the weight
ranges of each pair become equal, and the quantized error of a depthwise network whose
channels span very different ranges drops."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from npubuild import metrics, onnx_io
from npubuild.quant import calibrate, quantizer
from npubuild.quant.equalize import equalize
from npubuild.quant.lower import lower, prepare
from npubuild.quant.reference import run_quantized
from tests.unit.quant.helpers import feeds_for, model

C = 8


def depthwise_block(activation: str = "Relu"):
    """conv 1×1 (3→8) → act → zero Pad → depthwise 3×3 → act → conv 1×1 (8→4), with channel
    ranges spread over four orders of magnitude (as a trained depthwise network's are) and
    compensated in the next layer, so the function itself is ordinary."""
    rng = np.random.default_rng(0)
    spread = 10.0 ** np.linspace(-2, 2, C)
    w1 = rng.normal(size=(C, 3, 1, 1)) * spread[:, None, None, None]
    b1 = rng.normal(size=C) * spread
    wd = rng.normal(size=(C, 1, 3, 3)) / spread[:, None, None, None] * spread[::-1, None, None, None]
    bd = rng.normal(size=C) * spread[::-1] * 0.1
    w2 = rng.normal(size=(4, C, 1, 1)) / spread[None, ::-1, None, None]
    act = [] if activation == "none" else [helper.make_node(activation, ["a"], ["a1"], name="act1"),
                                            helper.make_node(activation, ["d"], ["d1"], name="act2")]
    a_out, d_out = ("a", "d") if activation == "none" else ("a1", "d1")
    nodes = [helper.make_node("Conv", ["x", "w1", "b1"], ["a"], name="conv1"), *act[:1],
             helper.make_node("Pad", [a_out, "pads"], ["p"], name="pad"),
             helper.make_node("Conv", ["p", "wd", "bd"], ["d"], name="dw", group=C), *act[1:],
             helper.make_node("Conv", [d_out, "w2"], ["y"], name="conv2")]
    return model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]},
                 {"w1": w1, "b1": b1, "wd": wd, "bd": bd, "w2": w2,
                  "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)})


def _weight(m, name):
    return next(numpy_helper.to_array(t) for t in m.graph.initializer if t.name == name)


@pytest.mark.parametrize("activation", ["Relu", "LeakyRelu", "none"])
def test_equalisation_keeps_the_float_function(activation):
    m = prepare(depthwise_block(activation))
    eq, result = equalize(m)
    assert result.pairs == [("conv1", "dw"), ("dw", "conv2")]
    feeds = feeds_for(m, 3)
    before, after = onnx_io.session(m), onnx_io.session(eq)
    for f in feeds:
        ref, got = onnx_io.run(before, f)["y"], onnx_io.run(after, f)["y"]
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-4 * np.abs(ref).max())


def test_equalised_pairs_have_equal_weight_ranges():
    eq, result = equalize(prepare(depthwise_block()))
    r1 = np.abs(_weight(eq, "w1")).reshape(C, -1).max(axis=1)
    rd_out = np.abs(_weight(eq, "wd")).reshape(C, -1).max(axis=1)
    r2 = np.abs(_weight(eq, "w2")).max(axis=(0, 2, 3))
    assert result.sweeps > 1  # the depthwise conv sits in two pairs: sweeps until settled
    np.testing.assert_allclose(r1, rd_out, rtol=0.02)
    np.testing.assert_allclose(rd_out, r2, rtol=0.02)


def test_pairs_through_a_non_homogeneous_activation_are_skipped_with_the_reason():
    eq, result = equalize(prepare(depthwise_block("Sigmoid")))
    assert result.pairs == []
    assert {s["reason"] for s in result.skipped} == {"Sigmoid between them is not positively homogeneous"}
    assert all(np.array_equal(_weight(eq, n), _weight(depthwise_block("Sigmoid"), n))
               for n in ("w1", "wd", "w2"))


def _quantized_cosine(m, feeds, equalized: bool) -> float:
    fg, probe = lower(m, equalize=equalized)
    stats = calibrate.observe(fg, probe, feeds[:4], "minmax")
    config = quantizer.QuantConfig(scheme="symmetric", granularity="per_tensor")
    qg = quantizer.quantize_graph(fg, stats, config, "g")[0]
    sess = onnx_io.session(m)
    return float(np.mean([metrics.similarity(onnx_io.run(sess, f)["y"],
                                             run_quantized(qg, f, ["y"])["y"]).cosine
                          for f in feeds[4:]]))


def test_equalisation_cuts_the_per_tensor_quantization_error_of_a_depthwise_block():
    m = depthwise_block()
    feeds = feeds_for(m, 8, seed=3)
    plain, equalized = _quantized_cosine(m, feeds, False), _quantized_cosine(m, feeds, True)
    assert plain < 0.99 and equalized > 0.999, (plain, equalized)


def test_a_grouped_second_conv_is_scaled_by_the_channels_each_group_reads():
    rng = np.random.default_rng(1)
    spread = 10.0 ** np.linspace(-2, 2, C)
    m = model([helper.make_node("Conv", ["x", "w1"], ["a"], name="conv1"),
               helper.make_node("Relu", ["a"], ["r"], name="relu"),
               helper.make_node("Conv", ["r", "w2"], ["y"], name="grouped", group=2)],
              {"x": [1, 3, 6, 6]}, {"y": [1, 4, 6, 6]},
              {"w1": rng.normal(size=(C, 3, 1, 1)) * spread[:, None, None, None],
               "w2": rng.normal(size=(4, C // 2, 1, 1))})
    m = prepare(m)
    eq, result = equalize(m)
    assert result.pairs == [("conv1", "grouped")]
    assert np.ptp(np.log10(np.abs(_weight(eq, "w1")).reshape(C, -1).max(axis=1))) < 2  # was 4
    for f in feeds_for(m, 2):
        ref = onnx_io.run(onnx_io.session(m), f)["y"]
        np.testing.assert_allclose(onnx_io.run(onnx_io.session(eq), f)["y"], ref, rtol=1e-4,
                                   atol=1e-4 * np.abs(ref).max())
