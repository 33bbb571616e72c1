"""Hypothesis tests of the integer math in npubuild.quant.schemes and the reference kernels."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from npubuild.quant import schemes
from npubuild.quant.qgraph import QLayer
from npubuild.quant.reference import (avgpool2d, conv2d, conv_accumulator, input_rows,
                                      maxpool2d)
from npubuild.quant.schemes import QParams

FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
dtypes = st.sampled_from(["int8", "int16"])


def exact_requant(acc: int, m: int, n: int, zp: int, qmin: int, qmax: int) -> int:
    value = Fraction(acc * m) / Fraction(2) ** n
    return max(qmin, min(qmax, math.floor(value + Fraction(1, 2)) + zp))


@FAST
@given(acc=st.integers(-2**31, 2**31 - 1), m=st.integers(-(2**31 - 1), 2**31 - 1),
       n=st.integers(-8, 62), zp=st.integers(-128, 127), dtype=dtypes)
def test_requantize_equals_exact_rational(acc, m, n, zp, dtype):
    qmin, qmax = schemes.qrange(dtype)
    got = schemes.requantize(np.array([acc]), m, n, zp, qmin, qmax, dtype)
    assert int(got[0]) == exact_requant(acc, m, n, zp, qmin, qmax)


def exact_half_even(acc: int, m: int, n: int, zp: int, qmin: int, qmax: int) -> int:
    value = Fraction(acc * m) / Fraction(2) ** n
    low = math.floor(value)
    up = value - low > Fraction(1, 2) or (value - low == Fraction(1, 2) and low % 2 == 1)
    return max(qmin, min(qmax, low + up + zp))


@FAST
@given(acc=st.integers(-2**31, 2**31 - 1), m=st.integers(-(2**31 - 1), 2**31 - 1),
       n=st.integers(-8, 62), zp=st.integers(-128, 127), dtype=dtypes,
       rounding=st.sampled_from(["half_up", "half_even"]))
def test_requantize_rounds_exactly_on_the_float64_and_the_int64_path(acc, m, n, zp, dtype,
                                                                     rounding):
    """Small products take the float64 path, large ones or left shifts the int64 one: both
    round exactly as the rational says, ties up or to even."""
    qmin, qmax = schemes.qrange(dtype)
    want = (exact_requant if rounding == "half_up" else exact_half_even)(acc, m, n, zp, qmin,
                                                                          qmax)
    got = schemes.requantize(np.array([acc]), m, n, zp, qmin, qmax, dtype, rounding)
    assert int(got[0]) == want


@FAST
@given(k=st.integers(-32000, 32000), n=st.integers(1, 46),
       rounding=st.sampled_from(["half_up", "half_even"]))
def test_requantize_ties_on_both_paths(k, n, rounding):
    """Exact ties (acc / 2^n = k + 1/2): below n = 38 the product fits the float64 path,
    above it only the int64 one; both round ties up, or to even."""
    acc = (2 * k + 1) << (n - 1)
    exact = exact_requant if rounding == "half_up" else exact_half_even
    got = schemes.requantize(np.array([acc]), 1, n, 0, -32768, 32767, "int16", rounding)
    assert int(got[0]) == exact(acc, 1, n, 0, -32768, 32767)


@FAST
@given(accs=st.lists(st.integers(-2**31, 2**31 - 1), min_size=1, max_size=16),
       n=st.lists(st.integers(0, 40), min_size=1, max_size=16))
def test_requantize_per_channel_shifts(accs, n):
    k = min(len(accs), len(n))
    acc, shift = np.array(accs[:k]), np.array(n[:k])
    got = schemes.requantize(acc, 1, shift, 0, -128, 127)
    assert [int(v) for v in got] == [exact_requant(a, 1, s, 0, -128, 127) for a, s in zip(accs, n)]


@FAST
@given(k=st.integers(-10**6, 10**6), n=st.integers(1, 30))
def test_ties_round_half_up(k, n):
    """acc / 2^n exactly k + 1/2 rounds to k + 1, for negative k too (towards +inf)."""
    acc = (2 * k + 1) << (n - 1)
    got = schemes.rounding_shift(np.array([acc]), n)
    assert int(got[0]) == k + 1


@FAST
@given(acc=st.integers(-2**40, 2**40), m=st.integers(1, 2**21 - 1), n=st.integers(0, 20),
       dtype=dtypes)
def test_saturation_is_clamping(acc, m, n, dtype):
    qmin, qmax = schemes.qrange(dtype)
    got = int(schemes.requantize(np.array([acc]), m, n, 0, qmin, qmax, dtype)[0])
    exact = math.floor(Fraction(acc * m, 2**n) + Fraction(1, 2))
    assert qmin <= got <= qmax
    assert got == (qmax if exact >= qmax else qmin if exact <= qmin else exact)


@FAST
@given(real=st.floats(1e-12, 1e6, allow_nan=False), negative=st.booleans(),
       bits=st.integers(8, 31))
def test_fixed_point_is_close(real, negative, bits):
    real = -real if negative else real
    m, n = schemes.fixed_point(real, bits=bits)
    approx = m * 2.0 ** -n
    assert abs(approx - real) <= max(abs(real) * 2.0 ** -(bits - 1), 2.0 ** -schemes.MAX_SHIFT)
    assert abs(m) < 2**bits


@given(e=st.integers(-40, 40))
def test_powers_of_two_are_pure_shifts(e):
    assert schemes.fixed_point(2.0 ** e) == (1, -e)


@FAST
@given(ratios=st.lists(st.floats(1e-4, 1e3), min_size=2, max_size=3), sub=st.booleans())
def test_shared_shift_keeps_ratios(ratios, sub):
    reals = np.array(ratios) * np.array([1] + [-1 if sub else 1] * (len(ratios) - 1))
    mults, n = schemes.shared_shift(reals)
    assert np.allclose(mults * 2.0 ** -n, reals, rtol=2.0**-20, atol=2.0**-n)


@FAST
@given(steps=st.floats(-128, 127), ls=st.integers(-4, 12))
def test_quantize_pow2_error_is_half_a_step_inside_the_range(steps, ls):
    scale = 2.0 ** -ls
    x = steps * scale
    q = schemes.quantize(np.array([x]), scale)
    assert abs(float(schemes.dequantize(q, scale)[0]) - x) <= scale / 2 + 1e-6 * abs(x)


def test_overflowing_products_are_refused_not_wrapped():
    import pytest

    with pytest.raises(OverflowError):
        schemes.requantize(np.array([2**40]), 2**30, 10, 0, -128, 127)


def test_seed_004_log2scale_example():
    """Range [-4, 4) is log2scale 5 (seed 004)."""
    assert schemes.log2scale_for(4.0) == 5
    assert schemes.choose_params("pow2_symmetric", -3.9, 3.2).log2scale == 5


FUNCTIONS = {"sigmoid": lambda x: 1 / (1 + np.exp(-x)), "tanh": np.tanh,
             "silu": lambda x: x / (1 + np.exp(-x)),
             "hardswish": lambda x: x * np.clip(x / 6 + 0.5, 0, 1),
             "leaky": lambda x: np.where(x >= 0, x, np.float32(0.1) * x)}


@FAST
@given(name=st.sampled_from(sorted(FUNCTIONS)), s_in=st.floats(1e-3, 0.5), s_out=st.floats(1e-3, 0.5),
       zp_in=st.integers(-20, 20), zp_out=st.integers(-20, 20), dtype=st.sampled_from(["int8"]))
def test_lut_is_the_function_within_one_step(name, s_in, s_out, zp_in, zp_out, dtype):
    fn = FUNCTIONS[name]
    src, dst = QParams(s_in, zp_in, None, dtype), QParams(s_out, zp_out, None, dtype)
    table = schemes.build_lut(fn, src, dst)
    assert table.shape == (256,) and table.dtype == np.int8
    q = np.arange(-128, 128)
    exact = np.floor(fn((q - zp_in) * s_in) / s_out + 0.5) + zp_out
    assert np.all(np.abs(table.astype(np.int64) - np.clip(exact, -128, 127)) <= 1)


@FAST
@given(name=st.sampled_from(sorted(FUNCTIONS)), s_in=st.floats(1e-4, 0.5), s_out=st.floats(1e-4, 0.5),
       zp_in=st.integers(-20, 20), zp_out=st.integers(-20, 20),
       dtypes=st.sampled_from([("int8", "int8"), ("int16", "int16"), ("int16", "int8"),
                               ("int8", "int16")]),
       seed=st.integers(0, 2 ** 16))
def test_a_table_over_its_span_reads_what_the_whole_table_reads(name, s_in, s_out, zp_in, zp_out,
                                                                dtypes, seed):
    """A table is stored and run over its span (`schemes.trim_lut`: the input integers past
    which it repeats its end values) with the input clamped to it first: every input integer,
    the extremes and random ones, reads the whole table's entry, and the span is tight (its
    end entries differ from their inner neighbours unless it is one entry)."""
    src = QParams(s_in, zp_in, None, dtypes[0])
    dst = QParams(s_out, zp_out, None, dtypes[1])
    full = schemes.build_lut(FUNCTIONS[name], src, dst)
    lo, table = schemes.trim_lut(full, src.qmin)
    assert table.dtype == full.dtype and 1 <= table.size <= full.size
    rng = np.random.default_rng(seed)
    q = np.concatenate([[src.qmin, src.qmin + 1, src.qmax - 1, src.qmax, lo - 1, lo,
                         lo + table.size - 1, lo + table.size],
                        rng.integers(src.qmin, src.qmax + 1, 4096)])
    q = np.clip(q, src.qmin, src.qmax).astype(schemes.DTYPES[src.dtype])
    assert np.array_equal(schemes.lookup(table, lo, q), full[q.astype(np.int64) - src.qmin])
    every = np.arange(src.qmin, src.qmax + 1)
    assert np.array_equal(schemes.lookup(table, lo, every), full)
    if table.size > 1:
        assert table[0] != table[1] and table[-1] != table[-2]


def test_a_saturating_int16_table_keeps_only_where_its_output_changes():
    """tanh of a cell state of ±200 at int16 (madmom's LSTM): past ±6 every output is ±1 at
    the output's scale, so the table keeps 1,933 of its 65,536 entries; sigmoid, which
    saturates past ±11, 3,636; the identity keeps them all."""
    src = QParams(200 / 32767, 0, None, "int16")
    dst = QParams(1 / 32767, 0, None, "int16")
    for fn, most in ((np.tanh, 2000), (FUNCTIONS["sigmoid"], 3700)):
        first, last = schemes.table_span(schemes.build_lut(fn, src, dst))
        assert last - first + 1 < most
    first, last = schemes.table_span(schemes.build_lut(lambda x: x, src, QParams(
        200 / 32767, 0, None, "int16")))
    assert (first, last) == (0, 65535)


# ---- kernels: exactness and H-slicing ----------------------------------------------------------

def _naive_conv(x, w, bias, zp, pads, stride, dilation, group):
    xp = np.pad(x.astype(np.int64) - zp, ((0, 0), (0, 0), (pads[0], pads[1]), (pads[2], pads[3])))
    cout, cin_g, kh, kw = w.shape
    oh = (xp.shape[2] - dilation * (kh - 1) - 1) // stride + 1
    ow = (xp.shape[3] - dilation * (kw - 1) - 1) // stride + 1
    out = np.zeros((x.shape[0], cout, oh, ow), np.int64)
    for co in range(cout):
        g = co // (cout // group)
        for i in range(kh):
            for j in range(kw):
                patch = xp[:, g * cin_g:(g + 1) * cin_g, i * dilation: i * dilation + stride * (oh - 1) + 1: stride,
                           j * dilation: j * dilation + stride * (ow - 1) + 1: stride]
                out[:, co] += np.einsum("nchw,c->nhw", patch, w[co, :, i, j].astype(np.int64))
    return out + bias[None, :, None, None]


def _conv_layer(w, bias, zp, pads, stride, dilation, group):
    cout = w.shape[0]
    return QLayer("c", "conv", ["x"], ["y"],
                  attrs={"kernel": list(w.shape[2:]), "stride": [stride, stride],
                         "dilation": [dilation, dilation], "pads": list(pads), "group": group},
                  params={"input_zp": zp, "output_zp": 0, "qmin": -2**31, "qmax": 2**31 - 1,
                          "output_dtype": "int16"},
                  arrays={"weight": w, "bias": bias, "multiplier": np.ones(cout, np.int64),
                          "shift": np.zeros(cout, np.int64)})


geometry = st.fixed_dictionaries({
    "k": st.integers(1, 3), "stride": st.integers(1, 2), "dilation": st.integers(1, 2),
    "pads": st.tuples(*[st.integers(0, 2)] * 4), "group": st.sampled_from([1, 2]),
    "h": st.integers(6, 11), "w": st.integers(5, 9), "zp": st.integers(-5, 5)})


@settings(max_examples=60, deadline=None)
@given(g=geometry, seed=st.integers(0, 2**16))
def test_conv_accumulates_exactly(g, seed):
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (1, 4, g["h"], g["w"])).astype(np.int8)
    w = rng.integers(-128, 128, (4, 4 // g["group"], g["k"], g["k"])).astype(np.int8)
    bias = rng.integers(-1000, 1000, 4).astype(np.int32)
    layer = _conv_layer(w, bias, g["zp"], g["pads"], g["stride"], g["dilation"], g["group"])
    layer.params.update(qmin=-32768, qmax=32767)
    got = conv2d(layer, x)
    want = _naive_conv(x, w, bias, g["zp"], g["pads"], g["stride"], g["dilation"], g["group"])
    assert np.array_equal(got, np.clip(want, -32768, 32767).astype(np.int16))


@settings(max_examples=80, deadline=None)
@given(m=st.integers(1, 6), k=st.integers(1, 3000), p=st.integers(1, 7),
       x_bits=st.sampled_from([7, 8, 15, 16, 24, 30]), w_bits=st.sampled_from([7, 8, 15]),
       seed=st.integers(0, 2**16))
def test_int_matmul_is_exact_in_every_regime(m, k, p, x_bits, w_bits, seed):
    """One float32 GEMM, K cut into float32-exact runs, or float64: always the exact integer
    product (numpy's int64 matmul, which never goes through BLAS, is the reference)."""
    from npubuild.quant.reference import int_matmul

    rng = np.random.default_rng(seed)
    w = rng.integers(-2**w_bits, 2**w_bits, (m, k))
    x = rng.integers(-2**x_bits, 2**x_bits, (1, k, p))
    got = int_matmul(w, x.astype(np.float64))
    assert got.dtype == np.int64
    assert np.array_equal(got, w.astype(np.int64) @ x.astype(np.int64))


@settings(max_examples=40, deadline=None)
@given(g=geometry, dtype=st.sampled_from(["int8", "int16"]), seed=st.integers(0, 2**16))
def test_depthwise_conv_accumulates_exactly_for_8_and_16_bit_inputs(g, dtype, seed):
    """Depthwise windows summed in float32 while exact, else in int64 (16-bit inputs with
    large taps)."""
    rng = np.random.default_rng(seed)
    lo, hi = schemes.qrange(dtype)
    x = rng.integers(lo, hi + 1, (1, 4, g["h"], g["w"])).astype(dtype)
    w = rng.integers(-128, 128, (4, 1, g["k"], g["k"])).astype(np.int8)
    bias = rng.integers(-1000, 1000, 4).astype(np.int32)
    layer = _conv_layer(w, bias, g["zp"], g["pads"], g["stride"], g["dilation"], 4)
    got = conv_accumulator(layer, x)
    want = _naive_conv(x, w, bias, g["zp"], g["pads"], g["stride"], g["dilation"], 4)
    assert np.array_equal(got, want)


@settings(max_examples=80, deadline=None)
@given(g=geometry, kind=st.sampled_from(["conv", "maxpool", "avgpool"]), seed=st.integers(0, 2**16),
       cuts=st.lists(st.floats(0, 1), min_size=1, max_size=3))
def test_h_slices_with_their_own_padding_give_the_full_rows(g, kind, seed, cuts):
    """The compile stage's contract: run a spatial kernel on an H-slice (with halo rows and the
    slice's own padding from input_rows) and get exactly those rows of the full result."""
    rng = np.random.default_rng(seed)
    x = rng.integers(-128, 128, (1, 4, g["h"], g["w"])).astype(np.int8)
    pads = list(g["pads"])
    if kind == "conv":
        w = rng.integers(-128, 128, (4, 4 // g["group"], g["k"], g["k"])).astype(np.int8)
        layer = _conv_layer(w, rng.integers(-99, 99, 4).astype(np.int32), g["zp"], pads,
                            g["stride"], g["dilation"], g["group"])
        layer.params.update(qmin=-128, qmax=127, output_dtype="int8")
        layer.arrays["multiplier"] = rng.integers(2**29, 2**30, 4)
        layer.arrays["shift"] = rng.integers(28, 36, 4)
        run = lambda xs, p: conv2d(layer, xs, p)  # noqa: E731
    else:
        attrs = {"kernel": [g["k"], g["k"]], "stride": [g["stride"]] * 2, "dilation": [1, 1],
                 "pads": [min(p, g["k"] - 1) for p in pads], "count_include_pad": 0}
        layer = QLayer("p", kind, ["x"], ["y"], attrs=attrs,
                       params={"input_zp": g["zp"], "output_zp": 0, "qmin": -128, "qmax": 127})
        if kind == "avgpool":
            counts = np.arange(1, g["k"] * g["k"] + 1)
            m, n = schemes.fixed_point_array(1.0 / counts)
            layer.arrays = {"counts": counts, "multiplier": m, "shift": n}
        fn = maxpool2d if kind == "maxpool" else avgpool2d
        run = lambda xs, p: fn(layer, xs, p)  # noqa: E731
    full = run(x, None)
    oh = full.shape[2]
    assume(oh >= 2)
    bounds = sorted({0, oh, *[int(c * oh) for c in cuts]})
    top, bottom, left, right = layer.attrs["pads"]
    parts = []
    for r0, r1 in zip(bounds, bounds[1:]):
        h0, h1, pt, pb = input_rows(layer, r0, r1, g["h"])
        parts.append(run(x[:, :, h0:h1], (pt, pb, left, right)))
    assert np.array_equal(np.concatenate(parts, axis=2), full)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([127, 255, 2000, 8000, 32767]), st.integers(1, 300),
       st.integers(0, 2**32 - 1))
def test_integer_products_are_exact_on_every_path(x_max, k, seed):
    """`_matmul_sums` gives ``w @ x`` exactly whichever path it takes: one float32 product,
    float32 runs summed in float64, or one float64 product where the runs would be more than
    `MAX_FLOAT32_RUNS` (int16 activations: ~4 int8 weight columns per run)."""
    from npubuild.quant.reference import int_matmul

    rng = np.random.default_rng(seed)
    w = rng.integers(-127, 128, (3, k))
    x = rng.integers(-x_max, x_max + 1, (1, k, 5))
    assert np.array_equal(int_matmul(w.astype(np.int8), x.astype(np.int16), x_max), w @ x)


def test_a_remembered_float32_plan_stays_exact_for_other_activations_and_weights():
    """Large weights' float32 plans are remembered by content (the simulator reads the same
    weights anew each inference): the same weights with larger activations, and other weights
    of the same shape, still give ``w @ x`` exactly, so a remembered plan is never a stale one."""
    from npubuild.quant import reference
    from npubuild.quant.reference import PLAN_CACHED_FROM, int_matmul

    rng = np.random.default_rng(11)
    k = 2 * PLAN_CACHED_FROM // 8
    w = rng.integers(-127, 128, (8, k)).astype(np.int8)
    reference._plans.clear()
    for x_max in (127, 127, 255, 32767):
        x = rng.integers(-x_max, x_max + 1, (1, k, 3)).astype(np.int16)
        assert np.array_equal(int_matmul(w, x, x_max), w.astype(np.int64) @ x)
    assert len(reference._plans) == 3  # 127 planned once, then 255 and 32767 (own bounds)
    other = w.copy()
    other[:, : k // 2] = 127  # the same shape, a far larger row sum: needs more runs
    x = rng.integers(-255, 256, (1, k, 3)).astype(np.int16)
    assert np.array_equal(int_matmul(other, x, 255), other.astype(np.int64) @ x)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([127, 2000, 32767]), st.integers(1, 400), st.integers(1, 8),
       st.integers(0, 2**32 - 1))
def test_capped_cuts_are_the_cuts_or_none_past_the_cap(x_max, k, max_runs, seed):
    """`_exact_chunks` with ``max_runs`` gives the uncapped cuts where they are at most
    ``max_runs`` runs and None otherwise (`_matmul_sums` then takes one float64 product, as
    it did with the uncapped cuts), having passed over the columns at most ``max_runs + 1``
    times: an int16 activation's K = 1,152 was cut into all its ~290 runs first."""
    from npubuild.quant import reference

    rng = np.random.default_rng(seed)
    w_abs = np.abs(rng.integers(-127, 128, (4, k))).astype(np.float64)
    row_max = float(w_abs.sum(axis=1).max())
    full = reference._exact_chunks(w_abs, row_max, x_max)
    capped = reference._exact_chunks(w_abs, row_max, x_max, max_runs)
    assert capped == (full if full is not None and len(full) - 1 <= max_runs else None)


def test_cutting_stops_past_the_cap():
    """Past ``max_runs`` runs the cuts stop: a K of 20,000 int8 weights under an int16
    activation (a run holds ~4 columns) costs a few passes over its columns, not 5,000."""
    import time

    from npubuild.quant import reference

    w_abs = np.full((64, 20_000), 127.0)
    row_max = float(w_abs.sum(axis=1).max())
    begun = time.process_time()
    assert reference._exact_chunks(w_abs, row_max, 32767.0, reference.MAX_FLOAT32_RUNS) is None
    assert time.process_time() - begun < 2.0  # uncapped: minutes


def test_a_row_that_needs_more_runs_than_the_cap_is_known_before_any_cut(monkeypatch):
    """A row whose absolute weights sum to ``max_runs`` limits or more needs more than
    ``max_runs`` runs (each run's part of it stays under one limit): None at once, without
    the prefix sums (an M x K pass per layer and sample, BirdNET's 2,108 int16 products)."""
    from npubuild.quant import reference

    w_abs = np.full((8, 600), 127.0)
    row_max = float(w_abs.sum(axis=1).max())
    limit = reference.FLOAT32_EXACT / 32767.0
    assert row_max >= 8 * limit
    monkeypatch.setattr(np, "cumsum", lambda *a, **k: pytest.fail("prefix sums computed"))
    assert reference._exact_chunks(w_abs, row_max, 32767.0, 8) is None
