"""Calibration statistics and the four range-selection methods."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from npubuild.quant.calibrators import (CALIBRATORS, HIST_BINS, CalibrationOptions, TensorStats,
                                        calibrated_range)

OPTIONS = CalibrationOptions()


def heavy_tailed(seed=0, n=200_000):
    rng = np.random.default_rng(seed)
    x = rng.normal(0, 1, n)
    x[:20] = rng.uniform(20, 40, 20)  # a few outliers
    return x.astype(np.float32)


def observed(chunks, histogram=True):
    stats = TensorStats(with_histogram=histogram)
    for c in chunks:
        stats.update(c)
    return stats


def test_histogram_range_doubling_is_exact():
    rng = np.random.default_rng(1)
    chunks = [rng.normal(0, s, 5000).astype(np.float32) for s in (0.01, 0.3, 5.0, 80.0)]
    stats = observed(chunks)
    direct, _ = np.histogram(np.concatenate(chunks), bins=HIST_BINS, range=(-stats.range, stats.range))
    assert stats.hist.sum() == sum(c.size for c in chunks)
    assert np.array_equal(stats.hist, direct)
    assert stats.hist.size == HIST_BINS  # bounded memory whatever flows through


def test_channel_means():
    x = np.arange(24, dtype=np.float32).reshape(1, 2, 3, 4)
    stats = TensorStats(channel_axis=1)
    stats.update(x)
    stats.update(x + 1)
    assert np.allclose(stats.channel_mean, [6.0, 18.0])


def test_methods_are_registered_by_their_recipe_names():
    assert set(CALIBRATORS.names()) == {"minmax", "percentile", "kl", "mse"}


@pytest.mark.parametrize("method", ["percentile", "kl"])
def test_clipping_methods_cut_outliers(method):
    stats = observed([heavy_tailed()])
    lo, hi = calibrated_range(stats, method, "symmetric", OPTIONS)
    assert -hi == lo
    assert 2.0 < hi < 20.0, (method, hi)


def test_mse_clips_a_long_tail_but_keeps_rare_far_outliers():
    """Squared error: a Laplace tail is cheaper clipped; 20 values at 20-40 are not."""
    laplace = np.random.default_rng(3).laplace(0, 1, 1_000_000).astype(np.float32)
    stats = observed([laplace])
    hi = calibrated_range(stats, "mse", "symmetric", OPTIONS)[1]
    assert 4.0 < hi < 0.8 * stats.absmax
    assert calibrated_range(observed([heavy_tailed()]), "mse", "symmetric", OPTIONS)[1] > 20


def test_minmax_keeps_everything():
    stats = observed([heavy_tailed()], histogram=False)
    lo, hi = calibrated_range(stats, "minmax", "symmetric", OPTIONS)
    assert (lo, hi) == (min(stats.min, 0), stats.max)


def test_asymmetric_ranges_follow_each_side():
    x = np.random.default_rng(2).uniform(-0.3, 6.0, 100_000).astype(np.float32)
    stats = observed([x])
    for method in ("percentile", "kl", "mse"):
        lo, hi = calibrated_range(stats, method, "asymmetric", OPTIONS)
        assert -0.31 <= lo <= 0 and 3.0 < hi <= 6.01, (method, lo, hi)


def test_pow2_mse_picks_a_power_of_two_range():
    stats = observed([heavy_tailed()])
    _, hi = calibrated_range(stats, "mse", "pow2_symmetric", OPTIONS)
    assert np.log2(hi / 128) == int(np.log2(hi / 128))


def test_percentile_option():
    stats = observed([heavy_tailed()])
    loose = calibrated_range(stats, "percentile", "symmetric", CalibrationOptions(percentile=99.999))[1]
    tight = calibrated_range(stats, "percentile", "symmetric", CalibrationOptions(percentile=99.0))[1]
    assert tight < loose


def test_int16_tensors_keep_the_observed_range():
    stats = observed([heavy_tailed()])
    assert calibrated_range(stats, "kl", "symmetric", CalibrationOptions(dtype="int16"))[1] == stats.max


INT16 = CalibrationOptions(dtype="int16")


def test_int16_ranges_reach_past_calibration_as_far_as_the_samples_extremes_spread():
    """Per side: the largest sample extreme plus how far the extremes moved between samples;
    samples that agree get no headroom, and none more than the extreme itself (one bit)."""
    same = observed([np.array([-2.0, 0.5, 3.0]), np.array([-2.0, 1.0, 3.0])])
    assert calibrated_range(same, "minmax", "asymmetric", INT16) == (-2.0, 3.0)
    spread = observed([np.array([-1.0, 2.0]), np.array([-4.0, 3.0]), np.array([-1.5, 1.0])])
    assert calibrated_range(spread, "minmax", "asymmetric", INT16) == (-7.0, 5.0)
    assert calibrated_range(spread, "minmax", "asymmetric", OPTIONS) == (-4.0, 3.0)  # int8: as is
    far = observed([np.array([-1.0, 0.0]), np.array([0.0, 10.0])])  # a sample never above 0
    assert calibrated_range(far, "minmax", "asymmetric", INT16) == (-2.0, 20.0)
    negative = observed([np.array([-3.0, -1.0]), np.array([-2.0, -0.5])])  # never above 0
    assert calibrated_range(negative, "minmax", "asymmetric", INT16) == (-4.0, 0.0)
    assert calibrated_range(TensorStats(), "minmax", "asymmetric", INT16) == (0.0, 0.0)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.sampled_from([0.0, 1e-9, 3e-7, 0.02, 1.5, 40.0, 900.0]), min_size=1, max_size=12),
       st.integers(min_value=1, max_value=5), st.integers(min_value=0, max_value=2 ** 16))
# Found by Hypothesis: values of 1e-9 after a 900 (a 2048 range) once fell into the middle bin
# from either side depending on the batch.
@example(scales=[0.0] * 7 + [900.0, 1e-09], batch=1, seed=20473)
def test_batch_statistics_merge_into_exactly_the_one_pass_histogram(scales, batch, seed):
    rng = np.random.default_rng(seed)
    samples = [rng.normal(size=(1, 3, 4, 4)) * s for s in scales]
    one_pass = TensorStats(with_histogram=True)
    for x in samples:
        one_pass.update(x)
    merged = TensorStats(with_histogram=True)
    for start in range(0, len(samples), batch):
        part = TensorStats(with_histogram=True)
        for x in samples[start:start + batch]:
            part.update(x)
        merged.merge(part)
    assert (merged.min, merged.max, merged.count) == (one_pass.min, one_pass.max, one_pass.count)
    assert ((merged.sample_max_low, merged.sample_min_high)
            == (one_pass.sample_max_low, one_pass.sample_min_high))
    assert ((merged.sample_typical_low, merged.sample_typical_high)
            == (one_pass.sample_typical_low, one_pass.sample_typical_high))
    assert merged.range == one_pass.range
    if one_pass.hist is None:
        assert merged.hist is None and merged.pending_zeros == one_pass.pending_zeros
    else:
        assert np.array_equal(merged.hist, one_pass.hist)


def _kl_divergence_spelled_out(counts: np.ndarray, i: int) -> float:
    """KL(P || Q) at threshold bin ``i`` as first written: the reference for the figures the
    search computes (every chunk's bounds again, the positive bins masked out)."""
    p = counts[:i].copy()
    p[-1] += counts[i:].sum()
    nonzero = p > 0
    bounds = np.linspace(0, i, 129).astype(np.int64)
    starts = bounds[:-1]
    chunk_sums = np.add.reduceat(counts[:i], starts)
    chunk_nonzero = np.add.reduceat(nonzero.astype(np.float64), starts)
    per_bin = np.divide(chunk_sums, chunk_nonzero, out=np.zeros_like(chunk_sums),
                        where=chunk_nonzero > 0)
    q = np.repeat(per_bin, np.diff(bounds)) * nonzero
    if q.sum() == 0:
        return float("inf")

    def smooth(dist, eps=1e-4):
        zeros = dist == 0
        n_zero, n_nonzero = int(zeros.sum()), int((~zeros).sum())
        if n_nonzero == 0:
            return None
        out = dist + eps * zeros - (eps * n_zero / n_nonzero) * ~zeros
        return out if (out > 0).all() else None

    pn, qn = smooth(p / p.sum()), smooth(q / q.sum())
    if pn is None or qn is None:
        return float("inf")
    mask = pn > 0
    return float(np.sum(pn[mask] * np.log(pn[mask] / qn[mask])))


@pytest.mark.parametrize("seed", range(6))
def test_kl_figures_and_thresholds_are_those_spelled_out(seed):
    """The KL search keeps each threshold's chunks between tensors and judges a threshold
    once: every divergence is the same float as the formula spelled out, so the threshold
    (and the range) is too; histograms with empty runs, a long tail and a single spike."""
    from npubuild.quant import calibrators

    rng = np.random.default_rng(seed)
    counts = np.floor(rng.pareto(1.0 + seed / 3, HIST_BINS // 2) * 50)
    counts[rng.random(counts.size) < 0.2 * seed] = 0.0  # empty bins, none to most
    counts[-1] += 3.0  # the tail reaches the last bin
    for i in (128, 129, 300, 511, 777, counts.size):
        assert calibrators._kl_divergence(counts, i) == _kl_divergence_spelled_out(counts, i)
    spike = np.zeros(HIST_BINS // 2)
    spike[700] = 5.0
    for i in (128, 700, 701):
        assert calibrators._kl_divergence(spike, i) == _kl_divergence_spelled_out(spike, i)

    candidates = range(128, counts.size + 1)
    step = max(1, len(candidates) // 48)
    grid = list(candidates[::step]) + [candidates[-1]]
    best = min(grid, key=lambda i: _kl_divergence_spelled_out(counts, i))
    fine = range(max(128, best - step + 1), min(candidates[-1], best + step - 1) + 1)
    assert calibrators._kl_search(counts, candidates, 48) == min(
        [best, *fine], key=lambda i: _kl_divergence_spelled_out(counts, i))


def _mse_asymmetric_spelled_out(stats, levels: int) -> tuple[float, float]:
    """The asymmetric MSE range as first written: every bin's error, empty or not."""
    width = 2 * stats.range / HIST_BINS
    centers = -stats.range + (np.arange(HIST_BINS) + 0.5) * width
    lo0, hi0 = min(stats.min, 0.0), max(stats.max, 0.0)
    alphas = np.arange(1, 129) / 128
    los, his = lo0 * alphas, hi0 * alphas
    steps = (his - los) / levels
    below = np.maximum(los[:, None] - centers[None, :], 0.0) ** 2
    above = np.maximum(centers[None, :] - his[:, None], 0.0) ** 2
    noise = (steps[:, None] ** 2) / 12.0
    errors = np.where((below == 0) & (above == 0), noise, below + above)
    err = np.sum(errors * np.asarray(stats.hist, np.float64)[None, :], axis=1)
    k = int(np.argmin(err))
    return float(los[k]), float(his[k])


@pytest.mark.parametrize("seed", range(8))
def test_asymmetric_mse_ranges_are_those_spelled_out(seed):
    """The asymmetric MSE search computes the errors of the bins values fell in (the others
    weigh 0): the same range, to the bit, as every bin's errors summed; after a ReLU (half
    the bins empty), on both signs, with outliers, and at int16's levels."""
    from npubuild.quant import calibrators

    rng = np.random.default_rng(seed)
    x = rng.normal(seed - 4, 1 + seed, 50_000) * 10.0 ** (seed % 4 - 2)
    if seed % 2:
        x = np.maximum(x, 0.0)  # a ReLU's output
    x[:5] = rng.uniform(-30, 90, 5) * 10.0 ** (seed % 4 - 2)  # outliers
    stats = observed([x.astype(np.float32)])
    for levels in (255, 65535):
        assert calibrators._mse_asymmetric(stats, levels) == \
            _mse_asymmetric_spelled_out(stats, levels)


def test_a_float_model_computing_nan_names_the_tensor_the_sample_and_what_to_check():
    """chython-rxnmap stopped in calibration on "tensor ... has NaN or Inf values in the float
    model" with no hint: which node, how many values, and that the data are what to look at."""
    from npubuild.errors import BuildError
    from npubuild.quant import calibrate
    from npubuild.quant.lower import lower
    from onnx import helper

    from tests.unit.quant.helpers import model

    m = model([helper.make_node("Log", ["x"], ["y"], name="log_of_x"),
               helper.make_node("Relu", ["y"], ["z"], name="relu")], {"x": [1, 4]}, {"z": [1, 4]})
    fg, probe = lower(m)
    good = {"x": np.array([[1.0, 2.0, 3.0, 4.0]], np.float32)}
    padded = {"x": np.array([[1.0, 2.0, 0.0, 0.0]], np.float32)}  # log(0) = -inf
    with pytest.raises(BuildError) as caught:
        calibrate.observe(fg, probe, [good, padded], "minmax")
    message = str(caught.value)
    assert "tensor 'y'" in message and "log_of_x" in message
    assert "2 NaN or Inf values of 4" in message
    assert "zero padding" in caught.value.hint
