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


def two_convs():
    """Conv → Relu → Conv → Relu (per channel): a choice on the second conv's output leaves
    the first conv's tensors alone."""
    rng = np.random.default_rng(4)
    m = model([helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], name="conv1", pads=[1, 1, 1, 1]),
               helper.make_node("Relu", ["c1"], ["r1"], name="relu1"),
               helper.make_node("Conv", ["r1", "w2", "b2"], ["c2"], name="conv2", pads=[1, 1, 1, 1]),
               helper.make_node("Relu", ["c2"], ["y"], name="relu2")],
              {"x": [1, 3, 8, 8]}, {"y": [1, 4, 8, 8]},
              {"w1": rng.normal(0, 0.5, (4, 3, 3, 3)), "b1": rng.normal(0, 0.1, 4),
               "w2": rng.normal(0, 0.5, (4, 4, 3, 3)), "b2": rng.normal(0, 0.1, 4)})
    fg, probe = lower(m)
    return fg, calibrate.observe(fg, probe, feeds_for(m, 4), "percentile")


def test_a_choice_builds_and_exports_only_the_conv_layers_whose_tensors_it_changes(monkeypatch):
    """The precision search's `Quantizer.weighted` graphs and `fakequant.choice_inputs` of
    them on a shared memo: a conv layer is built, and exported to the fake-quant model's
    inputs, once per what it is built from (its tensors' parameters, its weights' dtype);
    a choice that leaves a layer's tensors alone reuses it, and every choice's inputs equal
    those a fresh quantizer and no memo give."""
    from npubuild.quant import fakequant, qdq

    fg, stats = two_convs()
    config = replace(CONFIG, granularity="per_channel", int16_underflow=False)
    keys = fakequant.export_graphs({0: (quantizer.Quantizer(fg, stats, config).run("g"), fg)}
                                   )[0].weight_keys
    assert sorted(keys) == ["conv1", "conv2"]
    built, exported = [], []
    build, fragment = quantizer.Quantizer._build, qdq.FRAGMENTS["conv"]
    monkeypatch.setattr(quantizer.Quantizer, "_build",
                        lambda self, layer: built.append(layer.name) or build(self, layer))
    monkeypatch.setitem(qdq.FRAGMENTS, "conv",
                        lambda b, layer, key: exported.append(layer.name) or fragment(b, layer, key))
    memo, ranges = {}, {}
    # (each Relu folds into its conv: r1 is the first conv's output and the second's input)
    # the second conv's output in int16, then also its input, then int8 everywhere again,
    # then the first choice again: each conv rebuilt where its tensors moved
    choices = [{}, {"int16_tensors": frozenset({"y"})},
               {"int16_tensors": frozenset({"y", "r1"})}, {},
               {"int16_tensors": frozenset({"y"})}]
    expected = [["conv1", "conv2"], ["conv2"], ["conv1", "conv2"], [], []]
    for choice, rebuilt in zip(choices, expected):
        c = replace(config, **choice)
        del built[:], exported[:]
        shared = quantizer.Quantizer(fg, stats, c, ranges=ranges, memo=memo)
        got = fakequant.choice_inputs(shared.weighted("g"), fg, keys,
                                      memo.setdefault(("choice inputs",), {}))
        assert built == rebuilt and exported == rebuilt, choice
        want = fakequant.choice_inputs(quantizer.Quantizer(fg, stats, c).weighted("g"), fg, keys)
        assert list(got) == list(want)
        for name in want:
            assert got[name].dtype == want[name].dtype
            np.testing.assert_array_equal(got[name], want[name])


def test_a_choices_fake_quant_inputs_on_a_shared_memo_are_a_fresh_quantizers():
    """`fakequant.quantizer_inputs` (parameters, placement, weights and quantized constants:
    a Mul by a per-channel constant int16 or int8) from quantizers on one memo, in any order
    of choices, equal those of a fresh quantizer each."""
    from npubuild.quant import fakequant

    fg, stats = conv_table_scale_concat()
    q0 = quantizer.Quantizer(fg, stats, CONFIG)
    pipeline = fakequant.FakeQuantPipeline.__new__(fakequant.FakeQuantPipeline)
    pipeline.exported = fakequant.export_graphs({0: (q0.run("g"), fg)})
    assert [name for name, _ in pipeline.exported[0].constants] == ["k::c"]

    def inputs(q):
        return {k: (v.dtype, v.shape, v.tobytes())
                for k, v in fakequant.quantizer_inputs(q, 0, fg, pipeline).items()}
    fresh = [inputs(quantizer.Quantizer(fg, stats, replace(CONFIG, **c))) for c in CHOICES]
    assert len({str(sorted(f.items())) for f in fresh}) > 3
    for order in itertools.islice(itertools.permutations(range(len(CHOICES))), 0, None, 700):
        memo, ranges = {}, {}
        for i in [*order, *order]:
            q = quantizer.Quantizer(fg, stats, replace(CONFIG, **CHOICES[i]), ranges=ranges,
                                    memo=memo)
            assert inputs(q) == fresh[i], CHOICES[i]
