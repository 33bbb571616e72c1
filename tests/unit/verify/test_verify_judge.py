"""verify's tensor metrics and verdict: meaningful for one-element and near-zero tensors, and a
dead channel fails even when the whole tensor's cosine is high."""

from __future__ import annotations

import numpy as np

from npubuild.verify.judge import DEAD_SPAN, Thresholds, failures, tensor_metrics

RNG = np.random.default_rng(0)


def noisy(values: np.ndarray, scale: float) -> np.ndarray:
    return values + RNG.normal(0, scale, values.shape)


def test_a_one_element_output_is_judged_over_samples_not_per_sample():
    refs = [np.array([v]) for v in (0.9, 0.1, 0.5, 0.7)]
    gots = [np.array([v]) for v in (0.1, 0.9, 0.5, 0.3)]  # every sample wrong
    m = tensor_metrics(refs, gots)
    assert m["samples_judged"] == 0 and m["min_sample_cosine"] is None  # ±1 per sample: not judged
    assert m["range_error"] == 1.0  # 0.8 off on a range of 0.8
    assert failures("output 'p'", m, Thresholds(min_cosine=0.99, max_range_error=0.1)) == [
        f"output 'p': cosine {m['cosine']:.6f} < min_cosine 0.99 over all samples",
        "output 'p': max error 1 of the reference's range > max_range_error 0.1"]


def test_a_near_zero_sample_counts_in_the_aggregate_only():
    text = RNG.uniform(0, 1, (1, 1, 32, 32))
    empty = RNG.uniform(0, 1e-3, (1, 1, 32, 32))  # an image without text
    refs, gots = [text, empty], [noisy(text, 0.01), np.zeros_like(empty)]
    m = tensor_metrics(refs, gots)
    assert m["samples_judged"] == 1 and m["worst_sample"] == 0
    assert m["min_sample_cosine"] > 0.99 and m["cosine"] > 0.99
    assert failures("output 'maps'", m, Thresholds(min_cosine=0.99)) == []


def test_a_dead_channel_fails_although_the_tensor_cosine_is_high():
    ref = RNG.uniform(0, 1, (1, 6, 50))
    ref[:, 0] *= 300  # a large channel rules the whole tensor's cosine (YOLOv8's boxes)
    got = noisy(ref, 0.001)
    got[:, 5] = 0.0
    m = tensor_metrics([ref], [got])
    assert m["cosine"] > 0.999
    assert m["dead_channels"] == [5]
    lines = failures("slice 'scores'", m, Thresholds(min_cosine=0.99))
    assert lines == ["slice 'scores': 1 dead channel(s) along axis 1 (constant where the "
                     "reference varies): [5]"]


def test_channels_that_barely_vary_are_not_judged():
    ref = RNG.uniform(0, 1, (1, 3, 40))
    ref[:, 2] = 0.5 + RNG.uniform(0, DEAD_SPAN / 10, 40)  # float noise around a constant
    got = ref.copy()
    got[:, 2] = 0.5
    m = tensor_metrics([ref], [got])
    assert m["channels_judged"] == 2 and m["dead_channel_count"] == 0


def test_the_worst_sample_and_the_worst_channel_have_their_own_thresholds():
    ref = [RNG.uniform(-1, 1, (1, 4, 30)) for _ in range(3)]
    got = [r.copy() for r in ref]
    got[2] = noisy(ref[2], 0.3)
    m = tensor_metrics(ref, got)
    assert m["worst_sample"] == 2
    limits = Thresholds(min_cosine=m["cosine"] - 0.01, min_sample_cosine=0.99,
                        min_channel_cosine=0.999)
    lines = failures("output 'y'", m, limits)
    assert lines[0].startswith("output 'y': cosine") and "< min_sample_cosine 0.99 on the worst " \
        "sample (#2;" in lines[0]
    assert lines[1].startswith(f"output 'y': channel {m['worst_channel']['index']} cosine")


def test_unset_thresholds_report_without_judging():
    ref = [RNG.uniform(-1, 1, (1, 4, 30))]
    m = tensor_metrics(ref, [-ref[0]])
    assert m["cosine"] < -0.99 and failures("NPU output 't'", m, Thresholds()) == []


def test_a_dead_hand_over_channel_is_reported_and_fails_only_when_asked():
    from npubuild.recipe.model import VerifySpec
    from npubuild.verify.verdict import handover_limits, output_limits

    ref = RNG.uniform(0, 1, (1, 4, 50))
    ref[:, 3] = 0.25 + RNG.uniform(0, 0.003, 50)  # spans less than one int8 step of the tensor
    got = ref.copy()
    got[:, 3] = 0.25  # so it rounds to a constant
    m = tensor_metrics([ref], [got])
    assert m["dead_channels"] == [3]
    assert failures("NPU output 't'", m, handover_limits(VerifySpec())) == []
    asked = VerifySpec(handover={"dead_channels": True})
    assert failures("NPU output 't'", m, handover_limits(asked)) == [
        "NPU output 't': 1 dead channel(s) along axis 1 (constant where the reference varies): [3]"]
    assert failures("output 't'", m, output_limits(VerifySpec())) != []
    assert failures("output 't'", m, output_limits(VerifySpec(dead_channels=False))) == []


def test_an_output_rounded_to_zero_everywhere_says_so_instead_of_only_cosine_zero():
    """A seal detector on pages without seals: the reference map peaks at ~1e-6, the deployed
    map is exactly 0, cosine 0. The line names both peaks and what to check (the verify data,
    or int16 on the output), since float or int16 elsewhere in the model cannot move it."""
    refs = [RNG.uniform(0, 1.6e-6, (1, 1, 8, 8)) for _ in range(3)]
    m = tensor_metrics(refs, [np.zeros_like(r) for r in refs])
    assert m["deployed_peak"] == 0.0 and 1e-6 < m["reference_peak"] <= 1.6e-6
    [line] = failures("output 'maps'", m, Thresholds(min_cosine=0.99))
    assert line.startswith("output 'maps': cosine 0.000000 < min_cosine 0.99 over all samples; "
                           "the deployed result is 0 everywhere and the reference peaks at 1.")
    assert "verify.data" in line and "int16" in line
    partly = tensor_metrics(refs, [r * 0.5 for r in refs])  # a real cosine: no such remark
    assert partly["deployed_peak"] > 0 and failures("output 'maps'", partly,
                                                    Thresholds(min_cosine=1.01))[0].endswith("over all samples")


def test_a_channels_last_score_map_is_not_judged_per_anchor():
    """A TFLite detector's [1, anchors, 1] scores: with the channels-last axis there is one
    channel (no per-anchor verdict); axis 1 would judge every anchor as a channel."""
    refs = [RNG.uniform(-8, 2, (1, 64, 1)) for _ in range(3)]
    for r in refs:
        r[0, 7, 0] = 1e-3 * RNG.uniform()  # an anchor that barely varies over the samples
    gots = [noisy(r, 0.01) for r in refs]
    for g in gots:
        g[0, 7, 0] = 0.0
    assert "dead_channels" not in tensor_metrics(refs, gots, axis=-1)
    assert tensor_metrics(refs, gots, axis=1)["channel_axis"] == 1


def test_the_recipes_input_layout_gives_the_outputs_channel_axis():
    from types import SimpleNamespace as NS

    from npubuild.recipe.model import InputSpec, ModelSpec
    from npubuild.verify.verdict import output_channel_axis

    def recipe(*layouts):
        inputs = [InputSpec(name=f"x{i}", layout=lay) for i, lay in enumerate(layouts)]
        return NS(model=ModelSpec(path="m.onnx", inputs=inputs))

    assert output_channel_axis(recipe("NHWC")) == -1
    assert output_channel_axis(recipe("any", "NCHW")) == 1
    assert output_channel_axis(recipe("any")) == 1


def test_an_output_whose_length_depends_on_its_values_is_a_miss_not_a_crash():
    """SLANet's table-structure decoder, a Loop that stops on its end token: [1, steps, 8] per
    sample, the steps differing between samples and, where int8 moved the end token, between
    the float model and the deployed pipeline (a ValueError 'shape mismatch' stopped quantize)."""
    from npubuild.verify.verdict import cosine_margins

    refs = [RNG.uniform(0, 1, (1, 54, 8)), RNG.uniform(0, 1, (1, 17, 8))]
    gots = [noisy(refs[0][:, :50], 0.001), noisy(refs[1], 0.001)]  # stops 4 steps early
    m = tensor_metrics(refs, gots)
    assert m["shape_mismatch"] == {"samples": 1, "of": 2, "sample": 0,
                                   "reference": [1, 54, 8], "deployed": [1, 50, 8]}
    assert m["cosine"] > 0.999 and "dead_channels" not in m  # axis 1 varies: not channels
    limits = Thresholds(min_cosine=0.99)
    assert failures("output 'structure'", m, limits) == [
        "output 'structure': shape [1, 50, 8] deployed where the reference has [1, 54, 8] "
        "(sample #0; 1 of 2 samples differ): its extent depends on its values (a loop that "
        "stops on its own output stops elsewhere); the figures compare the part both have"]
    assert min(cosine_margins(m, limits)) == -0.5  # fewer samples differing ranks higher
    same = tensor_metrics(refs, [noisy(r, 0.001) for r in refs])  # lengths agree: judged as ever
    assert "shape_mismatch" not in same and failures("output 'structure'", same, limits) == []


def _equal_figures_cases():
    rng = np.random.default_rng(7)
    long = rng.standard_normal((1, 3, 20011)).astype(np.float32)  # past NumPy's 8192 blocks
    yield [long, long * 0.5], [long + 1e-3, long * 0.5 - 2e-3]
    for dtype in (np.float16, np.float32, np.float64):
        refs = [rng.standard_normal((1, 5, 37)).astype(dtype) for _ in range(3)]
        yield refs, [(r + rng.normal(0, 1e-2, r.shape)).astype(dtype) for r in refs]
        yield refs, [r.copy() for r in refs]                  # identical
        yield refs, [np.zeros_like(r) for r in refs]          # rounded away
    quiet = [np.full((2, 4), 3.0, np.float32), np.zeros((2, 4), np.float32)]
    yield quiet, [q + 0.5 for q in quiet]                     # constant and silent samples
    yield [np.array([0.5]), np.array([0.2])], [np.array([0.4]), np.array([0.2])]  # one element
    tiny = np.array([1.0, 2.0, 3.0])
    yield [tiny], [tiny + 1e-300]  # a difference whose square underflows is still a difference


def test_the_fused_figures_are_the_spelled_out_figures_bit_for_bit():
    """`tensor_metrics` sums each product once over the whole tensor and each sample's slice
    (the precision search judges a long output tens of times); its figures must be the same
    bytes as the metrics spelled out per figure and per sample (`_metrics`), or a choice, a
    margin in search.json or verify's report would move."""
    import json

    from npubuild.verify.judge import _finite_float_metrics, _metrics

    for refs, gots in _equal_figures_cases():
        fused = _finite_float_metrics(refs, gots)
        assert fused is not None
        assert json.dumps(fused) == json.dumps(_metrics(refs, gots)), (refs[0].shape, refs[0].dtype)
    nan = [np.array([1.0, np.nan, 2.0])]
    assert _finite_float_metrics(nan, nan) is None  # infinities and NaNs: the spelled-out path
    assert _finite_float_metrics([np.arange(4)], [np.arange(4)]) is None  # integers too


def test_every_channel_judged_gives_the_figures_indexing_gave():
    """A channels-last output over several samples is gathered F-ordered; its row sums must
    follow the layout indexing gives (C order), not the gathered one, or the worst channel's
    cosine moves in its last bit."""
    from npubuild.verify.judge import channel_metrics

    rng = np.random.default_rng(3)
    refs = [rng.standard_normal((2, 6, 54)).astype(np.float32) for _ in range(2)]
    gots = [(r + rng.normal(0, 1e-2, r.shape)).astype(np.float32) for r in refs]
    m = channel_metrics(refs, gots, -1)
    ref = np.concatenate([np.moveaxis(r.astype(np.float64), -1, 0).reshape(54, -1) for r in refs], 1)
    got = np.concatenate([np.moveaxis(g.astype(np.float64), -1, 0).reshape(54, -1) for g in gots], 1)
    every = np.arange(54)
    dots = np.sum(ref[every] * got[every], axis=1)
    norms = np.sqrt(np.sum(ref[every] ** 2, axis=1)) * np.sqrt(np.sum(got[every] ** 2, axis=1))
    index = m["worst_channel"]["index"]
    assert m["worst_channel"]["cosine"] == dots[index] / norms[index]


def test_the_references_figures_kept_between_judges_give_the_same_figures():
    """A precision search judges tens of choices against one reference: its own figures are
    kept (``kept``) for the next call on the same arrays, and every figure stays the bytes a
    call without them gives; other reference arrays are not taken for them."""
    import json

    rng = np.random.default_rng(5)
    refs = [rng.standard_normal((1, 4, 300)).astype(np.float32) for _ in range(3)]
    others = [r * 2 + 1 for r in refs]
    kept: dict = {}
    for scale in (1e-3, 1e-2, 1e-1):
        gots = [(r + rng.normal(0, scale, r.shape)).astype(np.float32) for r in refs]
        for reference in (refs, others, refs[:2]):
            expected = json.dumps(tensor_metrics(reference, gots[:len(reference)]))
            assert json.dumps(tensor_metrics(reference, gots[:len(reference)], kept=kept)) == expected
    assert len(kept) == 6  # whole tensor and channels, for each of the three references


def test_an_output_selected_by_an_index_is_judged_on_the_npu_tensors_it_selects_from():
    """isbnx's end-to-end YOLO: output0 is the top rows by score of the NPU's boxes and scores;
    near-ties swap rows under any change (cosine 0.89 at 1e-4 of noise), so output0 is
    reported and the hand-over tensors it is selected from are judged with its min_cosine."""
    from npubuild.recipe.model import VerifySpec
    from npubuild.verify.verdict import judge

    boxes = [RNG.uniform(0, 1280, (1, 64, 4)) for _ in range(3)]
    refs = [{"output0": b[:, :8]} for b in boxes]
    shuffled = [{"output0": b[:, [1, 0, 3, 2, 5, 4, 7, 6]]} for b in boxes]  # rows swapped
    floats = [{"boxes": b} for b in boxes]
    spec = VerifySpec(min_cosine=0.99)
    close = [{**s, "boxes": noisy(b, 0.5)} for s, b in zip(shuffled, boxes)]
    unselected = judge(spec, refs, close, floats, ["output0"], ["boxes"], judged_only=True)
    assert not unselected.passed  # today's verdict: the swapped rows fail output0
    verdict = judge(spec, refs, close, floats, ["output0"], ["boxes"], judged_only=True,
                    selected={"output0": ["boxes"]})
    assert verdict.passed and verdict.outputs["output0"]["cosine"] < 0.99  # reported
    assert verdict.npu_outputs["boxes"]["cosine"] > 0.99
    far = [{**s, "boxes": noisy(b, 400.0)} for s, b in zip(shuffled, boxes)]
    failed = judge(spec, refs, far, floats, ["output0"], ["boxes"], judged_only=True,
                   selected={"output0": ["boxes"]})
    assert failed.failures[0].startswith(
        "NPU output 'boxes' (what 'output0' selects from): cosine ")
    assert failed.failures[0].endswith("over all samples (against the float pipeline)")


def test_the_report_holds_a_selected_output_reported_and_its_hand_overs_judged():
    """The report page and the run's headline read the same limits verify judged with."""
    from npubuild.report.judged import tensor_figures

    report = {"accuracy": {"outputs": {"output0": {"cosine": 0.89, "min_sample_cosine": 0.85}}},
              "verify": {"npu_outputs": {"boxes": {"cosine": 0.999, "min_sample_cosine": 0.998}},
                         "selected": {"output0": ["boxes"]}}}
    figures = {name: figs for _, name, figs in tensor_figures(report, {"min_cosine": 0.99})}
    assert [f.limit for f in figures["output0"]] == [None, None]
    assert [(f.limit, f.limit_name, f.ok) for f in figures["boxes"]] == [
        (0.99, "verify.min_cosine", True), (0.99, "verify.min_cosine", True)]
