"""Calibration: observe activations, then choose each tensor's range.

``TensorStats`` keeps, per tensor, the running min/max and (for the methods that need it) a
fixed-size histogram over ``[-R, R)`` with ``R`` a power of two. When a value outside the range
arrives, ``R`` doubles and adjacent bins merge pairwise, which is exact, so memory stays
``HIST_BINS`` counts per tensor however many samples flow through.

``CALIBRATORS`` maps the method names recipes use (``calibration.method``) to functions
``(stats, scheme, options) -> (lo, hi)``: the real range the scheme then maps onto integers.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from npubuild.quant import schemes
from npubuild.registry import Registry

HIST_BINS = 2048  # over [-R, R): 1024 per sign
KL_QUANT_BINS = 128
KL_COARSE_CANDIDATES = 48
MSE_CANDIDATES = 128


@dataclass
class TensorStats:
    """Running min, max and (optionally) a signed histogram of one tensor."""

    with_histogram: bool = False
    min: float = float("inf")
    max: float = float("-inf")
    count: int = 0
    sum_abs: float = 0.0
    range: float = 0.0
    hist: np.ndarray | None = field(default=None, repr=False)
    channel_axis: int | None = None
    channel_sum: np.ndarray | None = field(default=None, repr=False)
    channel_min: np.ndarray | None = field(default=None, repr=False)
    channel_max: np.ndarray | None = field(default=None, repr=False)
    # The smallest per-sample maximum and the largest per-sample minimum (one ``update`` is one
    # sample): how far the extremes move from sample to sample (`wide_range`).
    sample_max_low: float = float("inf")
    sample_min_high: float = float("-inf")
    # The smallest and the largest per-sample median |x| (`lower_median_abs`): a power
    # spectrum whose quietest sample sits under a step of the range its loudest needs
    # (`npubuild.quant.quantizer.Quantizer.quiet_in_int16`).
    sample_typical_low: float = float("inf")
    sample_typical_high: float = 0.0
    # Zeros seen before the first non-zero value: the histogram's range is then chosen by the
    # first non-zero value alone, so it depends only on the largest |x|, never on which sample
    # came first, and statistics of sample batches merge into exactly the one-pass result.
    pending_zeros: int = 0
    # the input Gram matrices of the conv layers reading this tensor, by what they read of it
    # (GPTQ weight rounding, `npubuild.quant.rounding`)
    patch_grams: dict = field(default_factory=dict, repr=False)

    def update(self, x: np.ndarray) -> None:
        x = np.asarray(x)
        if x.size == 0:
            return
        lo, hi = float(x.min()), float(x.max())
        self.min, self.max = min(self.min, lo), max(self.max, hi)
        self.sample_max_low = min(self.sample_max_low, hi)
        self.sample_min_high = max(self.sample_min_high, lo)
        self.count += x.size
        self.sum_abs += float(np.abs(x).sum(dtype=np.float64))
        typical = lower_median_abs(x)
        self.sample_typical_low = min(self.sample_typical_low, typical)
        self.sample_typical_high = max(self.sample_typical_high, typical)
        if self.with_histogram:
            self._add_to_histogram(x.ravel(), max(-lo, hi))
        if self.channel_axis is not None:
            axes = tuple(a for a in range(x.ndim) if a != self.channel_axis % x.ndim)
            sums = x.sum(axis=axes, dtype=np.float64)
            self.channel_sum = sums if self.channel_sum is None else self.channel_sum + sums
            self._merge_channel_range(x.min(axis=axes).astype(np.float64),
                                      x.max(axis=axes).astype(np.float64))
        for gram in self.patch_grams.values():
            gram.update(x)

    def _merge_channel_range(self, lo: np.ndarray, hi: np.ndarray) -> None:
        self.channel_min = lo if self.channel_min is None else np.minimum(self.channel_min, lo)
        self.channel_max = hi if self.channel_max is None else np.maximum(self.channel_max, hi)

    @property
    def channel_span(self) -> np.ndarray | None:
        """max − min of each channel over everything observed (when ``channel_axis`` was set)."""
        return None if self.channel_min is None else self.channel_max - self.channel_min

    @property
    def channel_mean(self) -> np.ndarray | None:
        """Mean of each channel over everything observed (when ``channel_axis`` was set)."""
        if self.channel_sum is None:
            return None
        return self.channel_sum * (self.channel_sum.size / self.count)

    def _add_to_histogram(self, x: np.ndarray, absmax: float) -> None:
        if self.hist is None:
            if absmax == 0:
                self.pending_zeros += x.size
                return
            self._start_histogram(2.0 ** (np.floor(np.log2(absmax)) + 1))
        while absmax >= self.range:
            self._double_range()
        half = HIST_BINS // 2
        # floor, then + half: ``x · half/range`` is exact (a power-of-two factor), but adding
        # ``half`` first would round a tiny negative value up into the first positive bin, where
        # the same value observed with a finer range (another batch) and doubled does not land.
        idx = np.floor(x.astype(np.float64) * (half / self.range)).astype(np.int64) + half
        np.clip(idx, 0, HIST_BINS - 1, out=idx)
        self.hist += np.bincount(idx, minlength=HIST_BINS)

    def _start_histogram(self, value_range: float) -> None:
        self.hist = np.zeros(HIST_BINS, dtype=np.int64)
        self.range = float(value_range)
        self.hist[HIST_BINS // 2] += self.pending_zeros  # 0 always falls in the middle bin
        self.pending_zeros = 0

    def _double_range(self) -> None:
        self.hist = _doubled(self.hist)
        self.range *= 2

    def merge(self, later: "TensorStats") -> None:
        """Add the statistics of samples observed after these ones. Exact: merging the
        statistics of consecutive batches in order equals observing all samples in one pass
        with the same batches (min/max/counts/histograms exactly; channel sums add per batch)."""
        if later.count == 0:
            return
        self.min, self.max = min(self.min, later.min), max(self.max, later.max)
        self.sample_max_low = min(self.sample_max_low, later.sample_max_low)
        self.sample_min_high = max(self.sample_min_high, later.sample_min_high)
        self.sample_typical_low = min(self.sample_typical_low, later.sample_typical_low)
        self.sample_typical_high = max(self.sample_typical_high, later.sample_typical_high)
        self.count += later.count
        for geometry, gram in later.patch_grams.items():
            self.patch_grams.setdefault(geometry, type(gram)(geometry)).merge(gram)
        if later.channel_sum is not None:
            self.channel_sum = (later.channel_sum.copy() if self.channel_sum is None
                                else self.channel_sum + later.channel_sum)
            self._merge_channel_range(later.channel_min, later.channel_max)
        if not self.with_histogram:
            return
        if later.hist is None:
            if self.hist is None:
                self.pending_zeros += later.pending_zeros
            else:
                self.hist[HIST_BINS // 2] += later.pending_zeros
            return
        if self.hist is None:
            self._start_histogram(later.range)
        while self.range < later.range:
            self._double_range()
        hist, value_range = later.hist, later.range
        while value_range < self.range:
            hist, value_range = _doubled(hist), value_range * 2
        self.hist = self.hist + hist

    @property
    def mean_abs(self) -> float:
        """Mean of ``|x|`` over everything observed (0 before the first value): the typical
        magnitude, which one large outlier moves far less than the RMS."""
        return self.sum_abs / self.count if self.count else 0.0

    @property
    def typical_abs(self) -> float:
        """The median of ``|x|`` (from the histogram, to a bin; the mean without one): what
        most values look like, which a few large ones (a score map's rare detections beside
        thousands of near-zero scores) move no more than they move the count."""
        if self.hist is None or not self.hist.any():
            return self.mean_abs
        counts, width = self.abs_histogram()
        cdf = np.cumsum(counts)
        return float((np.searchsorted(cdf, 0.5 * cdf[-1]) + 0.5) * width)

    @property
    def absmax(self) -> float:
        return max(-self.min, self.max, 0.0)

    def abs_histogram(self) -> tuple[np.ndarray, float]:
        """Counts of ``|x|`` in ``HIST_BINS/2`` bins over ``[0, R)``, and the bin width."""
        half = HIST_BINS // 2
        folded = self.hist[half:] + self.hist[:half][::-1]
        return folded, self.range / half

    def as_dict(self) -> dict:
        return {"min": self.min, "max": self.max, "count": self.count}


MEDIAN_VALUES = 1 << 16  # a sample's median |x| is read on at most about this many values


def lower_median_abs(x: np.ndarray) -> float:
    """The lower median of ``|x|`` over its non-zero values (0 where there are none): a ReLU's
    zeros would put the median of a sample at 0 or just above it by chance. Over an evenly
    strided subset of at most about ``MEDIAN_VALUES`` values (a typical value, not an
    extreme: a feature map of millions costs a pass over tens of thousands) and by a
    partition, not a sort."""
    flat = np.ravel(x)
    values = np.abs(flat[::max(1, -(-flat.size // MEDIAN_VALUES))])
    values = values[values > 0]
    if not values.size:
        return 0.0
    middle = (values.size - 1) // 2
    return float(np.partition(values, middle)[middle])


def _doubled(hist: np.ndarray) -> np.ndarray:
    """The same counts over twice the range: adjacent bins merge pairwise (exact, since every
    range is a power of two and bin edges stay aligned)."""
    merged = hist.reshape(-1, 2).sum(axis=1)
    quarter = HIST_BINS // 4
    out = np.zeros(HIST_BINS, dtype=np.int64)
    out[quarter: quarter + merged.size] = merged
    return out


@dataclass(frozen=True)
class CalibrationOptions:
    percentile: float = 99.99
    dtype: str = "int8"


Calibrator = Callable[[TensorStats, str, CalibrationOptions], tuple[float, float]]
CALIBRATORS: Registry[Calibrator] = Registry("calibration method", "npubuild.calibrators")
NEEDS_HISTOGRAM = {"percentile", "kl", "mse"}


def calibrator(name: str):
    def decorate(fn: Calibrator) -> Calibrator:
        CALIBRATORS.register(name, fn)
        return fn
    return decorate


def _symmetric_or_clipped(stats: TensorStats, scheme: str, threshold: float) -> tuple[float, float]:
    """A symmetric threshold as a range: ``[-T, T]``, or the observed range clipped by it."""
    if scheme == "asymmetric":
        return max(stats.min, -threshold), min(stats.max, threshold)
    return -threshold, threshold


@calibrator("minmax")
def minmax(stats: TensorStats, scheme: str, options: CalibrationOptions) -> tuple[float, float]:
    """The observed minimum and maximum."""
    return min(stats.min, 0.0), max(stats.max, 0.0)


@calibrator("percentile")
def percentile(stats: TensorStats, scheme: str, options: CalibrationOptions) -> tuple[float, float]:
    """Clip at the given percentile of |x| (symmetric) or of each tail (asymmetric)."""
    if stats.hist is None or not stats.hist.any():
        return minmax(stats, scheme, options)
    p = options.percentile / 100.0
    if scheme != "asymmetric":
        counts, width = stats.abs_histogram()
        edge = _quantile_edge(counts, p) * width
        return -min(edge, stats.absmax), min(edge, stats.absmax)
    width = 2 * stats.range / HIST_BINS
    hi = -stats.range + _quantile_edge(stats.hist, p) * width
    lo = -stats.range + (HIST_BINS - _quantile_edge(stats.hist[::-1], p)) * width
    return max(stats.min, min(lo, 0.0)), min(stats.max, max(hi, 0.0))


def _quantile_edge(counts: np.ndarray, p: float) -> int:
    """Index of the first bin edge at or above a fraction ``p`` of the total count."""
    cdf = np.cumsum(counts)
    return int(np.searchsorted(cdf, p * cdf[-1], side="left")) + 1


@calibrator("kl")
def kl(stats: TensorStats, scheme: str, options: CalibrationOptions) -> tuple[float, float]:
    """The threshold minimising KL(P || Q) between the clipped distribution and its 128-level
    quantization (TensorRT's entropy calibration): a coarse search over 48 thresholds, then
    every bin around the best of them."""
    if stats.hist is None or not stats.hist.any():
        return minmax(stats, scheme, options)
    counts, width = stats.abs_histogram()
    last = int(np.nonzero(counts)[0][-1]) + 1
    if last <= KL_QUANT_BINS:
        return minmax(stats, scheme, options)
    counts = counts[:last].astype(np.float64)
    best = _kl_search(counts, range(KL_QUANT_BINS, last + 1), KL_COARSE_CANDIDATES)
    return _symmetric_or_clipped(stats, scheme, min(best * width, stats.absmax))


def _kl_search(counts: np.ndarray, candidates: range, coarse: int) -> int:
    step = max(1, len(candidates) // coarse)
    grid = list(candidates[::step]) + [candidates[-1]]
    divergences: dict[int, float] = {}  # the coarse best is among the fine candidates too

    def divergence(i: int) -> float:
        if i not in divergences:
            divergences[i] = _kl_divergence(counts, i)
        return divergences[i]

    best = min(grid, key=divergence)
    fine = range(max(candidates[0], best - step + 1), min(candidates[-1], best + step - 1) + 1)
    return min([best, *fine], key=divergence)


@functools.lru_cache(maxsize=None)
def _kl_chunks(i: int) -> tuple[np.ndarray, np.ndarray]:
    """The first bin and the length of each of the 128 chunks of ``i`` bins (the same for
    every tensor's threshold at bin ``i``: read only)."""
    bounds = np.linspace(0, i, KL_QUANT_BINS + 1).astype(np.int64)
    starts, lengths = bounds[:-1].copy(), np.diff(bounds)
    starts.flags.writeable = lengths.flags.writeable = False
    return starts, lengths


def _kl_divergence(counts: np.ndarray, i: int) -> float:
    """KL(P || Q) for threshold bin ``i``: P clips the tail into its last bin, Q spreads each of
    128 chunks of the unclipped bins over the chunk's non-empty bins; both smoothed."""
    p = counts[:i].copy()
    p[-1] += counts[i:].sum()
    nonzero = p > 0
    starts, lengths = _kl_chunks(i)
    chunk_sums = np.add.reduceat(counts[:i], starts)
    chunk_nonzero = np.add.reduceat(nonzero.astype(np.float64), starts)
    per_bin = np.divide(chunk_sums, chunk_nonzero, out=np.zeros_like(chunk_sums),
                        where=chunk_nonzero > 0)
    q = np.repeat(per_bin, lengths) * nonzero
    q_total = q.sum()
    if q_total == 0:
        return float("inf")
    pn, qn = _smooth(p / p.sum()), _smooth(q / q_total)
    if pn is None or qn is None:
        return float("inf")
    # _smooth leaves every bin positive: the sum runs over all of them, as over those > 0
    return float(np.sum(pn * np.log(pn / qn)))


def _smooth(dist: np.ndarray, eps: float = 1e-4) -> np.ndarray | None:
    """Move ``eps`` into every empty bin, taken evenly from the others (TensorRT's smoothing);
    None where that leaves a bin at or below zero."""
    zeros = dist == 0
    n_zero = int(np.count_nonzero(zeros))
    n_nonzero = dist.size - n_zero
    if n_nonzero == 0:
        return None
    out = dist + eps * zeros - (eps * n_zero / n_nonzero) * ~zeros
    return out if (out > 0).all() else None


@calibrator("mse")
def mse(stats: TensorStats, scheme: str, options: CalibrationOptions) -> tuple[float, float]:
    """The range minimising the expected squared quantization error over the histogram:
    clipping error for values outside, step²/12 rounding noise inside. For pow2 the candidates
    are the power-of-two ranges."""
    if stats.hist is None or not stats.hist.any():
        return minmax(stats, scheme, options)
    qmin, qmax = schemes.qrange(options.dtype)
    if scheme == "asymmetric":
        return _mse_asymmetric(stats, qmax - qmin)
    counts, width = stats.abs_histogram()
    centers = (np.arange(counts.size) + 0.5) * width
    absmax = stats.absmax
    if scheme == "pow2_symmetric":
        top = schemes.log2scale_for(absmax, options.dtype)
        thresholds = (-qmin) * 2.0 ** -np.arange(top, top + 8, dtype=np.float64)
    else:
        thresholds = absmax * np.arange(1, MSE_CANDIDATES + 1) / MSE_CANDIDATES
    steps = thresholds / (-qmin if scheme == "pow2_symmetric" else qmax)
    clipped = np.maximum(centers[None, :] - thresholds[:, None], 0.0) ** 2
    inside = centers[None, :] <= thresholds[:, None]
    err = _weighted_rows(np.where(inside, (steps[:, None] ** 2) / 12.0, clipped), counts)
    best = float(thresholds[int(np.argmin(err))])
    if scheme != "pow2_symmetric":
        best = min(best, absmax)
    return -best, best


def _mse_asymmetric(stats: TensorStats, levels: int) -> tuple[float, float]:
    width = 2 * stats.range / HIST_BINS
    centers = -stats.range + (np.arange(HIST_BINS) + 0.5) * width
    lo0, hi0 = min(stats.min, 0.0), max(stats.max, 0.0)
    alphas = np.arange(1, MSE_CANDIDATES + 1) / MSE_CANDIDATES
    los, his = lo0 * alphas, hi0 * alphas
    steps = (his - los) / levels
    # A bin no value fell in weighs its error by 0: only the others' errors are computed
    # (each the same float), the empty bins' products left at the 0 they come to, so each
    # row sums the same array. Not where an error could overflow (inf · 0 is NaN).
    reach = abs(lo0) + abs(hi0) + 2 * stats.range  # no centre-to-bound distance exceeds it
    seen = np.flatnonzero(stats.hist) if math.isfinite(reach * reach) else np.arange(HIST_BINS)
    at = centers[seen]
    below = np.maximum(los[:, None] - at[None, :], 0.0) ** 2
    above = np.maximum(at[None, :] - his[:, None], 0.0) ** 2
    noise = (steps[:, None] ** 2) / 12.0
    errors = np.where((below == 0) & (above == 0), noise, below + above)
    weighted = np.zeros((MSE_CANDIDATES, HIST_BINS))
    weighted[:, seen] = errors * np.asarray(stats.hist, np.float64)[seen][None, :]
    err = np.sum(weighted, axis=1)  # `_weighted_rows`: pairwise sums along each row
    k = int(np.argmin(err))
    return float(los[k]), float(his[k])


def _weighted_rows(errors: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """Each row of ``errors`` summed with ``counts`` as weights, by NumPy's pairwise summation:
    a BLAS matrix-vector product splits rows over its threads, so a near tie between two
    candidate ranges could go either way with the core count (`npubuild.metrics.dot`)."""
    return np.sum(errors * np.asarray(counts, np.float64)[None, :], axis=1)


def wide_range(stats: TensorStats) -> tuple[float, float]:
    """An int16 tensor's range: everything calibration saw, and past it on each side as far as
    that side's extreme moved between calibration samples (the largest sample's maximum minus
    the smallest's, at most the extreme itself: one of the eight bits int16 adds to int8, so
    it keeps 128 times int8's resolution).

    With the observed range alone int16 spends all of its extra bits on resolution and none on
    data calibration did not cover: a verify image unlike the calibration images (MediaPipe's
    landscape selfie model on coins.png: a squeeze-excite ReLU at 2.88 where calibration saw
    2.41, a conv at -10.8 where it saw -6.1) saturates int16 exactly where it saturates int8,
    and int16 everywhere could not pass (0.798 on that image with int16 weights too; ONNX
    Runtime's own int16 QDQ 0.798). Calibration samples whose extremes agree (text lines) get
    little headroom, samples that differ (photos of different scenes) the most; the quantizer
    stops it where the producing layer's function does (`Quantizer._reachable`). ``(0, 0)``
    before any sample."""
    if stats.count == 0:
        return 0.0, 0.0
    lo, hi = min(stats.min, 0.0), max(stats.max, 0.0)
    return (lo - (min(stats.sample_min_high, 0.0) - lo), hi + (hi - max(stats.sample_max_low, 0.0)))


def calibrated_range(stats: TensorStats, method: str, scheme: str,
                     options: CalibrationOptions) -> tuple[float, float]:
    """The range ``method`` chooses; int16 tensors keep the full observed range and some
    headroom past it (`wide_range`)."""
    if options.dtype != "int8":
        return wide_range(stats)
    if stats.count == 0:
        return 0.0, 0.0
    return CALIBRATORS[method](stats, scheme, options)
