"""A failed verdict whose outputs are an anchor detector's is judged again as one, on the same
samples, and the hint says what that measured (never a task hint not measured)."""

from __future__ import annotations

import numpy as np

from npubuild.recipe.model import VerifySpec
from npubuild.verify import readings
from npubuild.verify.verdict import judge


def _anchors(logits: list[float], boxes: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    regressors = np.zeros((1, len(logits), 8))
    regressors[0, :, :4] = boxes
    return regressors, np.asarray(logits, np.float64).reshape(1, -1, 1)


OUTPUTS = ["scores", "boxes"]
BOX, SCORE = _anchors([3.0, -4.0], [[0, 0, 10, 10], [0, 0, 1, 1]])
NOISY, _ = _anchors([3.0, -4.0], [[0, 0, 10, 10], [90, -70, 50, 60]])  # an anchor not kept
MOVED, _ = _anchors([3.0, -4.0], [[9, 0, 10, 10], [0, 0, 1, 1]])       # the kept box moved


def _reading(spec: VerifySpec, got_boxes: np.ndarray) -> tuple[object, dict | None]:
    refs, gots = [{"scores": SCORE, "boxes": BOX}], [{"scores": SCORE, "boxes": got_boxes}]
    judged = lambda s: judge(s, refs, gots, refs, OUTPUTS, [])  # noqa: E731
    return judged(spec), readings.measure(spec, refs[0], OUTPUTS, judged)


def test_a_cosine_failure_on_an_anchor_detector_says_the_task_it_measured_passing():
    verdict, reading = _reading(VerifySpec(min_cosine=0.99), NOISY)
    assert not verdict.passed  # the user's cosine still decides
    assert verdict.failures[0].startswith("output 'boxes': cosine")
    assert reading["passed"] and reading["figures"]["agreeing_anchors"] == 1
    assert readings.text(reading) == (
        "judged as an anchor detector (verify.task: anchor_detector, min_task_agreement: 0.9: "
        "the anchors a decoder keeps instead of the cosines of every anchor's raw regressors) "
        "it passes on the same samples: 1 of 1 float anchors kept with the same box, none "
        "added, box IoU >= 1.000, over 1 samples")


def test_a_task_reading_that_fails_too_says_so_with_its_figure():
    _, reading = _reading(VerifySpec(min_cosine=0.99), MOVED)
    assert not reading["passed"]
    assert readings.text(reading).startswith(
        "judged as an anchor detector (verify.task: anchor_detector, min_task_agreement: 0.9) "
        "it fails too on the same samples (task anchor_detector: anchors above 0.5 with the "
        "same box (IoU >= 0.5) 0.0000 < min_task_agreement 0.9): 0 of 1 float anchors kept")


def test_the_task_without_its_bar_is_read_with_the_bar_and_other_outputs_are_not_read():
    _, reading = _reading(VerifySpec(task="anchor_detector"), NOISY)  # cosines still judged
    assert reading["passed"] and reading["min_task_agreement"] == 0.9
    _, judged_so = _reading(VerifySpec(task="anchor_detector", min_task_agreement=0.8), NOISY)
    assert judged_so is None  # already judged as the decoder reads it: nothing to hint
    refs = [{"logits": np.ones((1, 10))}]
    assert readings.measure(VerifySpec(), refs[0], ["logits"], lambda s: None) is None


def test_maps_that_only_share_a_length_are_not_read_as_anchors():
    # basic-pitch: note and onset maps [1, frames, 88] beside a contour map [1, frames, 264]
    music = {"note": np.ones((1, 172, 88)), "onset": np.ones((1, 172, 88)),
             "contour": np.ones((1, 172, 264))}
    assert readings.measure(VerifySpec(), music, list(music), lambda s: None) is None


def test_the_build_error_hint_leads_with_the_measured_reading():
    from npubuild.api import _bisection_hint

    _, reading = _reading(VerifySpec(min_cosine=0.99), NOISY)
    finding = {"stage": "quantize", "tensor": "t", "cosine": 0.8, "introduced_by": "layer 't'",
               "suggestion": "measured on the verify samples: ..."}
    hint = _bisection_hint({"finding": finding}, None, reading)
    assert hint.startswith("judged as an anchor detector (verify.task: anchor_detector")
    assert "it passes on the same samples: 1 of 1 float anchors kept" in hint
    assert "; otherwise the drop starts in stage `quantize` at tensor 't'" in hint
    assert _bisection_hint({"finding": finding}).startswith("the drop starts")
