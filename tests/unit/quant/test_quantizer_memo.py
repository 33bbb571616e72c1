"""`Quantizer.memo`: the quantizers of one float graph and its statistics (the precision
search builds one per choice it scores or prices: GTCRN's budget fit, thousands over 4,300
layers) share each layer's placement, each constant's integers and each tensor's parameters,
keyed by what they are computed from. A quantizer on a shared memo gives what a fresh one
gives, whatever choices came before it, and computes only what its choice changes."""

from __future__ import annotations

import itertools
from dataclasses import replace

import numpy as np
from onnx import helper

from npubuild.quant import calibrate, quantizer
from npubuild.quant.lower import lower
from tests.unit.quant.helpers import feeds_for, model

CONFIG = quantizer.QuantConfig(scheme="symmetric", method="percentile", int16_underflow=True)


def conv_table_scale_concat():
    """A conv, a Sigmoid table, a Mul by a per-channel constant and a concat of the two
    branches: placements, tables, constants and shared concat scales for a choice to move."""
    rng = np.random.default_rng(3)
    m = model([helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
               helper.make_node("Sigmoid", ["c"], ["s"], name="sig"),
               helper.make_node("Mul", ["s", "k"], ["m"], name="scale"),
               helper.make_node("Relu", ["c"], ["r"], name="relu"),
               helper.make_node("Concat", ["m", "r"], ["y"], name="cat", axis=1)],
              {"x": [1, 3, 8, 8]}, {"y": [1, 8, 8, 8]},
              {"w": rng.normal(0, 0.5, (4, 3, 3, 3)), "b": rng.normal(0, 0.1, 4),
               "k": rng.uniform(0.01, 3.0, (1, 4, 1, 1))})
    fg, probe = lower(m)
    return fg, calibrate.observe(fg, probe, feeds_for(m, 4), "percentile")


CHOICES = [{}, {"float_tensors": frozenset({"s"})}, {"int16_tensors": frozenset({"c"})},
           {"int16_tensors": frozenset({"m", "k"})}, {"float_tensors": frozenset({"r"}),
                                                       "int16_tensors": frozenset({"s"})},
           {"method": "minmax"}, {"tensor_methods": (("c", "minmax"),)}]


def _content(q: quantizer.Quantizer, name: str):
    """What a quantizer hands on, as comparable values: its graph's files' document and
    arrays, its tensors' parameters and layers in float, its records."""
    qg = q.run(name)
    arrays = {}
    document = qg._document(arrays)
    params, cpu = q.tensor_params()
    return (document, {k: (v.dtype, v.shape, v.tobytes()) for k, v in sorted(arrays.items())},
            params, sorted(cpu), {t: r.as_dict() for t, r in q.records.items()})


def test_a_quantizer_on_a_shared_memo_gives_what_a_fresh_one_gives_in_any_order():
    fg, stats = conv_table_scale_concat()
    fresh = [_content(quantizer.Quantizer(fg, stats, replace(CONFIG, **c)), "g") for c in CHOICES]
    for order in itertools.islice(itertools.permutations(range(len(CHOICES))), 0, None, 700):
        memo, ranges = {}, {}
        for i in order:
            q = quantizer.Quantizer(fg, stats, replace(CONFIG, **CHOICES[i]), ranges=ranges,
                                    memo=memo)
            assert _content(q, "g") == fresh[i], CHOICES[i]


def test_a_choice_seen_before_costs_look_ups_alone(monkeypatch):
    fg, stats = conv_table_scale_concat()
    memo, ranges = {}, {}
    for c in CHOICES:
        quantizer.Quantizer(fg, stats, replace(CONFIG, **c), ranges=ranges, memo=memo
                            ).tensor_params()
    computed = []
    for name in ("_placed", "_quantized_constant", "_chosen", "_underflows",
                 "_lut_input_sqnr_db"):
        original = getattr(quantizer.Quantizer, name)
        monkeypatch.setattr(quantizer.Quantizer, name,
                            lambda self, *a, _f=original, _n=name, **k:
                            computed.append(_n) or _f(self, *a, **k))
    for c in CHOICES:
        quantizer.Quantizer(fg, stats, replace(CONFIG, **c), ranges=ranges, memo=memo
                            ).tensor_params()
    assert computed == []
    # a new choice places what it changes: the one layer its float tensor touches (the conv
    # reading x; no choice before touched it)
    quantizer.Quantizer(fg, stats, replace(CONFIG, float_tensors=frozenset({"x"})),
                        ranges=ranges, memo=memo).tensor_params()
    assert computed.count("_placed") == 1 and "_quantized_constant" not in computed
