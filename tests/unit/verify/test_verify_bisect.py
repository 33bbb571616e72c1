"""The bisection names the tensor whose cosine drops most (and its producer), not the first one
below the threshold, and never suggests what the recipe already does."""

from __future__ import annotations

import numpy as np

from npubuild.verify.bisect import RecipeFixes, TensorDrop, bisect, explain_quantize

# graph order: a layer at 0.97 comes first below 0.99, then a GELU table collapses (0.996 →
# 0.05) and the head after it is low only because of it
DROPS = [TensorDrop("conv0", "conv", "a", 0.998, 1.0),
         TensorDrop("dense", "conv", "c", 0.97, 0.998),
         TensorDrop("gelu", "lut", "b", 0.05, 0.996),
         TensorDrop("head", "conv", "d", 0.04, 0.05)]


def test_the_finding_is_the_largest_drop_and_names_its_producer():
    finding = explain_quantize("out", 0.04, DROPS, 0.99, RecipeFixes())
    assert (finding.tensor, finding.producer, finding.cosine) == ("b", "gelu", 0.05)
    assert finding.introduced_by == "layer 'gelu' (lut; its inputs at cosine 0.9960)"


def test_accumulated_small_drops_say_so():
    drops = [TensorDrop(f"n{i}", "conv", f"t{i}", 1 - 0.004 * (i + 1), 1 - 0.004 * i) for i in range(5)]
    finding = explain_quantize("out", 0.98, drops, 0.99, RecipeFixes("per_tensor", "kl"))
    assert finding.introduced_by == "the accumulated quantization error"
    assert finding.suggestion.startswith("use per_channel weights")
    assert "another method than kl (minmax, percentile, mse)" in finding.suggestion


def test_a_fix_the_recipe_has_is_not_suggested_again():
    fixes = RecipeFixes("per_channel", "minmax", frozenset({"gelu"}), int16=True)
    finding = explain_quantize("out", 0.04, DROPS, 0.99, fixes)
    assert "overrides" not in finding.suggestion and "force_cpu: ['gelu']" in finding.suggestion
    fresh = explain_quantize("out", 0.04, DROPS, 0.99, RecipeFixes(int16=True)).suggestion
    assert "precision: int16" in fresh and "quantization.overrides: [{nodes: ['gelu']}]" in fresh
    accumulated = explain_quantize("out", 0.98, DROPS[:1], 0.99, fixes).suggestion
    assert "per_channel" not in accumulated and "another method than minmax" in accumulated


def test_the_stage_that_takes_a_tensor_furthest_below_its_own_limit_is_explained(tmp_path):
    ref = {"y": np.arange(8.0), "scores": np.linspace(0, 1, 8)}
    bad = {"y": ref["y"] + 0.01, "scores": ref["scores"][::-1]}
    stages = {"import": lambda: ref, "surgery": lambda: ref, "fusion": lambda: ref,
              "split": lambda: ref, "quantize": lambda: bad, "compile": lambda: bad}
    result = bisect({}, stages, {"y": 0.99, "scores": 0.9}, lambda: DROPS)
    assert [c["stage"] for c in result.checked] == ["surgery", "fusion", "split", "quantize", "compile"]
    assert result.checked[3]["worst_output"] == "scores"
    assert (result.finding.stage, result.finding.tensor) == ("quantize", "b")
    passing = bisect({}, stages, {"y": 0.99}, lambda: DROPS)
    assert passing.finding is None


def test_a_clipped_tensor_asks_for_calibration_data_not_more_bits():
    collapse = [TensorDrop("/m.8/ConvSilu", "lut", "b", 0.37, 1.0, clipped=0.2)]
    suggestion = explain_quantize("out", 0.3, collapse, 0.99, RecipeFixes(int16=True)).suggestion
    assert suggestion.startswith("calibrate on data that covers this input: 20.0% of its float")
    assert "int16" not in suggestion and "nodes: ['/m.8/ConvSilu']" in suggestion


def test_a_one_value_tensor_is_judged_by_its_error_over_its_range_not_by_its_sign():
    from types import SimpleNamespace

    from dataclasses import asdict

    from npubuild.api import _bisection_hint
    from npubuild.verify.bisect import tensor_similarity

    # a pose flag's logit, int8 over [-4.5, 3.5]: 0.9 in float, -0.2 deployed (4 steps off)
    qgraph = SimpleNamespace(tensors={"flag": SimpleNamespace(is_float=False, scale=8 / 255,
                                                              dtype="int8")})
    flag = tensor_similarity(qgraph, "flag", np.array([[0.9]]), np.array([[-0.2]]))
    assert abs(flag - (1 - 1.1 / 8)) < 1e-12  # not the cosine -1.0 that outranked every layer
    drops = [TensorDrop("conv_flag", "conv", "flag", flag, 0.97, measure="range"),
             TensorDrop("conv_seg", "conv", "seg", 0.60, 0.95)]
    assert explain_quantize("out", 0.6, drops, 0.99, RecipeFixes()).tensor == "seg"
    alone = explain_quantize("out", 0.6, drops[:1], 0.99, RecipeFixes())
    hint = _bisection_hint({"finding": asdict(alone)})
    assert "at tensor 'flag' (largest error 13.7% of its calibrated range)" in hint
    wide = np.linspace(-1, 1, 16)
    assert tensor_similarity(qgraph, "flag", wide, -wide) == -1.0  # a map keeps its cosine


def test_an_output_whose_length_differs_is_the_worst_tensor_not_a_crash():
    """A decoding loop that stops at another step in int8 gives an output of another length:
    verify judges it a miss, but the bisection's ranking crashed on it (`ValueError: shape
    mismatch: (1, 36, 50) vs (1, 32, 50)` on SLANet-plus), hiding the verdict."""
    from npubuild.verify.bisect import worst

    rng = np.random.default_rng(0)
    tokens, boxes = rng.random((1, 36, 50)), rng.random((1, 36, 8))
    reference = {"tokens": tokens, "boxes": boxes}
    actual = {"tokens": tokens[:, :32], "boxes": boxes + 0.01}
    name, cosine, margin = worst(reference, actual, {"tokens": 0.99, "boxes": 0.99})
    assert (name, cosine) == ("tokens", 0.0) and margin == -0.99
