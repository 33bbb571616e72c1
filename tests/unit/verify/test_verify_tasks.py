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
