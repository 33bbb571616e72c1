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
    assert tasks.text_detection([empty], [empty * 0])["text_map_iou"] == 1.0


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
