"""`schemes.fixed_point_array` computes on whole arrays what `schemes.fixed_point` gives one
factor at a time: the same multipliers and shifts, bit for bit (a conv's requantization
factors, one per output channel, in every quantization the precision search builds)."""

from __future__ import annotations

import numpy as np
import pytest

from npubuild.quant import schemes


def _edge_cases() -> np.ndarray:
    tiny = np.finfo(np.float64).tiny
    return np.array([0.0, -0.0, 1.0, -1.0, 0.5, 2.0 ** -70, -(2.0 ** -40), 3.0, 1 - 2 ** -40,
                     2 ** -31 * (1 - 2 ** -40), 1e-25, -3e-22, 7e15, tiny, tiny / 8, np.inf,
                     -np.inf, np.nan, 0.1, -0.7, 2.0 ** -62, 2.0 ** -63 * 3])


@pytest.mark.parametrize("bits", [1, 8, 15, 24, 31])
@pytest.mark.parametrize("round_up", [False, True])
def test_the_array_form_gives_each_factor_what_fixed_point_gives_it(bits, round_up):
    rng = np.random.default_rng(bits)
    reals = np.concatenate([
        _edge_cases(),
        rng.normal(0, 1, 500) * 2.0 ** rng.integers(-80, 20, 500),
        (rng.integers(1, 1 << 20, 200) + 0.5) * 2.0 ** -rng.integers(20, 45, 200)])  # ties
    m, n = schemes.fixed_point_array(reals.reshape(-1, 2), bits=bits, round_up=round_up)
    assert m.dtype == n.dtype == np.int64 and m.shape == n.shape == (reals.size // 2, 2)
    want = [schemes.fixed_point(r, bits=bits, round_up=round_up) for r in reals]
    assert m.ravel().tolist() == [w[0] for w in want]
    assert n.ravel().tolist() == [w[1] for w in want]


def test_a_scalar_keeps_its_shape():
    m, n = schemes.fixed_point_array(0.3)
    assert m.shape == n.shape == () and (int(m), int(n)) == schemes.fixed_point(0.3)
