"""The integer arithmetic of quantized graphs, defined once. Every other module calls these.

Tensors
    A quantized tensor holds integers ``q`` of its dtype (int8: [-128, 127]; int16: [-32768, 32767])
    standing for the real values ``x = (q - zero_point) · scale``. Three schemes choose the
    parameters of activations (weights are always symmetric, zero point 0):

    - ``pow2_symmetric`` (seed 004): ``scale = 2^-log2scale`` with an integer ``log2scale``,
      zero point 0, and ``log2scale = floor(log2(2^(bits-1) / T))`` for the threshold ``T``: the
      smallest power-of-two range ``[-2^(bits-1), 2^(bits-1)) · scale`` that holds ``[-T, T]``
      (``[-4, 4)`` → log2scale 5 for int8; the one value ``+T`` itself may saturate to 127, an
      error below one step);
    - ``symmetric``: ``scale = T / qmax``, zero point 0;
    - ``asymmetric``: ``scale = (hi - lo) / (qmax - qmin)`` over ``lo ≤ 0 ≤ hi``,
      ``zero_point = qmin - round(lo / scale)`` (so real 0 is exactly representable).

Rounding, defined here once (``ROUNDINGS``, ``rounding_for``, ``rounding_shift``):

- float → integer conversions (``quantize``: graph inputs, CPU-layer outputs, weights,
  constants) round half to **even**, exactly as ONNX's ``QuantizeLinear`` (and so ONNX
  Runtime) does;
- integer requantization (``requantize``) rounds as the graph's scheme says
  (``rounding_for``): ``pow2_symmetric`` rounds half **up** (towards +∞),
  ``round(v) = floor(v + 1/2)``, which is what seed 004's arithmetic right shift by ``n``
  after adding ``2^(n-1)`` computes (ARCHITECTURE §4); ``symmetric`` and ``asymmetric`` round
  half to **even**, as ONNX Runtime's QuantizeLinear does on the QDQ model, so the
  cross-check is exact on ties (``acc · M / 2^n`` exactly ``k + 1/2``). The pow2 QDQ export
  turns ties upwards with a nudge instead (``npubuild.quant.qdq``). The one inherent
  difference left is float32: ORT computes ``Σ x·w·s`` and ``/ s_y`` in float32, so where
  the exact value lies within a float32 rounding error of a tie the two can differ by one
  step; ``check.MAX_LSB`` bounds it and ``docs/quantization.md`` says how often it happens.
- Offline parameters (fixed-point multipliers, bias) round half up; they are data, not
  arithmetic the cross-check compares. Lookup tables are data too, computed offline exactly
  as the QDQ model computes the op (``build_lut``).

Saturation: every result is clamped to ``[qmin, qmax]`` of its dtype, or the narrower clamp of
a folded Relu/Clip.

Requantization (``requantize``): an integer accumulator ``acc`` (int32 for int8 layers, wider
for int16) at real scale ``s_acc`` becomes an output of scale ``s_y`` by the real factor
``r = s_acc / s_y``, represented as a fixed-point multiplier ``M`` and shift ``n`` with
``r ≈ M · 2^-n`` (``fixed_point``): ``y = clamp(round(acc · M / 2^n) + zp_y)`` computed as
``(acc·M + 2^(n-1)) >> n`` in int64, less one on an exact tie with an odd result when the
rounding is half to even (``n ≤ 0`` is an exact left shift by ``-n``). ``M`` has up to
31 bits (``|M| < 2^31``), fewer when the accumulator bound needs them so ``acc·M`` fits int64.
In ``pow2_symmetric`` graphs every conv/add/concat/pool factor is a power of two: ``M = 1`` and
``n`` is seed 004's ``output_shift = in_log2scale + w_log2scale - out_log2scale``.

Per-op integer definitions (computed by ``npubuild.quant.reference``):

- conv / gemm (as 1×1 conv) / batchnorm (as depthwise conv): ``acc = Σ (x - zp_x)·w + bias``,
  ``bias = round(b / (s_x·s_w[c]))`` int32; padding holds real 0 (``x = zp_x``);
  ``y = requantize(acc, M[c], n[c])`` with ``M[c]·2^-n[c] ≈ s_x·s_w[c]/s_y``.
- add / sub: ``acc = (a - zp_a)·M_a ± (b - zp_b)·M_b`` with both factors sharing one ``n``
  (``M_i·2^-n ≈ s_i/s_y``), one rounding; pow2 aligns both inputs to the finer scale exactly.
- mul: ``acc = (a - zp_a)·(b - zp_b)``, factor ``s_a·s_b/s_y``.
- rescale (Mul/Div by a scalar constant c): ``acc = x - zp_x``, factor ``c·s_x/s_y``; PRelu and
  LeakyRelu are a rescale of ``c = 1`` where ``acc ≥ 0`` and of their slope ``a`` (per channel
  for a per-channel PRelu) where ``acc < 0``, factor ``a·s_x/s_y``: piecewise linear, so the
  same kernel takes int8 and int16 inputs with no table.
- concat: each input requantized by its own factor ``s_i/s_y`` (identity when equal).
- avgpool: ``acc = Σ (x - zp_x)`` over the window, factor ``s_x / (count·s_y)`` with one
  multiplier per possible ``count`` of the window (in pow2 graphs rounded up, so that exact
  ties of a non-negative window sum round up as the exact quotient would).
- resize linear: ``acc = Σ w_i·(x_i - zp_x)`` with integer weights of ``RESIZE_FRAC_BITS`` bits
  per axis, factor ``s_x / (2^(2·bits)·s_y)``.
- lut: ``y = T[q - qmin]``, ``T[i] = clamp(rint(f((i + qmin - zp_x)·s_x)/s_y) + zp_y)``
  in float32 as the QDQ model computes it (Sigmoid, SiLU, Tanh, HardSwish, Elu, ...), stored
  and run over its span only (``trim_lut``): ``y = table[clamp(q, lo, hi) - lo]`` where ``[lo,
  hi]`` are the input integers past which ``T`` repeats its end values, the same ``y`` for
  every ``q`` (an int16 input's table is 65,536 entries, most of them a saturating function's
  end values).
- maxpool, reshape, transpose, depth_to_space, slice, split, pad, resize nearest: data
  movement, output parameters equal to the input's, no arithmetic (pads hold ``zp``; maxpool
  pads hold qmin).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

SCHEMES = ("pow2_symmetric", "symmetric", "asymmetric")
ROUNDINGS = ("half_up", "half_even")
DTYPES = {"int8": np.int8, "int16": np.int16}
RESIZE_FRAC_BITS = 10
MAX_MULTIPLIER_BITS = 31
MAX_SHIFT = 62


def qrange(dtype: str) -> tuple[int, int]:
    """``(qmin, qmax)`` of an integer dtype name."""
    info = np.iinfo(DTYPES[dtype])
    return int(info.min), int(info.max)


@dataclass(frozen=True)
class QParams:
    """Quantization parameters of one activation tensor (per tensor)."""

    scale: float
    zero_point: int = 0
    log2scale: int | None = None
    dtype: str = "int8"

    @property
    def qmin(self) -> int:
        return qrange(self.dtype)[0]

    @property
    def qmax(self) -> int:
        return qrange(self.dtype)[1]


def rounding_for(scheme: str) -> str:
    """How a graph of ``scheme`` rounds its integer requantization (see the module text)."""
    return "half_up" if scheme == "pow2_symmetric" else "half_even"


def round_half_up(values) -> np.ndarray:
    """``floor(v + 1/2)`` for floats (offline parameters: multipliers, biases)."""
    return np.floor(np.asarray(values, dtype=np.float64) + 0.5)


def round_half_even(values) -> np.ndarray:
    """Nearest integer, ties to even: ONNX QuantizeLinear's rounding (float64, exact)."""
    return np.rint(np.asarray(values, dtype=np.float64))


def log2scale_for(threshold: float, dtype: str = "int8") -> int:
    """Seed 004's log2scale: the largest ``l`` with ``threshold · 2^l ≤ 2^(bits-1)``."""
    half = -qrange(dtype)[0]
    if not threshold > 0 or not math.isfinite(threshold):
        return 0 if not threshold > 0 else -126
    return int(math.floor(math.log2(half / threshold)))


def choose_params(scheme: str, lo: float, hi: float, dtype: str = "int8") -> QParams:
    """Activation parameters for the calibrated range ``[lo, hi]`` under ``scheme``."""
    qmin, qmax = qrange(dtype)
    lo, hi = min(float(lo), 0.0), max(float(hi), 0.0)
    threshold = max(-lo, hi)
    if scheme == "pow2_symmetric":
        ls = log2scale_for(threshold, dtype)
        return QParams(2.0 ** -ls, 0, ls, dtype)
    if scheme == "symmetric":
        return QParams(threshold / qmax if threshold > 0 else 1.0, 0, None, dtype)
    if scheme == "asymmetric":
        if hi - lo <= 0:
            return QParams(1.0, 0, None, dtype)
        scale = (hi - lo) / (qmax - qmin)
        zp = int(np.clip(qmin - round_half_up(lo / scale), qmin, qmax))
        return QParams(scale, zp, None, dtype)
    raise ValueError(f"unknown scheme {scheme!r}")


def weight_params(scheme: str, weight: np.ndarray, per_channel: bool,
                  axis: int = 0, dtype: str = "int8") -> tuple[np.ndarray, np.ndarray | None]:
    """Symmetric weight scales of ``dtype`` (int8, or int16 for a W16A16 layer; per output
    channel along ``axis``, or one) and, for ``pow2_symmetric``, their log2scales. Returns
    arrays of length C (or 1)."""
    w = np.asarray(weight)
    rows = np.moveaxis(w, axis, 0).reshape(w.shape[axis], -1)  # a view for axis 0
    # max |w| per row without an |w| copy of the whole weight (100M-parameter Gemms)
    row_max = (np.maximum(rows.max(axis=1), -rows.min(axis=1)).astype(np.float64) if w.size
               else np.zeros(rows.shape[0]))
    absmax = row_max if per_channel else np.array([row_max.max() if w.size else 0.0])
    if scheme == "pow2_symmetric":
        ls = np.array([log2scale_for(t, dtype) if t > 0 else 0 for t in absmax], dtype=np.int64)
        return 2.0 ** -ls.astype(np.float64), ls
    return np.where(absmax > 0, absmax / float(qrange(dtype)[1]), 1.0), None


# A bias must hold at its accumulator's scale with room to spare: bias correction moves it
# after the scales are chosen, and the accumulator adds Σ x·w on top.
BIAS_HEADROOM = 2 ** 30
# A W16A16 layer (int16 input and weights) accumulates at a scale 2^16 finer than int8's, so
# its bias is int64, kept below 2^40: beside ``K · 2^30`` of products, ``acc · M`` stays inside
# int64 with a multiplier of ``62 - ceil(log2(K · 2^30 + 2^40))`` bits (`multiplier_bits`: 19
# for K = 4,608, a relative error under 2^-19 on the output scale).
BIAS_HEADROOM_INT64 = 2 ** 40
BIAS_DTYPES = {"int8": "int32", "int16": "int64"}  # weight dtype -> its bias's


def bias_fitting_weight_scales(w_scale: np.ndarray, w_ls: np.ndarray | None, bias: np.ndarray,
                               x_scale: float, headroom: float = BIAS_HEADROOM
                               ) -> tuple[np.ndarray, np.ndarray | None]:
    """Weight scales (and pow2 log2scales) widened where the bias would not fit int32 at the
    accumulator's scale ``s_x · s_w[c]``: an int16 input's scale is 256 times finer than
    int8's, so a bias that fits beside int8 activations saturates int32 beside int16 ones
    (MediaPipe's pose detector: two channels at 2^31 - 1, its output cosine 0.96 with every
    activation int16 against 0.98 in int8). The widened channel's weights lose precision
    only where the bias dwarfs them. One scale (per tensor) widens as a whole."""
    need = np.abs(np.asarray(bias, np.float64)) / (float(x_scale) * headroom)
    need = np.full(np.shape(w_scale), need.max(initial=0.0)) if np.size(w_scale) == 1 else need
    if not np.any(need > w_scale):
        return w_scale, w_ls
    if w_ls is None:
        return np.maximum(w_scale, need), None
    fits = np.floor(-np.log2(np.maximum(need, np.finfo(np.float64).tiny))).astype(np.int64)
    w_ls = np.minimum(np.broadcast_to(w_ls, np.shape(need)), fits)
    return 2.0 ** -w_ls.astype(np.float64), w_ls


def quantize(x: np.ndarray, scale, zero_point=0, dtype: str = "int8") -> np.ndarray:
    """Float → integer: ``clamp(round_half_even(x / scale) + zp)`` (scale may broadcast), as
    ONNX's QuantizeLinear."""
    qmin, qmax = qrange(dtype)
    q = round_half_even(np.asarray(x, dtype=np.float64) / np.asarray(scale, dtype=np.float64))
    return np.clip(q + zero_point, qmin, qmax).astype(DTYPES[dtype])


def dequantize(q: np.ndarray, scale, zero_point=0) -> np.ndarray:
    """Integer → float32: ``(q - zp) · scale``."""
    return ((np.asarray(q, dtype=np.float64) - zero_point) * scale).astype(np.float32)


def quantize_bias(bias: np.ndarray, acc_scale: np.ndarray, dtype: str = "int32") -> np.ndarray:
    """Bias at the accumulator's scale ``s_x · s_w[c]``, int32 (or int64 beside int16
    weights: `BIAS_DTYPES`), saturated."""
    q = round_half_up(np.asarray(bias, dtype=np.float64) / acc_scale)
    bound = 2**31 if dtype == "int32" else 2**62  # float64 holds 2^62 exactly; 2^63 - 1 not
    return np.clip(q, -bound, bound - 1).astype(dtype)


def fixed_point(real: float, *, bits: int = MAX_MULTIPLIER_BITS,
                round_up: bool = False) -> tuple[int, int]:
    """``(M, n)`` with ``M · 2^-n ≈ real``, ``2^(bits-1) ≤ |M| < 2^bits`` (or ``M = 0``).

    A power of two gives ``M = 1`` (a pure shift), so pow2 graphs need no multiplier. ``n`` is
    capped at ``MAX_SHIFT`` (tiny factors lose low multiplier bits, never the result's range).
    ``round_up`` rounds ``|M|`` up instead of to nearest: then ``acc · M / 2^n`` never falls
    below ``acc · real`` for ``acc ≥ 0``, so exact ties of ``acc · real`` still round up.
    """
    real = float(real)
    if real == 0 or not math.isfinite(real):
        return 0, 0
    mantissa, exponent = math.frexp(abs(real))  # |real| = mantissa · 2^exponent, m in [0.5, 1)
    sign = -1 if real < 0 else 1
    if mantissa == 0.5:
        return sign, 1 - exponent
    scaled = mantissa * 2.0 ** bits
    m = int(math.ceil(scaled)) if round_up else int(round_half_up(scaled))
    n = bits - exponent
    if m == 1 << bits:
        m, n = m >> 1, n - 1
    while n > MAX_SHIFT:
        m, n = (-(-m // 2) if round_up else int(round_half_up(m / 2))), n - 1
    return sign * m, n


def fixed_point_array(reals, *, bits: int = MAX_MULTIPLIER_BITS,
                      round_up: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """``fixed_point`` element-wise: int64 multipliers and shifts, the same integers, on whole
    arrays (one Python call per output channel was 4 s of PP-OCRv5 rec's searched quantize,
    1.45 million of them: every quantization the search builds)."""
    real = np.asarray(reals, dtype=np.float64).ravel()
    usable = (real != 0) & np.isfinite(real)
    mantissa, exponent = np.frexp(np.where(usable, np.abs(real), 1.0))
    exponent = exponent.astype(np.int64)
    scaled = mantissa * 2.0 ** bits
    m = (np.ceil(scaled) if round_up else round_half_up(scaled)).astype(np.int64)
    n = bits - exponent
    full = m == 1 << bits
    m, n = np.where(full, m >> 1, m), np.where(full, n - 1, n)
    while np.any(n > MAX_SHIFT):
        halved = -(-m // 2) if round_up else round_half_up(m / 2).astype(np.int64)
        over = n > MAX_SHIFT
        m, n = np.where(over, halved, m), np.where(over, n - 1, n)
    power_of_two = mantissa == 0.5  # a pure shift
    m, n = np.where(power_of_two, 1, m), np.where(power_of_two, 1 - exponent, n)
    sign = np.where(real < 0, -1, 1)
    shape = np.shape(reals)
    return (np.where(usable, sign * m, 0).astype(np.int64).reshape(shape),
            np.where(usable, n, 0).astype(np.int64).reshape(shape))


def shared_shift(reals, *, bits: int = MAX_MULTIPLIER_BITS) -> tuple[np.ndarray, int]:
    """Several factors on one shift (add/sub): the largest gets ``bits`` bits, the rest align.
    Powers of two (pow2 graphs) get the smallest exact shift instead."""
    reals = np.asarray(reals, dtype=np.float64)
    big = float(np.max(np.abs(reals))) if reals.size else 0.0
    if big == 0:
        return np.zeros(reals.shape, dtype=np.int64), 0
    if all(_is_pow2(r) or r == 0 for r in reals.ravel()):
        n = max(0, max(-int(math.log2(abs(r))) for r in reals.ravel() if r))
    else:
        n = min(bits - math.frexp(big)[1], MAX_SHIFT)
    return np.array(round_half_up(reals * 2.0 ** n), dtype=np.int64), n


def _is_pow2(value: float) -> bool:
    return value != 0 and math.frexp(abs(value))[0] == 0.5


def multiplier_bits(acc_bound: float) -> int:
    """Multiplier width that keeps ``acc · M`` inside int64 for ``|acc| ≤ acc_bound``."""
    acc_bits = max(1, math.ceil(math.log2(acc_bound + 1)))
    return int(min(MAX_MULTIPLIER_BITS, 62 - acc_bits))


def rounding_shift(prod: np.ndarray, shift, rounding: str = "half_up") -> np.ndarray:
    """``prod / 2^shift`` rounded to nearest on int64 (ties up, or to even with
    ``rounding="half_even"``), shifts per element (``shift ≤ 0``: exact left shift, inputs
    first clipped to ±2^31 so the result only needs to saturate)."""
    prod = np.asarray(prod, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    right = np.maximum(shift, 0)
    left = np.maximum(-shift, 0)
    if np.any(left):  # clipped only where it shifts left: a right shift reads the whole product
        prod = np.where(left > 0, np.clip(prod, -(1 << 31), 1 << 31) << np.minimum(left, 31),
                        prod)
    half = (np.int64(1) << right) >> 1
    out = np.asarray(prod + half)  # a new array (0-d for scalars), shifted in place
    out >>= right
    if rounding == "half_even":
        tie = (right > 0) & ((prod & ((np.int64(1) << right) - 1)) == half)
        out = out - (tie & ((out & 1) == 1))
    elif rounding != "half_up":
        raise ValueError(f"unknown rounding {rounding!r}")
    return out


def requantize(acc, multiplier, shift, zero_point: int, qmin: int, qmax: int,
               dtype: str = "int8", rounding: str = "half_up") -> np.ndarray:
    """``clamp(round(acc · M / 2^n) + zp, qmin, qmax)`` exactly, in int64, ties rounded as
    ``rounding`` says (``rounding_for`` the graph's scheme).

    ``multiplier`` and ``shift`` broadcast against ``acc`` (per-channel arrays must be shaped
    to the channel axis by the caller). This is the only place results are rounded.
    """
    acc = np.asarray(acc)
    if acc.dtype.kind != "f":  # float accumulators hold exact integers below 2^53
        acc = acc.astype(np.int64, copy=False)
    multiplier = np.asarray(multiplier, dtype=np.int64)
    shift = np.asarray(shift, dtype=np.int64)
    bound = 0.0
    if acc.size and multiplier.size:
        bound = (max(float(acc.max()), -float(acc.min()))
                 * max(float(multiplier.max()), -float(multiplier.min())))
    if bound >= 2.0**62:
        raise OverflowError("requantize: acc · multiplier leaves int64 (the multiplier width "
                            "must follow the accumulator bound, see multiplier_bits)")
    if bound < FLOAT64_ROUNDING_BOUND and (shift.size == 0 or int(shift.min()) >= 0):
        y = _rounded_in_float64(acc, multiplier, shift, zero_point, rounding)
    else:
        y = rounding_shift(acc.astype(np.int64) * multiplier, shift, rounding)
        y += zero_point
    return np.clip(y, qmin, qmax, out=y).astype(DTYPES[dtype])


FLOAT64_ROUNDING_BOUND = 2.0 ** 52  # |acc · M| below it, every float64 rounding step is exact


def _rounded_in_float64(acc: np.ndarray, multiplier: np.ndarray, shift: np.ndarray,
                        zero_point: int, rounding: str) -> np.ndarray:
    """`rounding_shift` ``(acc · M, n) + zp`` for ``n ≥ 0`` and ``|acc · M| < 2^52``, in
    float64 (SIMD, where int64 products and shifts are scalar loops). Every step is exact:
    ``M · 2^-n`` is M with another exponent, so ``acc · (M · 2^-n)`` is the exact
    ``acc · M / 2^n``; ``rint`` rounds ties to even; for ties up, ``p + (zp + 1/2)`` is exact
    (``p`` has at most 52 bits from ``2^-n`` up) before ``floor``."""
    p = acc.astype(np.float64)
    p *= multiplier.astype(np.float64) * np.ldexp(1.0, -shift)
    if rounding == "half_even":
        np.rint(p, out=p)
        p += zero_point
    elif rounding == "half_up":
        p += zero_point + 0.5
        np.floor(p, out=p)
    else:
        raise ValueError(f"unknown rounding {rounding!r}")
    return p


def build_lut(fn, src: QParams, dst: QParams) -> np.ndarray:
    """The lookup table of an element-wise ``fn`` from ``src`` to ``dst``: entry ``i`` is the
    output for input integer ``i + src.qmin``.

    A table is data, not arithmetic: its entries are computed exactly as the QDQ model computes
    the op (``DequantizeLinear`` in float32, ``fn`` in float32, ``QuantizeLinear``: float32
    quotient, ties to even), so ONNX Runtime reproduces every entry when ``fn`` is its own
    kernel (the quantizer passes ``quantizer.onnx_function`` of the layer's fragment)."""
    q = np.arange(src.qmin, src.qmax + 1, dtype=np.float32)
    x = (q - np.float32(src.zero_point)) * np.float32(src.scale)
    with np.errstate(all="ignore"):
        y = np.asarray(fn(x)).astype(np.float32)
        ratio = (y / np.float32(dst.scale)).astype(np.float64)
    ratio = np.nan_to_num(ratio, nan=0.0, posinf=2.0**40, neginf=-2.0**40)
    out = np.rint(np.clip(ratio, -2.0**40, 2.0**40)) + dst.zero_point
    return np.clip(out, dst.qmin, dst.qmax).astype(DTYPES[dst.dtype])


def table_span(table: np.ndarray) -> tuple[int, int]:
    """The entries ``[first, last]`` of ``table`` a lookup needs: the entries before ``first``
    all equal it and those after ``last`` all equal it (a saturating function's runs of its end
    values: tanh of an int16 input at scale 200/32767 is ±1 at the output's scale past ±6,
    63,600 of its 65,536 entries), read from the table's values alone."""
    table = np.asarray(table).reshape(-1)
    changes = np.flatnonzero(table[1:] != table[:-1])  # entry i differs from entry i + 1
    if changes.size == 0:
        return 0, 0
    return int(changes[0]), int(changes[-1]) + 1


def trim_lut(table: np.ndarray, qmin: int) -> tuple[int, np.ndarray]:
    """``table`` (entry ``i``: the output for input integer ``qmin + i``) as it is stored and
    run: the lowest input integer ``lo`` of its span (`table_span`) and the span's entries
    (`lookup` clamps an input to the span first: the same values as the whole table)."""
    first, last = table_span(table)
    return qmin + first, np.ascontiguousarray(np.asarray(table).reshape(-1)[first:last + 1])


def lookup(table: np.ndarray, lo: int, x: np.ndarray) -> np.ndarray:
    """``table[clamp(x, lo, lo + size - 1) - lo]``: a table over the input integers from
    ``lo`` (`trim_lut`; an untrimmed table's ``lo`` is its input's ``qmin``)."""
    index = np.clip(np.asarray(x, np.int64), lo, lo + table.size - 1)
    index -= lo
    return table[index]


def clamp_bounds(activation: str, lo: float | None, hi: float | None,
                 out: QParams) -> tuple[int, int]:
    """Integer clamp of a folded activation: Relu → [q(0), qmax], Clip(lo, hi) → [q(lo), q(hi)]."""
    qmin, qmax = out.qmin, out.qmax
    if activation == "relu":
        lo, hi = 0.0, None
    if lo is not None and np.isfinite(lo):
        qmin = max(qmin, int(quantize(np.array(lo), out.scale, out.zero_point, out.dtype)))
    if hi is not None and np.isfinite(hi):
        qmax = min(qmax, int(quantize(np.array(hi), out.scale, out.zero_point, out.dtype)))
    return qmin, qmax
