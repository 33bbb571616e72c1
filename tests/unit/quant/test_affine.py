"""Constant affine steps after a conv or a table fold into it (PP-OCRv4's learnable affine
blocks): fewer layers, one rounding, and still the integer reference equals ONNX Runtime."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from npubuild.quant import affine
from npubuild.quant.lower import lower
from tests.unit.quant.helpers import check_against_ort, feeds_for, model

RNG = np.random.default_rng(3)


def affine_block(scale_shape=(1, 4, 1, 1)):
    """Conv → Mul(per-channel) → Add(scalar) → HardSwish → Mul(scalar) → Sub(scalar) → Div
    (scalar) → Conv → BatchNormalization: Paddle's LAB pattern and a BN after a conv."""
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Mul", ["s", "c"], ["m"], name="mul"),
             helper.make_node("Add", ["m", "t"], ["a"], name="add"),
             helper.make_node("HardSwish", ["a"], ["h"], name="hswish"),
             helper.make_node("Mul", ["h", "s2"], ["m2"], name="mul2"),
             helper.make_node("Sub", ["m2", "t2"], ["a2"], name="sub2"),
             helper.make_node("Div", ["a2", "d"], ["a3"], name="div"),
             helper.make_node("Conv", ["a3", "w2"], ["c2"], name="conv2"),
             helper.make_node("BatchNormalization", ["c2", "g", "be", "mu", "var"], ["y"], name="bn")]
    inits = {"w": RNG.normal(0, 0.5, (4, 3, 3, 3)), "b": RNG.normal(0, 0.1, 4),
             "s": RNG.uniform(0.5, 2.0, scale_shape), "t": [0.3], "s2": [1.7], "t2": [0.2],
             "d": [0.8], "w2": RNG.normal(0, 0.5, (5, 4, 1, 1)),
             "g": RNG.uniform(0.5, 1.5, 5), "be": RNG.normal(0, 0.2, 5),
             "mu": RNG.normal(0, 0.2, 5), "var": RNG.uniform(0.5, 2.0, 5)}
    return model(nodes, {"x": [1, 3, 8, 8]}, {"y": [1, 5, 8, 8]}, inits)


def test_affine_steps_fold_into_the_conv_and_the_table_before_them():
    fg, _ = lower(affine_block())
    assert [(layer.kind, layer.source_nodes) for layer in fg.layers] == [
        ("conv", ["conv", "mul", "add"]), ("lut", ["hswish", "mul2", "sub2", "div"]),
        ("conv", ["conv2", "bn"])]


def test_folded_graph_matches_float_and_onnxruntime():
    m = affine_block()
    qg, cc, cosine = check_against_ort(m, feeds_for(m, 4))
    assert len(qg.layers) == 3
    assert cc.ok and cc.identical_fraction == 1.0
    assert cosine > 0.999


def test_a_step_that_varies_along_another_axis_is_not_folded():
    m = affine_block(scale_shape=(1, 1, 8, 1))       # per row, not per channel
    kinds = [layer.kind for layer in lower(m)[0].layers]
    assert kinds[:2] == ["conv", "mul"]


def test_a_table_takes_scalars_only():
    m = model([helper.make_node("Sigmoid", ["x"], ["s"], name="sig"),
               helper.make_node("Mul", ["s", "k"], ["y"], name="mul")],
              {"x": [1, 2, 4, 4]}, {"y": [1, 2, 4, 4]}, {"k": np.array([1.0, 2.0]).reshape(1, 2, 1, 1)})
    assert [layer.kind for layer in lower(m)[0].layers] == ["lut", "mul"]


@pytest.mark.parametrize("value, expected", [
    (np.float32(2.0), [2.0, 2.0, 2.0]), (np.ones((3, 1, 1)) * 3, [3.0, 3.0, 3.0]),
    (np.arange(3.0).reshape(1, 3, 1, 1), [0.0, 1.0, 2.0]), (np.ones((1, 1, 4, 1)), None),
    (np.ones((2, 1, 3, 1, 1)), None), (np.array([np.inf]), None)])
def test_channel_vector_accepts_per_channel_broadcasts_only(value, expected):
    got = affine.channel_vector(value, [1, 3, 4, 4], 1)
    assert (got is None and expected is None) or got.tolist() == expected
