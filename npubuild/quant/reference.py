"""The integer reference: every NPU layer of a ``QGraph`` computed exactly.

The arithmetic is the one defined in ``npubuild.quant.schemes`` (rounding per the layer's
``params.rounding``, saturation);
this module only arranges it per layer kind. ``run_reference(qgraph, int_inputs)`` returns every
tensor. The compile stage's simulator must match it bit for bit and may call the kernels
directly on pieces of activations:

- Spatial kernels (``conv2d``, ``maxpool2d``, ``avgpool2d``) take ``pads=(top, bottom, left,
  right)`` separately from the layer's own ``attrs["pads"]``. Given the input rows a slice of
  output rows needs (``input_rows`` computes them and the slice's own padding), they return
  exactly those rows of the full result; avgpool's divisor counts only non-padding positions
  (``count_include_pad=0``) so it is right for slices too.
- ``resize`` takes ``out_rows=(r0, r1)`` and ``in_row0`` (the first input row of ``x``);
  ``resize_input_rows`` says which input rows those output rows read.
- Element-wise kernels (add, mul, rescale, lut, concat on a non-H axis) work on any slice.

Exactness: a convolution's products of integers are summed by float matrix products
(`_matmul_sums`), which are exact while every partial sum, in any order, stays an integer the
float type holds: float32 when ``max|x| · Σ_k |w_k| < 2^24`` for every output channel (K is cut
into chunks that each keep the bound, and the chunks' sums are added in int64), float64
otherwise (2^53). Depthwise convolutions sum their taps in int64. The sums are then
requantized in integer arithmetic.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from functools import lru_cache
from typing import Callable, Mapping, Sequence

import numpy as np
from numpy.lib.stride_tricks import as_strided

from npubuild.errors import BuildError, working_on
from npubuild.quant import schemes
from npubuild.quant.qgraph import QGraph, QLayer
from npubuild.threads import one_blas_thread

Kernel = Callable[[QLayer, Sequence[np.ndarray]], list[np.ndarray]]


def _requant(layer: QLayer, acc, multiplier, shift) -> np.ndarray:
    p = layer.params
    return schemes.requantize(acc, multiplier, shift, p["output_zp"], p["qmin"], p["qmax"],
                              p.get("output_dtype", "int8"), p.get("rounding", "half_up"))


def _rounded_to_output(layer: QLayer, values: np.ndarray) -> np.ndarray:
    """Float64 values in output steps (a layer whose normalization is float: `layernorm`,
    `lrn`) rounded once as the layer's scheme rounds, shifted by the output's zero point and
    clipped to its range."""
    p = layer.params
    rounded = (schemes.round_half_up(values) if p.get("rounding", "half_up") == "half_up"
               else schemes.round_half_even(values))
    out = np.clip(rounded + p["output_zp"], p["qmin"], p["qmax"])
    return out.astype(schemes.DTYPES[p.get("output_dtype", "int8")])


def _channel(values: np.ndarray, ndim: int, axis: int = 1) -> np.ndarray:
    shape = [1] * ndim
    shape[axis] = -1
    return np.asarray(values).reshape(shape)


# ---- convolution -------------------------------------------------------------------------

def conv2d(layer: QLayer, x: np.ndarray, pads: Sequence[int] | None = None) -> np.ndarray:
    """Integer Conv (any group, dilation, stride) or fully connected layer (``attrs.fc``).

    ``x``: int [N, Cin, H, W]; ``pads``: (top, bottom, left, right), default the layer's own.
    Returns int [N, Cout, OH, OW] with ``OH = (H + top + bottom - dh·(kh-1) - 1) // sh + 1``.
    """
    acc = _conv_sums(layer, x, pads)
    axis = acc.ndim - 1 if layer.attrs.get("fc") else 1
    return _requant(layer, acc, _channel(layer.arrays["multiplier"], acc.ndim, axis),
                    _channel(layer.arrays["shift"], acc.ndim, axis))


def conv_accumulator(layer: QLayer, x: np.ndarray, pads: Sequence[int] | None = None) -> np.ndarray:
    """The int64 accumulator ``Σ (x - zp)·w + bias`` of a conv layer, before requantization."""
    return _conv_sums(layer, x, pads).astype(np.int64, copy=False)


def _conv_sums(layer: QLayer, x: np.ndarray, pads: Sequence[int] | None) -> np.ndarray:
    """The accumulator as exact integers: float64 (below 2^53, as `_matmul_sums` gives them)
    or int64; `schemes.requantize` takes either."""
    a, p = layer.attrs, layer.params
    weight = layer.arrays["weight"]
    bias = layer.arrays["bias"]
    xs = _centered(np.asarray(x), p["input_zp"])
    x_max = float(np.abs(xs).max()) if xs.size else 0.0
    if a.get("fc"):
        flat = weight.reshape(weight.shape[0], -1)
        if xs.ndim == 1:
            acc = _matmul_sums(flat, xs[:, None], x_max)[:, 0]
        else:
            acc = np.swapaxes(_matmul_sums(flat, np.swapaxes(xs, -1, -2), x_max), -1, -2)
        return _plus_bias(acc, bias)
    xs = pad_spatial(xs, pads or a["pads"], 0.0)
    group = a["group"]
    cout, cin_g = weight.shape[:2]
    if cin_g == 1 and group > 1:
        acc = _depthwise(xs, weight, a, group, x_max)
    elif group == 1:
        acc = _dense(xs, weight, a, x_max)
    else:
        parts = [_dense(xs[:, g * cin_g:(g + 1) * cin_g],
                        weight[g * (cout // group):(g + 1) * (cout // group)], a, x_max)
                 for g in range(group)]
        kind = np.int64 if any(part.dtype == np.int64 for part in parts) else np.float64
        acc = np.concatenate([part.astype(kind, copy=False) for part in parts], axis=1)
    return _plus_bias(acc, _channel(bias, 4))


def _plus_bias(acc: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """``acc + bias``, still exact: in float64 while both stay below 2^53, else in int64."""
    bias_max = float(np.abs(bias).max()) if bias.size else 0.0
    if acc.dtype == np.float64 and (not acc.size or max(float(acc.max()), -float(acc.min()))
                                    + bias_max < FLOAT64_EXACT):
        acc += bias.astype(np.float64)
        return acc
    return acc.astype(np.int64) + bias.astype(np.int64)


def _centered(x: np.ndarray, zero_point: int) -> np.ndarray:
    """``x - zero_point`` as floats holding the exact integers: float32 for 8- and 16-bit
    activations (|x - zp| < 2^17, far inside float32's 2^24), else float32 or float64,
    whichever holds them exactly; the products are then summed by BLAS (`_matmul_sums`)."""
    if x.dtype.kind in "iu" and x.dtype.itemsize <= 2:
        xs = x.astype(np.float32)
        if zero_point:
            xs -= np.float32(zero_point)
        return xs
    xs = x.astype(np.int64) - int(zero_point)
    big = xs.size and float(np.abs(xs).max()) >= FLOAT32_EXACT
    return xs.astype(np.float64 if big else np.float32)


def pad_spatial(x: np.ndarray, pads: Sequence[int], value: float) -> np.ndarray:
    """``x`` [N, C, H, W] padded by ``pads`` (top, bottom, left, right) with ``value``."""
    top, bottom, left, right = (int(v) for v in pads)
    if not (top or bottom or left or right):
        return x
    return np.pad(x, ((0, 0), (0, 0), (top, bottom), (left, right)), constant_values=value)


def _out_size(size: int, k: int, s: int, d: int) -> int:
    return (size - d * (k - 1) - 1) // s + 1


def windows(x: np.ndarray, attrs: dict) -> np.ndarray:
    """A strided view [N, C, kh, kw, OH, OW] of the windows of an already padded ``x``."""
    (kh, kw), (sh, sw), (dh, dw) = attrs["kernel"], attrs["stride"], attrs.get("dilation", [1, 1])
    n, c, h, w = x.shape
    oh, ow = _out_size(h, kh, sh, dh), _out_size(w, kw, sw, dw)
    if oh <= 0 or ow <= 0:
        raise BuildError(f"input {h}x{w} is smaller than the {kh}x{kw} window")
    s = x.strides
    return as_strided(x, (n, c, kh, kw, oh, ow),
                      (s[0], s[1], s[2] * dh, s[3] * dw, s[2] * sh, s[3] * sw), writeable=False)


def _dense(x: np.ndarray, weight: np.ndarray, attrs: dict, x_max: float) -> np.ndarray:
    cout = weight.shape[0]
    w2 = weight.reshape(cout, -1)
    if tuple(attrs["kernel"]) == (1, 1) and tuple(attrs["stride"]) == (1, 1):
        n, c, h, w = x.shape
        return _matmul_sums(w2, x.reshape(n, c, h * w), x_max).reshape(n, cout, h, w)
    win = windows(x, attrs)
    n, c, kh, kw, oh, ow = win.shape
    cols = win.reshape(n, c * kh * kw, oh * ow)  # im2col: a copy of the strided windows
    return _matmul_sums(w2, cols, x_max).reshape(n, cout, oh, ow)


FLOAT32_EXACT = 2 ** 24  # every integer of magnitude up to this is a float32
FLOAT64_EXACT = 2 ** 53  # and up to this a float64
# More float32 runs than this and one float64 product is faster: an int16 activation (|x| up
# to 32,768) keeps only ~4 int8 weight columns per run, so a 3x3 conv over 128 channels (K =
# 1,152) took 263 runs, 4.6 s of CPU where float64 BLAS takes 0.4 s (M 128, P 20,000; the
# crossover measured at ~12 runs: 10 runs 0.19 s vs 0.24 s, 22 runs 0.37 s vs 0.19 s).
MAX_FLOAT32_RUNS = 8


def int_matmul(w: np.ndarray, x: np.ndarray, x_max: float | None = None) -> np.ndarray:
    """``w @ x`` exactly, as int64, for integer-valued ``w`` [M, K] and ``x`` [..., K, P]
    (``x_max``: a bound on ``|x|`` when the caller knows one)."""
    if x_max is None:
        x_max = float(np.abs(x).max()) if x.size else 0.0
    return _matmul_sums(w, x, x_max).astype(np.int64, copy=False)


def _matmul_sums(w: np.ndarray, x: np.ndarray, x_max: float) -> np.ndarray:
    """``w @ x`` as exact integers in float64 (or int64 past 2^53).

    float32 BLAS is exact while no partial sum can leave ±2^24 whatever the summation order:
    ``max|x| · Σ_k |w[m, k]|`` bounds every one. K is cut into the fewest runs of columns that
    each keep the bound, and their sums are added in float64; when even one column breaks it,
    or the bound needs more than `MAX_FLOAT32_RUNS` runs, the product runs in float64 BLAS
    (exact below 2^53, far beyond any int8/int16 accumulator), and past that in numpy's int64
    matmul (no BLAS). Every path gives the same exact integers.
    """
    row_max, cuts = _float32_plan(w, x_max)
    if cuts is None:
        return _exact_product(w, x, x_max * row_max)
    with one_blas_thread():
        w32, x32 = w.astype(np.float32), x.astype(np.float32, copy=False)
        acc = (w32[:, :cuts[1]] @ x32[..., :cuts[1], :]).astype(np.float64)
        for k0, k1 in zip(cuts[1:-1], cuts[2:]):
            acc += w32[:, k0:k1] @ x32[..., k0:k1, :]
        return acc


# Weights of at least this many values have their float32 plan remembered (`_float32_plan`):
# the same layer's weights come back every inference (the simulator reads them from LMEM anew),
# and planning ResNet-50's 25 M weights (abs, row sums, prefix sums per cut) cost more CPU than
# its products; hashing them costs ~1/20 of that.
PLAN_CACHED_FROM = 1 << 14
PLAN_CACHE_SIZE = 4096
_plans: OrderedDict = OrderedDict()
_plans_lock = threading.Lock()


def _float32_plan(w: np.ndarray, x_max: float) -> tuple[float, list[int] | None]:
    """``max_m Σ_k |w[m, k]|`` and the float32 column runs for activations up to ``x_max``
    (`_exact_chunks`; None: one float64 product). Planned for ``x_max`` rounded up to a power of
    two (runs that keep the bound for a larger ``x_max`` keep it for this one), and remembered
    by the weights' content for large weights: the plan is a function of the values alone."""
    bound = 0.0 if x_max <= 0 else float(2.0 ** np.ceil(np.log2(x_max)))
    if w.size < PLAN_CACHED_FROM:
        return _plan(w, bound)
    key = (w.shape, w.dtype.str, bound,
           hashlib.sha256(np.ascontiguousarray(w).view(np.uint8)).digest())
    with _plans_lock:
        if key in _plans:
            _plans.move_to_end(key)
            return _plans[key]
    plan = _plan(w, bound)
    with _plans_lock:
        _plans[key] = plan
        while len(_plans) > PLAN_CACHE_SIZE:
            _plans.popitem(last=False)
    return plan


def _plan(w: np.ndarray, x_max: float) -> tuple[float, list[int] | None]:
    w_abs = np.abs(w.astype(np.float64))
    row_max = float(w_abs.sum(axis=1).max(initial=0.0))
    return row_max, (_exact_chunks(w_abs, row_max, x_max, MAX_FLOAT32_RUNS)
                     if x_max < FLOAT32_EXACT else None)


def _exact_product(a: np.ndarray, b: np.ndarray, bound: float) -> np.ndarray:
    """``a @ b`` (numpy's matmul broadcasting) of integer-valued arrays whose every partial sum
    stays below ``bound`` in magnitude: float64 BLAS while that is below 2^53 (exact), else
    numpy's int64 matmul (no BLAS)."""
    if bound >= FLOAT64_EXACT:
        return np.matmul(np.asarray(a).astype(np.int64), np.asarray(b).astype(np.int64))
    with one_blas_thread():
        return np.matmul(np.asarray(a, np.float64), np.asarray(b, np.float64))


def _exact_chunks(w_abs: np.ndarray, row_max: float, x_max: float,
                  max_runs: int | None = None) -> list[int] | None:
    """Column cuts ``[0, k1, ..., K]`` whose runs keep ``x_max · Σ|w| < 2^24`` in every row;
    None when a single column already breaks the bound, or when more than ``max_runs`` runs
    would be needed (found after ``max_runs + 1`` cuts: each cut is a pass over the columns
    left, so cutting an int16 activation's K = 1,152 into its ~290 runs to throw them away
    cost a pass per run: 143 of the 160 s BirdNET's searched quantize spent judging int16)."""
    k = w_abs.shape[1]
    if x_max == 0 or k == 0:
        return [0, k]
    limit = FLOAT32_EXACT / x_max
    if row_max < limit:
        return [0, k]
    if float(w_abs.max(initial=0.0)) >= limit:
        return None
    if max_runs is not None and row_max >= max_runs * limit:
        return None  # every run's sum of that row is under the limit: it needs more runs
    prefix = np.concatenate([np.zeros((w_abs.shape[0], 1)), np.cumsum(w_abs, axis=1)], axis=1)
    cuts = [0]
    while cuts[-1] < k:  # the longest run from the last cut that stays under the limit
        if max_runs is not None and len(cuts) > max_runs:
            return None
        base = prefix[:, cuts[-1]][:, None]
        fits = (prefix[:, cuts[-1] + 1:] - base).max(axis=0) < limit  # runs of 1, 2, ...
        cuts.append(k if fits.all() else cuts[-1] + int(np.argmin(fits)))  # fits[0] holds
    return cuts


def _depthwise(x: np.ndarray, weight: np.ndarray, attrs: dict, group: int,
               x_max: float) -> np.ndarray:
    """Per-channel windows as kh·kw shifted multiply-adds (no window copy), in float32 when no
    sum can leave ±2^24 (as `_matmul_sums` argues), else in int64."""
    (kh, kw), (sh, sw), (dh, dw) = attrs["kernel"], attrs["stride"], attrs.get("dilation", [1, 1])
    n, c, h, w = x.shape
    oh, ow = _out_size(h, kh, sh, dh), _out_size(w, kw, sw, dw)
    if oh <= 0 or ow <= 0:
        raise BuildError(f"input {h}x{w} is smaller than the {kh}x{kw} window")
    mult = weight.shape[0] // group
    xs = x if mult == 1 else np.repeat(x, mult, axis=1)
    taps = weight[:, 0]  # [Cout, kh, kw]
    exact32 = x_max * float(np.abs(taps.astype(np.float64)).sum(axis=(1, 2)).max(initial=0)) \
        < FLOAT32_EXACT
    dtype = np.float32 if exact32 else np.int64
    xs, taps = xs.astype(dtype, copy=False), taps.astype(dtype)
    acc = np.zeros((n, xs.shape[1], oh, ow), dtype)
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dh, i * dh + (oh - 1) * sh + 1, sh)
            cols = slice(j * dw, j * dw + (ow - 1) * sw + 1, sw)
            acc += xs[:, :, rows, cols] * taps[:, i, j][None, :, None, None]
    return acc.astype(np.float64 if exact32 else np.int64)


def input_rows(layer: QLayer, out_r0: int, out_r1: int, in_height: int) -> tuple[int, int, int, int]:
    """Backward-H for conv/pool: output rows ``[out_r0, out_r1)`` need input rows
    ``[h0, h1)`` and the padding ``(pad_top, pad_bottom)`` to pass with them (the layer's own
    left/right padding is unchanged). Returns ``(h0, h1, pad_top, pad_bottom)``."""
    a = layer.attrs
    kh, sh, dh = a["kernel"][0], a["stride"][0], a.get("dilation", [1, 1])[0]
    top = a["pads"][0]
    first = out_r0 * sh - top                            # padded rows [first, last) are read
    last = (out_r1 - 1) * sh + dh * (kh - 1) + 1 - top
    need = last - first
    pad_top, pad_bottom = min(max(-first, 0), need), min(max(last - in_height, 0), need)
    h0 = min(max(first, 0), in_height)
    return h0, h0 + need - pad_top - pad_bottom, pad_top, pad_bottom


# ---- pooling -------------------------------------------------------------------------------

def maxpool2d(layer: QLayer, x: np.ndarray, pads: Sequence[int] | None = None) -> np.ndarray:
    """Max over each window; padding holds the dtype's minimum. Output params = input params."""
    a = layer.attrs
    if a.get("global"):
        return x.max(axis=(2, 3), keepdims=True)
    qmin = np.iinfo(x.dtype).min
    xp = pad_spatial(x, pads or a["pads"], qmin)
    return windows(xp, a).max(axis=(2, 3))


def avgpool2d(layer: QLayer, x: np.ndarray, pads: Sequence[int] | None = None) -> np.ndarray:
    """Sum of ``x - zp`` per window, requantized by the multiplier of that window's count."""
    a, p = layer.attrs, layer.params
    xs = np.asarray(x, dtype=np.int64) - p["input_zp"]
    if a.get("global"):
        acc = xs.sum(axis=(2, 3), keepdims=True)
        counts = np.full((1, 1), xs.shape[2] * xs.shape[3])
    else:
        pads = pads or a["pads"]
        acc = windows(pad_spatial(xs, pads, 0), a).sum(axis=(2, 3))
        counts = _window_counts(xs.shape[2:], a, pads)
    table = layer.arrays["counts"]
    idx = np.searchsorted(table, counts)
    if np.any(idx >= table.size) or np.any(table[np.minimum(idx, table.size - 1)] != counts):
        raise BuildError(f"layer {layer.name!r}: a window count outside its multiplier table")
    return _requant(layer, acc, layer.arrays["multiplier"][idx], layer.arrays["shift"][idx])


def _window_counts(hw: Sequence[int], attrs: dict, pads: Sequence[int]) -> np.ndarray:
    """How many positions of each window count towards the average: [OH, OW]. Padding counts
    only with ``count_include_pad`` (ceil_mode's extra padding never does: that combination
    stays on the CPU)."""
    ones = np.ones((1, 1, *hw), dtype=np.int64)
    padded = pad_spatial(ones, pads, 1 if attrs.get("count_include_pad") else 0)
    return windows(padded, attrs).sum(axis=(2, 3))[0, 0]


def window_counts(layer: QLayer, input_hw: Sequence[int]) -> np.ndarray:
    """Every window count the layer's full-size computation uses (for the multiplier table)."""
    if layer.attrs.get("global"):
        return np.array([int(input_hw[0]) * int(input_hw[1])])
    return np.unique(_window_counts(input_hw, layer.attrs, layer.attrs["pads"]))


# ---- element-wise ----------------------------------------------------------------------------

def add(layer: QLayer, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(a - zp_a)·M_a + (b - zp_b)·M_b`` (M_b < 0 for Sub), one rounding shift."""
    p = layer.params
    (za, zb), (ma, mb) = p["input_zps"], p["multipliers"]
    acc = (np.asarray(a, np.int64) - za) * ma + (np.asarray(b, np.int64) - zb) * mb
    return _requant(layer, acc, 1, p["shift"])


def mul(layer: QLayer, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    p = layer.params
    za, zb = p["input_zps"]
    acc = (np.asarray(a, np.int64) - za) * (np.asarray(b, np.int64) - zb)
    return _requant(layer, acc, p["multiplier"], p["shift"])


def matmul(layer: QLayer, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``(a - zp_a) @ (b - zp_b)`` (ONNX MatMul: batch dimensions broadcast), one
    requantization; in float64 BLAS while no sum can reach 2^53 (``K · max|a| · max|b|``,
    far beyond int8 and int16 rows), else in int64."""
    p = layer.params
    za, zb = p["input_zps"]
    xa, xb = _centered(np.asarray(a), za), _centered(np.asarray(b), zb)
    depth = xa.shape[-1]
    bound = depth * (float(np.abs(xa).max()) if xa.size else 0.0) * (
        float(np.abs(xb).max()) if xb.size else 0.0)
    return _requant(layer, _exact_product(xa, xb, bound), p["multiplier"], p["shift"])


def layernorm(layer: QLayer, x: np.ndarray) -> np.ndarray:
    """Layer normalization of ``c = x - zp`` over the axes from ``attrs.axis``: with ``n``
    values per row, ``S1 = Σc`` and ``S2 = Σc²`` are exact int64 sums, so the row's centred
    values ``n·c - S1`` and ``n²·variance = n·S2 - S1²`` are exact integers; only the
    normalization ``(n·c - S1) / sqrt(n·S2 - S1² + n²·epsilon_steps)`` and the per-element
    ``gain``/``offset`` are float64 (correctly rounded IEEE operations, the same on any
    machine), rounded once to the output. With ``rms`` (an RMS norm: no mean subtracted) the
    row is ``n·c / sqrt(n·S2 + n²·epsilon_steps)``, i.e. ``c / sqrt(S2/n + epsilon_steps)``,
    from the same exact ``S2``."""
    p = layer.params
    axis = layer.attrs["axis"]
    lead, n = x.shape[:axis], int(np.prod(x.shape[axis:], dtype=np.int64))
    c = np.asarray(x, np.int64).reshape(*lead, n) - p["input_zp"]
    span = float(np.abs(c).max()) if c.size else 0.0
    if float(n) * float(n) * span * span >= 2.0 ** 62:  # n·S2 and S1² stay inside int64
        raise BuildError(f"layer {layer.name!r}: {n} values per row of magnitude up to "
                         f"{span:g} overflow the int64 sums")
    s1 = c.sum(axis=-1, keepdims=True)
    s2 = np.einsum("...i,...i->...", c, c)[..., None]
    if layer.attrs.get("rms"):
        s1 = np.zeros_like(s1)
    centred = (n * c - s1).astype(np.float64)
    spread = (n * s2 - s1 * s1).astype(np.float64) + float(n) * float(n) * p["epsilon_steps"]
    with np.errstate(divide="ignore", invalid="ignore"):
        y = np.where(spread > 0, centred / np.sqrt(spread), 0.0)
    return _rounded_to_output(layer, y * layer.arrays["gain"] + layer.arrays["offset"]
                              ).reshape(x.shape)


def lrn(layer: QLayer, x: np.ndarray) -> np.ndarray:
    """Local response normalization of ``c = x - zp`` across channels: each channel window's
    ``S = Σc²`` (``size`` channels, ONNX's floor/ceil split around the channel) is an exact
    int64 sum; only ``c · input_over_output / (bias + alpha_steps · S)^beta`` is float64,
    rounded once to the output."""
    p, a = layer.params, layer.attrs
    c = np.asarray(x, np.int64) - p["input_zp"]
    before = (a["size"] - 1) // 2
    squares = np.pad(c * c, ((0, 0), (before, a["size"] - 1 - before), (0, 0), (0, 0)))
    running = np.concatenate([np.zeros_like(squares[:, :1]), np.cumsum(squares, axis=1)], axis=1)
    window = running[:, a["size"]:] - running[:, :-a["size"]]
    base = a["bias"] + p["alpha_steps"] * window.astype(np.float64)
    return _rounded_to_output(layer, c * p["input_over_output"] / np.power(base, a["beta"]))


def rescale(layer: QLayer, x: np.ndarray) -> np.ndarray:
    """``x - zp`` requantized by ``(multiplier, shift)``, or where it is negative by the
    negative side's (PRelu, LeakyRelu: one pair, or one per index of ``attrs.axis``)."""
    p = layer.params
    acc = np.asarray(x, np.int64) - p["input_zp"]
    if "negative_multiplier" not in layer.arrays:
        return _requant(layer, acc, p["multiplier"], p["shift"])
    m, n = layer.arrays["negative_multiplier"], layer.arrays["negative_shift"]
    if "axis" in layer.attrs:
        m, n = (_channel(v, acc.ndim, layer.attrs["axis"]) for v in (m, n))
    positive = acc >= 0
    return _requant(layer, acc, np.where(positive, p["multiplier"], m),
                    np.where(positive, p["shift"], n))


def concat(layer: QLayer, xs: Sequence[np.ndarray]) -> np.ndarray:
    p = layer.params
    parts = []
    for x, zp, m, n in zip(xs, p["input_zps"], p["multipliers"], p["shifts"]):
        identity = zp == p["output_zp"] and m == 1 and n == 0 and x.dtype == np.dtype(
            p.get("output_dtype", "int8"))
        parts.append(x if identity else _requant(layer, np.asarray(x, np.int64) - zp, m, n))
    return np.concatenate(parts, axis=layer.attrs["axis"])


def lut(layer: QLayer, x: np.ndarray) -> np.ndarray:
    """``table[clamp(x, lo, hi) - lo]``: the table over its span of input integers from
    ``params.table_lo`` (`schemes.trim_lut`; absent: from the input's qmin, every integer)."""
    lo = layer.params.get("table_lo", int(np.iinfo(x.dtype).min))
    return schemes.lookup(layer.arrays["table"], int(lo), x)


def softmax(layer: QLayer, x: np.ndarray) -> np.ndarray:
    """Integer softmax along ``attrs.axis``: ``e = exp_table[max - x]`` (exp of the step
    distance to the row's maximum, ``softmax_arithmetic`` fraction bits; an int16 input's
    table ends at its first 0, which every farther step reads), then each ``e`` over the row's
    sum, times the output's ``1 / scale`` as ``multiplier · 2^-shift``, rounded half up by one
    integer division."""
    p, axis = layer.params, layer.attrs["axis"]
    xi = np.asarray(x, np.int64)
    table = layer.arrays["exp_table"]
    e = table[np.minimum(xi.max(axis=axis, keepdims=True) - xi, len(table) - 1)]
    den = e.sum(axis=axis, keepdims=True) << int(p["shift"])
    y = (2 * e * int(p["multiplier"]) + den) // (2 * den) + int(p["output_zp"])
    lo, hi = schemes.qrange(p["output_dtype"])
    return np.clip(y, lo, hi).astype(schemes.DTYPES[p["output_dtype"]])


# ---- resize ----------------------------------------------------------------------------------

def _source_coords(out_size: int, in_size: int, mode: str) -> np.ndarray:
    """ONNX Resize's original coordinate of each output index (float64)."""
    o = np.arange(out_size, dtype=np.float64)
    scale = out_size / in_size
    if mode == "asymmetric":
        return o / scale
    if mode == "align_corners":
        return o * (in_size - 1) / (out_size - 1) if out_size > 1 else np.zeros_like(o)
    if mode == "tf_half_pixel_for_nn":
        return (o + 0.5) / scale
    if mode == "pytorch_half_pixel" and out_size <= 1:
        return np.zeros_like(o)
    return (o + 0.5) / scale - 0.5  # half_pixel, pytorch_half_pixel


def _nearest_index(coords: np.ndarray, in_size: int, nearest_mode: str) -> np.ndarray:
    rounding = {"round_prefer_floor": lambda c: np.ceil(c - 0.5),
                "round_prefer_ceil": lambda c: np.floor(c + 0.5),
                "floor": np.floor, "ceil": np.ceil}[nearest_mode]
    return np.clip(rounding(coords), 0, in_size - 1).astype(np.int64)


def _linear_taps(coords: np.ndarray, in_size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Two source indices and the integer weight of the second (``RESIZE_FRAC_BITS`` bits)."""
    c = np.clip(coords, 0, in_size - 1)
    i0 = np.floor(c).astype(np.int64)
    i1 = np.minimum(i0 + 1, in_size - 1)
    w1 = schemes.round_half_up((c - i0) * 2 ** schemes.RESIZE_FRAC_BITS).astype(np.int64)
    return i0, i1, w1


def resize_input_rows(layer: QLayer, out_r0: int, out_r1: int, in_height: int) -> tuple[int, int]:
    """The input rows ``[h0, h1)`` that output rows ``[out_r0, out_r1)`` of a resize read."""
    a = layer.attrs
    coords = _source_coords(a["output_size"][0], in_height, a["coordinate_transformation_mode"])
    if a["mode"] == "nearest":
        rows = _nearest_index(coords, in_height, a["nearest_mode"])[out_r0:out_r1]
        return int(rows.min()), int(rows.max()) + 1
    i0, i1, _ = _linear_taps(coords, in_height)
    return int(i0[out_r0:out_r1].min()), int(i1[out_r0:out_r1].max()) + 1


def resize(layer: QLayer, x: np.ndarray, out_rows: tuple[int, int] | None = None,
           in_row0: int = 0) -> np.ndarray:
    """Nearest (pure indexing) or bilinear (integer weights) resize of H and W.

    ``x`` holds input rows starting at ``in_row0``; ``out_rows`` picks the output rows.
    """
    a = layer.attrs
    (oh, ow), in_h, in_w = a["output_size"], a["input_size"][0], x.shape[3]
    r0, r1 = out_rows or (0, oh)
    mode = a["coordinate_transformation_mode"]
    ys, xs = _source_coords(oh, in_h, mode)[r0:r1], _source_coords(ow, in_w, mode)
    if a["mode"] == "nearest":
        iy = _nearest_index(ys, in_h, a["nearest_mode"]) - in_row0
        ix = _nearest_index(xs, in_w, a["nearest_mode"])
        return x[:, :, iy][:, :, :, ix]
    p = layer.params
    y0, y1, wy = _linear_taps(ys, in_h)
    x0, x1, wx = _linear_taps(xs, in_w)
    one = 1 << schemes.RESIZE_FRAC_BITS
    v = np.asarray(x, np.int64) - p["input_zp"]
    rows = v[:, :, y0 - in_row0] * (one - wy)[:, None] + v[:, :, y1 - in_row0] * wy[:, None]
    acc = rows[..., x0] * (one - wx) + rows[..., x1] * wx
    return _requant(layer, acc, p["multiplier"], p["shift"])


# ---- data movement ---------------------------------------------------------------------------

def _slice(layer: QLayer, x: np.ndarray) -> np.ndarray:
    a = layer.attrs
    index = [slice(None)] * x.ndim
    for start, end, axis, step in zip(a["starts"], a["ends"], a["axes"], a["steps"]):
        index[axis] = slice(start, end, step)
    return x[tuple(index)]


def _pad_nd(layer: QLayer, x: np.ndarray) -> np.ndarray:
    pads = layer.attrs["pads"]
    half = len(pads) // 2
    width = list(zip(pads[:half], pads[half:]))
    mode = layer.attrs.get("mode", "constant")
    if mode == "constant":
        return np.pad(x, width, constant_values=layer.attrs["value"])
    return np.pad(x, width, mode={"edge": "edge", "reflect": "reflect", "wrap": "wrap"}[mode])


def _split(layer: QLayer, x: np.ndarray) -> list[np.ndarray]:
    cuts = np.cumsum(layer.attrs["sizes"])[:-1]
    return list(np.split(x, cuts, axis=layer.attrs["axis"]))


# ---- float (CPU) layers ----------------------------------------------------------------------

@lru_cache(maxsize=256)
def _float_session(model_bytes: bytes):
    from npubuild import onnx_io

    return onnx_io.session(_model_from_bytes(model_bytes))


def _model_from_bytes(data: bytes):
    import onnx

    model = onnx.ModelProto()
    model.ParseFromString(data)
    return model


def float_layer(layer: QLayer, xs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """A CPU layer: dequantize int inputs, run the float ONNX node, quantize int outputs."""
    p = layer.params
    feeds = {}
    for name, x, qp in zip(p["onnx_inputs"], xs, p["input_params"]):
        feeds[name] = x if qp is None else schemes.dequantize(x, qp[0], qp[1])
    sess = _float_session(layer.arrays["model"].tobytes())
    results = sess.run(None, feeds)
    return [y if qp is None else schemes.quantize(y, qp[0], qp[1], qp[2])
            for y, qp in zip(results, p["output_params"])]


def depth_to_space(layer: QLayer, x: np.ndarray) -> np.ndarray:
    """ONNX DepthToSpace of an NCHW tensor: CRD takes each output channel's block of
    ``blocksize²`` input channels, DCR each block position's run of output channels."""
    n, c, h, w = x.shape
    bs = layer.attrs["blocksize"]
    if layer.attrs["mode"] == "CRD":
        blocks = x.reshape(n, c // bs ** 2, bs, bs, h, w).transpose(0, 1, 4, 2, 5, 3)
    else:
        blocks = x.reshape(n, bs, bs, c // bs ** 2, h, w).transpose(0, 3, 4, 1, 5, 2)
    return np.ascontiguousarray(blocks.reshape(n, c // bs ** 2, h * bs, w * bs))


def channel_permute(layer: QLayer, x: np.ndarray) -> np.ndarray:
    """A permutation of the channels of the 4-D view (``attrs``: ``order``, the input channel
    of each output channel; ``view``; ``shape``, the output's): the NPU compiler's one layer
    for a chain of reshapes and transposes that does this (a channel shuffle,
    `npubuild.npu.from_qgraph.fold_channel_permutations`)."""
    view = np.reshape(x, layer.attrs["view"])
    return np.take(view, layer.attrs["order"], axis=1).reshape(layer.attrs["shape"])


KERNELS: dict[str, Kernel] = {
    "conv": lambda l, xs: [conv2d(l, xs[0])],
    "add": lambda l, xs: [add(l, xs[0], xs[1])],
    "mul": lambda l, xs: [mul(l, xs[0], xs[1])],
    "matmul": lambda l, xs: [matmul(l, xs[0], xs[1])],
    "layernorm": lambda l, xs: [layernorm(l, xs[0])],
    "lrn": lambda l, xs: [lrn(l, xs[0])],
    "rescale": lambda l, xs: [rescale(l, xs[0])],
    "concat": lambda l, xs: [concat(l, xs)],
    "maxpool": lambda l, xs: [maxpool2d(l, xs[0])],
    "avgpool": lambda l, xs: [avgpool2d(l, xs[0])],
    "resize": lambda l, xs: [resize(l, xs[0])],
    "lut": lambda l, xs: [lut(l, xs[0])],
    "softmax": lambda l, xs: [softmax(l, xs[0])],
    "reshape": lambda l, xs: [np.reshape(xs[0], l.attrs["shape"])],
    "transpose": lambda l, xs: [np.ascontiguousarray(np.transpose(xs[0], l.attrs["perm"]))],
    "depth_to_space": lambda l, xs: [depth_to_space(l, xs[0])],
    "channel_permute": lambda l, xs: [channel_permute(l, xs[0])],
    "slice": lambda l, xs: [_slice(l, xs[0])],
    "split": lambda l, xs: _split(l, xs[0]),
    "pad": lambda l, xs: [_pad_nd(l, xs[0])],
    "float": float_layer,
}


def run_layer(layer: QLayer, inputs: Sequence[np.ndarray]) -> list[np.ndarray]:
    """One layer on its input arrays (in ``layer.inputs`` order)."""
    try:
        kernel = KERNELS[layer.kind]
    except KeyError:
        raise BuildError(f"layer {layer.name!r}: no integer kernel for kind {layer.kind!r}") from None
    return kernel(layer, inputs)


def run_reference(qgraph: QGraph, int_inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Every tensor of the graph (inputs and constants included) computed from ``int_inputs``."""
    env: dict[str, np.ndarray] = dict(qgraph.constants)
    for name in qgraph.inputs:
        if name not in int_inputs:
            raise BuildError(f"run_reference: input {name!r} not given")
        env[name] = _checked_input(qgraph, name, int_inputs[name])
    for layer in qgraph.layers:
        with working_on(graph=qgraph.name, node=(layer.source_nodes or [layer.name])[0],
                        tensor=layer.outputs[0] if layer.outputs else None):
            outputs = run_layer(layer, [env[t] for t in layer.inputs])
        for name, value in zip(layer.outputs, outputs):
            env[name] = value
    return env


def _checked_input(qgraph: QGraph, name: str, value: np.ndarray) -> np.ndarray:
    t = qgraph.tensors[name]
    value = np.asarray(value)
    if list(value.shape) != list(t.shape):
        raise BuildError(f"input {name!r} has shape {list(value.shape)}, expected {t.shape}")
    if not t.is_float and value.dtype != np.dtype(t.dtype):
        raise BuildError(f"input {name!r} is {value.dtype}, expected {t.dtype}")
    return value


def quantize_inputs(qgraph: QGraph, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Float graph inputs → what ``run_reference`` takes (float inputs pass through)."""
    out = {}
    for name in qgraph.inputs:
        t = qgraph.tensors[name]
        x = np.asarray(feeds[name])
        out[name] = x.astype(np.float32) if t.is_float else schemes.quantize(
            x, t.scale, t.zero_point, t.dtype)
    return out


def dequantize_tensor(qgraph: QGraph, name: str, value: np.ndarray) -> np.ndarray:
    t = qgraph.tensors[name]
    return np.asarray(value, np.float32) if t.is_float else schemes.dequantize(
        value, t.scale, t.zero_point)


def run_quantized(qgraph: QGraph, feeds: Mapping[str, np.ndarray],
                  outputs: Sequence[str] | None = None) -> dict[str, np.ndarray]:
    """Float in, float out: quantize the inputs, run the reference, dequantize ``outputs``."""
    env = run_reference(qgraph, quantize_inputs(qgraph, feeds))
    return {n: dequantize_tensor(qgraph, n, env[n]) for n in (outputs or qgraph.outputs)}
