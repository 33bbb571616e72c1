"""verify names the values its data reach that calibration never produced (a face detector
calibrated on images without faces), with the sample, before the bisection's hint."""

from __future__ import annotations

import numpy as np

from npubuild.api import _bisection_hint
from npubuild.verify.coverage import note, unseen_values

STEP = 0.7


def calibration(lo: float, hi: float) -> dict:
    return {"graphs": {"graph_0": {"tensors": {"scores": {"min": lo, "max": hi, "scale": STEP},
                                               "inner": {"min": -1.0, "max": 1.0, "scale": 0.01}}}}}


def scores(peak: float) -> dict:
    x = np.linspace(-180.0, -5.0, 2304).reshape(1, 2304, 1)
    x[0, 360, 0] = peak
    return {"scores": x}


def test_a_score_far_past_what_calibration_saw_is_named_with_its_sample():
    found = unseen_values(calibration(-190.0, -0.4), [scores(-6.0), scores(2.32)],
                          ["rocket.jpg", "astronaut.png"])
    assert found == [{"tensor": "scores", "sample": "astronaut.png", "end": "above", "steps": 3.89,
                      "value": 2.32, "calibrated": [-190.0, -0.4]}]
    text = note(found)
    assert "'scores' reaches 2.32 on astronaut.png where calibration saw -190 .. -0.4 " \
           "(3.89 steps above)" in text and "quantization.calibration.data" in text


def test_a_far_tail_at_the_other_end_does_not_hide_the_clipped_positive():
    low = scores(-6.0)
    low["scores"][0, 0, 0] = -200.0  # 14 steps below what calibration saw
    found = unseen_values(calibration(-190.0, -0.4), [low, scores(2.32)], ["rocket.jpg", "astronaut.png"])
    assert [(f["end"], f["sample"]) for f in found] == [("below", "rocket.jpg"), ("above", "astronaut.png")]


def test_values_within_two_steps_of_calibration_and_tensors_not_handed_over_are_quiet():
    assert unseen_values(calibration(-190.0, -0.4), [scores(0.9)], ["a.png"]) == []
    assert note([]) == ""


def test_the_hint_puts_the_calibration_gap_before_the_bisection():
    found = unseen_values(calibration(-190.0, -0.4), [scores(2.32)], ["astronaut.png"])
    finding = {"stage": "quantize", "tensor": "t", "cosine": 0.94, "introduced_by": "layer 'c'",
               "suggestion": "int16 on 't': worst cosine 0.98 -> 0.985 (still fails)"}
    hint = _bisection_hint({"finding": finding}, found)
    assert hint.startswith("the verify data reach values the calibration data never produced")
    assert "; then the drop starts in stage `quantize`" in hint
    assert _bisection_hint({"finding": finding}).startswith("the drop starts")
    assert _bisection_hint(None, found).startswith("the verify data reach")


def test_a_tensor_holding_the_same_values_as_another_is_named_once():
    cal = calibration(-190.0, -0.4)
    cal["graphs"]["graph_2"] = {"tensors": {"Identity_1": dict(cal["graphs"]["graph_0"]["tensors"]["scores"])}}
    sample = scores(2.32)
    sample["Identity_1"] = sample["scores"].reshape(2304, 1)
    assert [f["tensor"] for f in unseen_values(cal, [sample], ["astronaut.png"])] == ["Identity_1"]


def test_what_a_passing_output_clips_is_left_out_with_its_hand_over_twin():
    """Pose detection: its scores reach far below calibration (harmless) while its boxes fail."""
    cal = calibration(-190.0, -0.4)
    cal["graphs"]["graph_2"] = {"tensors": {"Identity_1": dict(cal["graphs"]["graph_0"]["tensors"]["scores"])}}
    sample = scores(2.32)
    sample["Identity_1"] = sample["scores"].reshape(2304, 1)
    assert unseen_values(cal, [sample], ["astronaut.png"], passing=["Identity_1"]) == []
    assert len(unseen_values(cal, [sample], ["astronaut.png"], passing=["Identity"])) == 1
