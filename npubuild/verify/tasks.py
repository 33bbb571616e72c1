"""Task-level agreement between the float model and the deployed pipeline (``verify.task``).

What a user of the model sees, beside the tensor metrics: the same class (classifier), the same
boxes (detector: `npubuild.verify.detections`), the same text regions (text_detection). Each
check returns its figures and the one ``agreement`` that ``verify.min_task_agreement`` judges.
"""

from __future__ import annotations

import numpy as np

TOP_K = 5
TEXT_THRESHOLD = 0.3  # DBNet's (PP-OCR det) binarization threshold for the probability map


def classifier(refs: list[np.ndarray], gots: list[np.ndarray]) -> dict:
    """Per sample, the float model's top-1 class against the deployed one: top-1 agreement
    (same class) and top-5 agreement (the float top-1 among the deployed top 5)."""
    top1 = top5 = 0
    for ref, got in zip(refs, gots):
        ref, got = np.ravel(ref), np.ravel(got)
        expected = int(np.argmax(ref))
        top1 += int(np.argmax(got)) == expected
        top5 += expected in np.argsort(-got, kind="stable")[:TOP_K]
    n = len(refs)
    return {"task": "classifier", "samples": n, "classes": int(np.size(refs[0]) if n else 0),
            "top1_agreement": top1 / n if n else None, "top5_agreement": top5 / n if n else None,
            "agreement": top1 / n if n else None, "agreement_is": "top-1 agreement"}


def text_detection(refs: list[np.ndarray], gots: list[np.ndarray],
                   threshold: float = TEXT_THRESHOLD) -> dict:
    """IoU of the text maps binarized at ``threshold``, over all samples together (a sample
    without text adds nothing to either side, instead of scoring 0 as its cosine does)."""
    inter = union = 0
    for ref, got in zip(refs, gots):
        a, b = np.asarray(ref) > threshold, np.asarray(got) > threshold
        inter += int(np.count_nonzero(a & b))
        union += int(np.count_nonzero(a | b))
    iou = inter / union if union else 1.0
    return {"task": "text_detection", "samples": len(refs), "threshold": threshold,
            "text_pixels_union": union, "text_map_iou": iou, "agreement": iou,
            "agreement_is": "text-map IoU"}


def detector(totals: dict) -> dict:
    """Box recall from the detection comparison (`npubuild.verify.detections`)."""
    return {"task": "detector", **{k: totals[k] for k in ("float_boxes", "deployed_boxes",
                                                          "matched", "box_recall")},
            "agreement": totals["box_recall"], "agreement_is": "box recall"}
