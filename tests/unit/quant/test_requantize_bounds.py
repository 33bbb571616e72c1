"""Every requantizing kernel keeps ``acc · multiplier`` inside int64 for any scales and either
integer width: its multiplier width follows the layer's accumulator bound (as conv's always
did). A precision search that gave a bilinear resize an int16 input made ``OverflowError:
requantize: acc · multiplier leaves int64`` of a build int8 quantized fine (two 10-bit taps
per axis times 65,535 steps times a 31-bit multiplier is 2^67)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

from npubuild.quant.reference import run_reference
from tests.unit.quant.helpers import model, quantize

SHAPE = [1, 2, 6, 6]


def layers_model():
    """A bilinear ×2 resize, a 3x3 and a global average pool, an add, a scalar Mul and a
    concat: every kind that requantizes besides conv and mul."""
    scales = helper.make_tensor("scales", 1, [4], [1.0, 1.0, 2.0, 2.0])
    nodes = [helper.make_node("Constant", [], ["s"], value=scales),
             helper.make_node("Resize", ["x", "", "s"], ["up"], mode="linear"),
             helper.make_node("AveragePool", ["up"], ["avg"], kernel_shape=[3, 3], pads=[1] * 4),
             helper.make_node("GlobalAveragePool", ["up"], ["gap"]),
             helper.make_node("Add", ["avg", "gap"], ["sum"]),
             helper.make_node("Mul", ["sum", "k"], ["scaled"]),
             helper.make_node("Concat", ["scaled", "up"], ["y"], axis=1)]
    return model(nodes, {"x": SHAPE}, {"y": [1, 4, 12, 12]}, {"k": np.float32(3.0)})


@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(magnitude=st.floats(-6, 6), spread=st.floats(0, 8), scheme=st.sampled_from(
    ["symmetric", "asymmetric", "pow2_symmetric"]), wide=st.booleans())
def test_no_requantization_leaves_int64(magnitude, spread, scheme, wide):
    """Calibrated ranges from 1e-6 to 1e6 and inputs at both ends of the integer range."""
    rng = np.random.default_rng(0)
    m = layers_model()
    feeds = [{"x": (rng.uniform(-1, 1, SHAPE) * 10.0 ** magnitude
                    * 10.0 ** rng.uniform(0, spread, SHAPE)).astype(np.float32)} for _ in range(2)]
    int16 = frozenset({"x", "up", "avg", "gap", "sum", "scaled", "y"}) if wide else frozenset()
    qg, _, _ = quantize(m, feeds, scheme=scheme, int16_tensors=int16)
    t = qg.tensors["x"]
    for value in np.iinfo(np.dtype(t.dtype)).min, np.iinfo(np.dtype(t.dtype)).max:
        env = run_reference(qg, {"x": np.full(SHAPE, value, np.dtype(t.dtype))})
        assert env["y"].shape == (1, 4, 12, 12)


def test_a_left_shifting_channel_leaves_the_other_channels_products_whole():
    """Per-channel shifts where one channel's real multiplier is above 1 (a negative shift)
    and the others' far below (shift 38): the left shift's clip to ±2^31 applied to every
    channel's product, so ``3,794 · 1,682,477,346 / 2^38 = 23`` read as ``2^31 / 2^38 = 0``
    (the BlazePose detector's conv2d_22: 255 LSB from ONNX Runtime, a failed quantize)."""
    from npubuild.quant.schemes import requantize

    acc = np.array([[3794, 5432], [3794, 5432]], np.int64)
    multiplier = np.array([[1682477346], [1500000000]], np.int64)
    shift = np.array([[38], [-3]], np.int64)
    got = requantize(acc, multiplier, shift, -128, -128, 127, "int8", "half_even")
    expected = np.clip(np.rint(acc * (multiplier * 2.0 ** -shift)) - 128, -128, 127)
    np.testing.assert_array_equal(got, expected.astype(np.int8))
    assert got[0].tolist() == [-105, -95]
