"""The integer reference's conv accumulator is exact in float32 where no partial sum can reach
2^24 and falls back to float64 where one can: the two give the same integers."""

from __future__ import annotations

import numpy as np
import pytest

from npubuild.quant import reference
from npubuild.quant.qgraph import QLayer


def _layer(weight: np.ndarray, group: int, zp: int, k: int, stride: int) -> QLayer:
    attrs = {"kernel": [k, k], "stride": [stride, stride], "pads": [k // 2] * 4, "group": group}
    return QLayer("conv", "conv", [], [], attrs, {"input_zp": zp},
                  {"weight": weight, "bias": np.zeros(weight.shape[0], np.int32)})


def _in_float64(layer: QLayer, x: np.ndarray, monkeypatch) -> np.ndarray:
    with monkeypatch.context() as m:
        m.setattr(reference, "_exact_float", lambda xs, w: np.float64)
        return reference.conv_accumulator(layer, x)


@pytest.mark.parametrize("seed", range(24))
def test_float32_accumulators_equal_the_float64_ones(seed, monkeypatch):
    rng = np.random.default_rng(seed)
    cin, k = int(rng.integers(1, 48)), int(rng.choice([1, 3, 5]))
    depthwise = seed % 3 == 0
    cout, group = (cin, cin) if depthwise else (int(rng.integers(1, 48)), 1)
    weight = rng.integers(-127, 128, (cout, cin // group, k, k)).astype(np.int8)
    dtype = np.int16 if seed % 4 == 0 else np.int8
    info = np.iinfo(dtype)
    x = rng.integers(info.min, info.max + 1, (1, cin, 11, 13)).astype(dtype)
    layer = _layer(weight, group, int(rng.integers(-8, 8)), k, 1 + seed % 2)
    np.testing.assert_array_equal(reference.conv_accumulator(layer, x),
                                  _in_float64(layer, x, monkeypatch))


def test_float32_is_used_only_below_two_to_the_24():
    light = np.full((4, 8, 3, 3), 10, np.int8)  # Σ|w| = 720 per output channel
    assert reference._exact_float(np.full((1, 8, 5, 5), 127.0), light) is np.float32
    assert reference._exact_float(np.full((1, 8, 5, 5), 32767.0), light) is np.float64


def test_an_accumulator_beyond_float32_stays_exact(monkeypatch):
    """int16 activations at full scale through heavy weights: sums of ~2^30, where float32
    would round; the reference takes float64 and matches exact integer arithmetic."""
    weight = np.full((2, 64, 3, 3), 127, np.int8)
    x = np.full((1, 64, 6, 6), 32767, np.int16)
    x[0, 0, 0, 0] = 32766  # an odd sum float32 could not hold
    layer = _layer(weight, 1, 0, 3, 1)
    got = reference.conv_accumulator(layer, x)
    window = np.pad(x.astype(np.int64), ((0, 0), (0, 0), (1, 1), (1, 1)))[0, :, 0:3, 0:3]
    assert got[0, 0, 0, 0] == int((window * 127).sum())
    assert abs(got[0, 0, 0, 0]) > reference.FLOAT32_EXACT
