"""Rounding agrees with ONNX Runtime: QuantizeLinear's ties to even for float → int and for
float-scale requantization, half up (seed 004) kept only where pow2 graphs say so."""

from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from npubuild import onnx_io
from npubuild.quant import schemes

FAST = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@lru_cache(maxsize=None)
def _ort_requant():
    """ORT: int32 acc → DequantizeLinear(scale 2^-n) → QuantizeLinear(scale 1, zp) as int8."""
    nodes = [helper.make_node("DequantizeLinear", ["acc", "s_in"], ["real"]),
             helper.make_node("QuantizeLinear", ["real", "one", "zp"], ["y"])]
    graph = helper.make_graph(
        nodes, "rq", [helper.make_tensor_value_info("acc", TensorProto.INT32, [None]),
                      helper.make_tensor_value_info("s_in", TensorProto.FLOAT, []),
                      helper.make_tensor_value_info("zp", TensorProto.INT8, [])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [None])],
        [helper.make_tensor("one", TensorProto.FLOAT, [], [1.0])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return onnx_io.session(model)


def _ort_requantize(acc: np.ndarray, n: int, zp: int) -> np.ndarray:
    feeds = {"acc": acc.astype(np.int32), "s_in": np.array(2.0 ** -n, np.float32),
             "zp": np.array(zp, np.int8)}
    return _ort_requant().run(None, feeds)[0]


@FAST
@given(k=st.lists(st.integers(-2**16, 2**16), min_size=1, max_size=32), n=st.integers(1, 7),
       zp=st.integers(-20, 20), ties=st.booleans())
def test_half_even_requantize_equals_onnxruntime(k, n, zp, ties):
    """acc / 2^n, ties included (every acc an odd multiple of 2^(n-1) when ``ties``), rounds
    exactly as ORT's QuantizeLinear (float32 is exact here: |acc| < 2^24)."""
    acc = np.array(k, np.int64)
    if ties:
        acc = (2 * acc + 1) << (n - 1)
    ours = schemes.requantize(acc, 1, n, zp, -128, 127, "int8", rounding="half_even")
    assert np.array_equal(ours, _ort_requantize(acc, n, zp))


@FAST
@given(acc=st.integers(-2**31, 2**31 - 1), m=st.integers(-(2**31 - 1), 2**31 - 1),
       n=st.integers(-8, 62), zp=st.integers(-128, 127))
def test_half_even_requantize_equals_exact_rational(acc, m, n, zp):
    value = Fraction(acc * m) / Fraction(2) ** n
    floor = math.floor(value)
    exact = floor + (1 if value - floor > Fraction(1, 2) or (
        value - floor == Fraction(1, 2) and floor % 2) else 0)
    got = schemes.requantize(np.array([acc]), m, n, zp, -32768, 32767, "int16", rounding="half_even")
    assert int(got[0]) == max(-32768, min(32767, exact + zp))


@FAST
@given(k=st.integers(-10**6, 10**6), n=st.integers(1, 30))
def test_pow2_ties_still_round_half_up(k, n):
    acc = (2 * k + 1) << (n - 1)
    assert int(schemes.rounding_shift(np.array([acc]), n, "half_up")[0]) == k + 1
    assert int(schemes.rounding_shift(np.array([acc]), n, "half_even")[0]) == k + (k % 2)


@lru_cache(maxsize=None)
def _ort_quantize_linear():
    nodes = [helper.make_node("QuantizeLinear", ["x", "s", "zp"], ["y"])]
    graph = helper.make_graph(
        nodes, "q", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [None]),
                     helper.make_tensor_value_info("s", TensorProto.FLOAT, []),
                     helper.make_tensor_value_info("zp", TensorProto.INT8, [])],
        [helper.make_tensor_value_info("y", TensorProto.INT8, [None])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 8
    return onnx_io.session(model)


@FAST
@given(halves=st.lists(st.integers(-300, 300), min_size=1, max_size=32), e=st.integers(-8, 4),
       zp=st.integers(-10, 10))
def test_quantize_equals_onnxruntime_quantizelinear(halves, e, zp):
    """Float → int8 on exact ties (x = h/2 · 2^e) and everything else: identical to ORT."""
    scale = 2.0 ** e
    x = (np.array(halves, np.float64) / 2 * scale).astype(np.float32)
    ours = schemes.quantize(x, scale, zp, "int8")
    feeds = {"x": x, "s": np.array(scale, np.float32), "zp": np.array(zp, np.int8)}
    assert np.array_equal(ours, _ort_quantize_linear().run(None, feeds)[0])


def test_rounding_per_scheme():
    assert schemes.rounding_for("pow2_symmetric") == "half_up"
    assert schemes.rounding_for("symmetric") == schemes.rounding_for("asymmetric") == "half_even"
