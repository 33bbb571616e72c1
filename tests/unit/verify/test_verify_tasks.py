"""Task-level agreement: classifier top-1/top-5, text-map IoU (images without text add nothing)."""

from __future__ import annotations

import numpy as np

from npubuild.verify import tasks


def test_classifier_counts_top1_and_top5_agreement():
    refs = [np.eye(10)[k][None] for k in (1, 2, 3, 4)]
    gots = [refs[0], refs[1] * 0.5 + np.eye(10)[7] * 0.9, refs[2], (np.eye(10)[0] - np.eye(10)[4])[None]]
    result = tasks.classifier(refs, gots)
    assert (result["top1_agreement"], result["top5_agreement"]) == (0.5, 0.75)
    assert result["agreement"] == 0.5 and result["classes"] == 10


def test_text_map_iou_over_samples_ignores_an_empty_map():
    text = np.zeros((1, 1, 8, 8))
    text[..., 2:6, 2:6] = 0.9
    shifted = np.roll(text, 1, axis=-1)
    empty = np.full((1, 1, 8, 8), 1e-3)
    result = tasks.text_detection([text, empty], [shifted, np.zeros_like(empty)])
    assert result["text_map_iou"] == 12 / 20  # 4x4 squares one pixel apart


def _ctc(sequence: list[int], classes: int = 6) -> np.ndarray:
    """One-hot CTC scores [1, T, classes] for a per-step class sequence."""
    return np.eye(classes)[sequence][None]


def test_ctc_greedy_merges_repeats_and_drops_blanks():
    assert tasks.ctc_greedy(_ctc([0, 3, 3, 0, 3, 5, 5, 0])) == [3, 3, 5]
    assert tasks.edit_distance([3, 3, 5], [3, 5]) == 1 and tasks.edit_distance([], [1, 2]) == 2


def test_text_recognition_counts_samples_with_the_same_text_and_character_errors():
    refs = [_ctc([1, 0, 2, 2]), _ctc([4, 4, 0, 5])]
    gots = [_ctc([1, 1, 2, 0]), _ctc([4, 0, 4, 5])]  # same text; one character more
    result = tasks.text_recognition(refs, gots)
    assert result["agreement"] == 0.5 and result["same_text"] == 1
    assert (result["character_errors"], result["characters"]) == (1, 4)


def test_text_recognition_finds_a_blank_in_the_last_class_of_a_time_major_head():
    # captcha-whisperer's CRNN: logits [T, 1, 37], class 36 the blank, class 0 the digit "0";
    # the deployed pipeline loses the "0" of the second line (read with class 0 as the blank,
    # both lines would be the same text and every blank a character)
    time_major = lambda sequence: np.eye(6)[sequence][:, None]  # noqa: E731
    refs = [time_major([5, 1, 5, 5, 2, 5]), time_major([0, 5, 3, 5, 5, 5])]
    gots = [time_major([5, 1, 1, 5, 2, 5]), time_major([5, 5, 3, 5, 5, 5])]
    result = tasks.text_recognition(refs, gots)
    assert result["same_text"] == 1 and result["agreement"] == 0.5 and result["blank"] == 5
    assert (result["character_errors"], result["characters"]) == (1, 4)


def test_binary_map_is_the_iou_above_its_threshold():
    ref = np.array([[0.9, 0.6, 0.1, 0.2]])
    got = np.array([[0.8, 0.4, 0.7, 0.1]])
    assert tasks.binary_map([ref], [got])["iou"] == 1 / 3
    assert tasks.binary_map([ref], [got], threshold=0.3)["iou"] == 2 / 3


def test_the_task_reads_the_outputs_it_is_given_and_judges_the_lowest():
    from types import SimpleNamespace

    from npubuild.verify.verdict import task_check

    spec = SimpleNamespace(task="binary_map", task_outputs=["note", "onset"], task_threshold=0.5)
    refs = [{"note": np.array([0.9, 0.9]), "onset": np.array([0.9, 0.1]), "other": np.ones(2)}]
    gots = [{"note": np.array([0.9, 0.9]), "onset": np.array([0.1, 0.9]), "other": np.ones(2)}]
    result = task_check(spec, None, refs, gots, refs, ["other", "note", "onset"])
    assert result["outputs"]["note"]["iou"] == 1.0 and result["outputs"]["onset"]["iou"] == 0.0
    assert result["agreement"] == 0.0


def _anchors(logits: list[float], boxes: list[list[float]]) -> tuple[np.ndarray, np.ndarray]:
    """An anchor detector's two outputs: regressors [1, n, 8] (x, y, w, h, two keypoints) and
    score logits [1, n, 1]."""
    regressors = np.zeros((1, len(logits), 8))
    regressors[0, :, :4] = boxes
    return regressors, np.asarray(logits, np.float64).reshape(1, -1, 1)


def test_anchor_outputs_are_found_by_shape():
    shapes = {"scores": (1, 896, 1), "regressors": (1, 896, 16), "other": (1, 10)}
    assert tasks.anchor_outputs(shapes) == ("regressors", "scores")
    assert tasks.anchor_outputs({"a": (1, 896, 16), "b": (1, 895, 1)}) is None


def test_anchor_detector_judges_only_the_anchors_either_side_keeps():
    # anchor 0: kept by both, box moved a little; anchor 1: kept by both, box moved far;
    # anchor 2: kept by the deployed side only; anchor 3: far below the threshold on both
    # sides with wildly different regressors (noise no decoder reads): not judged
    box_ref, score_ref = _anchors([3.0, 2.0, -0.5, -300.0],
                                  [[0, 0, 10, 10], [0, 0, 10, 10], [0, 0, 4, 4], [0, 0, 1, 1]])
    box_got, score_got = _anchors([2.5, 1.0, 0.3, -280.0],
                                  [[1, 0, 10, 10], [8, 0, 10, 10], [0, 0, 4, 4], [50, 9, 70, 2]])
    result = tasks.anchor_detector([box_ref], [box_got], [score_ref], [score_got])
    assert (result["float_anchors"], result["deployed_anchors"], result["agreeing_anchors"]) == (2, 3, 1)
    assert result["agreement"] == 1 / 3
    assert abs(result["min_box_iou"] - 20 / 180) < 1e-12  # 2x10 overlap of two 10x10 boxes


def test_the_anchor_task_evidence_counts_the_anchors_the_deployed_pipeline_adds():
    """Round 10: MediaPipe's full palm detector kept no anchor in float on the verify photos
    (no hands) and two in the deployed pipeline; the headline read "0.0000 ..., over 0 float
    anchors kept in 6 images", which reads as nothing judged. It now names what was added."""
    from npubuild.report.judged import task_evidence

    palm = {"task": "anchor_detector", "samples": 6, "float_anchors": 0, "deployed_anchors": 2,
            "agreeing_anchors": 0, "agreement": 0.0}
    assert task_evidence(palm) == "over 0 float anchors kept, 2 added by the deployed pipeline, in 6 images"
    faces = {**palm, "float_anchors": 10, "deployed_anchors": 10, "agreeing_anchors": 7}
    assert task_evidence(faces) == "over 10 float anchors kept, 3 added by the deployed pipeline, in 6 images"
    same = {**palm, "float_anchors": 4, "deployed_anchors": 4, "agreeing_anchors": 4}
    assert task_evidence(same) == "over 4 float anchors kept in 6 images"  # none added: as before


def test_an_anchor_detector_where_no_anchor_is_kept_judges_nothing():
    """As a map task over samples where neither side reaches the threshold (round 9): no
    anchor kept on either side is no evidence of agreement, not a perfect 1.0 (round 10's
    detectors on photos without hands or faces); a min_task_agreement set on it fails, saying
    why."""
    from npubuild.verify.verdict import task_verdict

    box, score = _anchors([-9.0, -7.0], [[0, 0, 1, 1], [0, 0, 1, 1]])
    noisy, _ = _anchors([-9.0, -7.0], [[5, 5, 9, 9], [-3, 1, 2, 2]])
    result = tasks.anchor_detector([box], [noisy], [score], [score])
    assert result["agreement"] is None
    assert "neither the float model nor the deployed pipeline keeps an anchor" in result["note"]
    assert task_verdict(result, 0.9) == [
        "task anchor_detector: anchors above 0.5 with the same box (IoU >= 0.5) undefined < "
        "min_task_agreement 0.9 (" + result["note"] + ")"]


def test_verify_judges_an_anchor_detector_task_on_the_outputs_it_finds_by_shape():
    from npubuild.recipe.model import VerifySpec
    from npubuild.verify.verdict import judge

    box, score = _anchors([3.0, -4.0], [[0, 0, 10, 10], [0, 0, 1, 1]])
    noisy, _ = _anchors([3.0, -4.0], [[0, 0, 10, 10], [90, -70, 50, 60]])  # an anchor not kept
    moved, _ = _anchors([3.0, -4.0], [[9, 0, 10, 10], [0, 0, 1, 1]])  # IoU 1/19
    refs = [{"scores": score, "boxes": box}]
    spec = VerifySpec(task="anchor_detector", min_task_agreement=0.9)  # min_cosine 0.99
    passed = judge(spec, refs, [{"scores": score, "boxes": noisy}], refs, ["scores", "boxes"], [])
    assert passed.outputs["boxes"]["cosine"] < 0.3  # reported, not judged
    assert passed.passed and passed.task["boxes"] == "boxes" and passed.task["agreement"] == 1.0
    assert abs(passed.task["kept_regressor_cosine"] - 1.0) < 1e-12
    failed = judge(spec, refs, [{"scores": score, "boxes": moved}], refs, ["scores", "boxes"], [])
    assert failed.failures == [("task anchor_detector: anchors above 0.5 with the same box "
                                "(IoU >= 0.5) 0.0000 < min_task_agreement 0.9")]
    unjudged = VerifySpec(task="anchor_detector")  # no min_task_agreement: cosines judged
    noisy_judged = judge(unjudged, refs, [{"scores": score, "boxes": noisy}], refs,
                         ["scores", "boxes"], [])
    assert noisy_judged.failures[0].startswith("output 'boxes': cosine")
    # the precision search ranks choices by margin: a task that misses is how far it falls short
    assert (passed.margin(), failed.margin()) == (1.0, 0.0 - 0.9)
    assert passed.task_grades is not None and failed.task_grades[-1] > 1  # the box moved


def test_the_anchor_task_is_graded_per_anchor_by_how_near_each_comes_to_flipping():
    # float: kept at logit 2 and 0.05 (a tie: as far as 0.1), dropped at -1 and -300
    box, score = _anchors([2.0, 0.05, -1.0, -300.0], [[0, 0, 10, 10]] * 4)
    moved, _ = _anchors([0.0] * 4, [[0, 0, 10, 10], [5, 0, 10, 10], [0, 0, 10, 10], [0, 0, 1, 1]])
    near = np.asarray([1.0, 0.04, -0.5, -290.0]).reshape(1, 4, 1)
    grades = tasks.anchor_grades([box], [box], [score], [near])
    # score loads: half-way, a tenth of the tie band, half-way, 10 of 300 logits; box loads 0
    assert np.allclose(grades, [0.5, 0.1, 0.5, 0, 0, 0], atol=0.04)
    flipped = tasks.anchor_grades([box], [moved], [score],
                                  [np.asarray([-2.0, 0.05, 1.0, -300.0]).reshape(1, 4, 1)])
    # anchor 0 dropped (4 of 2 logits: 1 + log 2), anchor 2 added (2 of 1), anchor 1's box at
    # IoU 1/3 (a load of 4/3 past the bar: 1 + log 4/3)
    assert np.allclose(flipped[[0, 2]], 1 + np.log(2.0))
    assert np.isclose(flipped[5], 1 + np.log(4 / 3))


def test_an_anchor_detector_task_on_outputs_of_another_shape_is_a_recipe_error():
    import pytest

    from npubuild.recipe.model import VerifySpec
    from npubuild.verify.verdict import check_names

    class Loaded:
        def error(self, message, *path, hint=""):
            return ValueError(f"{'.'.join(map(str, path))}: {message}")

    spec = VerifySpec(task="anchor_detector")
    with pytest.raises(ValueError, match=r"verify\.task: .*'logits' \[1, 10\]"):
        check_names(Loaded(), spec, ["logits"], {"logits": np.zeros((1, 10))})
    box, score = _anchors([1.0], [[0, 0, 1, 1]])
    check_names(Loaded(), spec, ["s", "b"], {"s": score, "b": box})


def test_a_map_task_over_samples_where_neither_side_reaches_the_threshold_judges_nothing():
    """Round 9: openWakeWord's wake-word and weather models never fired on the verify clips
    (espeak-ng's voices do not wake them), and verify read "IoU above 0.5 1.0000 over 6
    images": perfect agreement on nothing. The figure is now undefined, says why, and a
    min_task_agreement set on it fails with that reason instead of passing."""
    from npubuild.report.judged import task_evidence
    from npubuild.verify.verdict import task_verdict

    quiet = [np.array([[0.001]]), np.array([[0.002]])]
    result = tasks.binary_map(quiet, [q * 2 for q in quiet])
    assert result["agreement"] is None and result["iou"] is None and result["union"] == 0
    assert "neither the float model nor the deployed pipeline" in result["note"]
    assert task_evidence(result) == "over 0 elements above 0.5 in 2 samples"
    assert task_evidence({"task": "classifier", "samples": 6}) == "over 6 samples"  # not images
    failure = task_verdict(result, 0.9)
    assert failure == ["task binary_map: IoU above 0.5 undefined < min_task_agreement 0.9 ("
                       + result["note"] + ")"]
    assert tasks.text_detection([np.full((1, 1, 4, 4), 1e-3)], [np.zeros((1, 1, 4, 4))]
                                )["text_map_iou"] is None


def test_with_several_outputs_an_output_that_judges_nothing_is_not_the_lowest():
    from types import SimpleNamespace

    from npubuild.verify.verdict import task_check

    spec = SimpleNamespace(task="binary_map", task_outputs=["note", "onset"], task_threshold=0.5)
    refs = [{"note": np.array([0.9, 0.1]), "onset": np.array([0.1, 0.1])}]
    gots = [{"note": np.array([0.9, 0.9]), "onset": np.array([0.1, 0.1])}]
    result = task_check(spec, None, refs, gots, refs, ["note", "onset"])
    assert result["outputs"]["onset"]["agreement"] is None
    assert result["agreement"] == 0.5


def test_a_classifier_of_every_position_is_judged_position_by_position():
    """Round 9: Baidu LAC's encoder tags each of 32 characters ([1, 32, 59] emissions) and
    `task: classifier` took the one argmax of all 1,888 values per sample: "top-1 agreement
    1.0000" said nothing of the other 31 tags. An output with positions and classes
    ([1, T, classes] once unit dims are dropped) is now judged per position, classes along
    the last axis; a plain [1, classes] output as before."""
    from npubuild.report.judged import task_evidence

    ref = np.array([[[0.9, 0.05, 0.05], [0.1, 0.6, 0.3], [0.2, 0.1, 0.7], [0.5, 0.4, 0.1]]])
    got = ref.copy()
    got[0, 1] = [0.1, 0.3, 0.6]  # the second character's tag flips; the largest value stays
    result = tasks.classifier([ref], [got])
    assert result["positions"] == 4 and result["classes"] == 3
    assert result["top1_agreement"] == 0.75 and result["top5_agreement"] == 1.0
    assert result["agreement_is"] == "top-1 agreement per position"
    assert task_evidence(result) == "over 4 positions in 1 sample"
    assert tasks.classifier([ref[0, :1]], [got[0, :1]])["positions"] == 1  # [1, classes]


def test_a_verdict_that_failed_only_on_a_task_judging_nothing_hints_at_the_data(tmp_path):
    """Round 9, openWakeWord's weather model with min_task_agreement 0.9: verify failed because
    the model never fired on the verify clips, and the hint sent the user to the calibration
    data ("the verify data reach values the calibration data never produced ...") from a
    bisection of outputs that all passed. A verdict whose only failure is a task that judged
    nothing now runs no bisection and hints at what the task needs."""
    import json

    from tests.conftest import run_cli, write_recipe
    from tests.unit.stages.test_importer import unread_input_model

    model = unread_input_model(tmp_path / "m.onnx")
    rng = np.random.default_rng(1)
    for i in range(4):
        np.savez(tmp_path / f"s_{i}.npz", ids=rng.integers(0, 20, (1, 8)))
    recipe = write_recipe(tmp_path, f"""\
        version: 1
        name: quiet
        model:
          path: {model}
          inputs:
            - {{name: ids, shape: [1, 8]}}
            - {{name: length, shape: [1]}}
        target: npu-16m
        quantization:
          calibration: {{data: "s_[01].npz", samples: 2}}
        verify: {{data: "s_[23].npz", samples: 2, min_cosine: 0.9, task: binary_map,
                  task_threshold: 1000.0, min_task_agreement: 0.9}}
        """)
    result = run_cli("run", str(recipe), "--build-dir", str(tmp_path / "b"), "--cache", str(tmp_path / "c"))
    assert result.returncode != 0
    assert "the task judges nothing" in result.stderr
    hint = result.stderr.split("hint:", 1)[1]
    assert "give verify data where the model fires, or another task_threshold" in hint
    assert "calibration" not in hint and "the drop starts" not in hint
    verdict = json.loads((tmp_path / "b/quiet/verify/verify.json").read_text())
    assert "bisection" not in verdict and "unseen_values" not in verdict


def test_a_judged_task_figure_that_judged_nothing_is_counted_as_missed():
    """report.html read "FAIL — 3 figures judged against thresholds: all met" when the only
    failure was a task that judged nothing: its figure, undefined, was neither met nor missed."""
    from npubuild.report.judged import counts, task_figure

    quiet = [np.array([[0.001]])]
    report = {"accuracy": {"task": tasks.binary_map(quiet, quiet), "samples": 1}}
    figure = task_figure(report, {"min_task_agreement": 0.9})
    assert figure.value is None and figure.ok is False
    assert counts([figure]) == {"judged": 1, "failed": 1, "reported": 0}
    assert task_figure(report, {}).ok is None  # reported only: nothing to miss
