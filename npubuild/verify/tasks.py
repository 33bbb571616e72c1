"""Task-level agreement between the float model and the deployed pipeline (``verify.task``).

What a user of the model sees, beside the tensor metrics: the same class (classifier), the same
boxes (detector: `npubuild.verify.detections`), the same text regions (text_detection), the same
decoded text (text_recognition: a CTC recognizer's greedy decoding), the same regions of any map
above a threshold (binary_map: note and onset maps, speech frames of a voice-activity model).
Each check returns its figures and the one ``agreement`` that ``verify.min_task_agreement``
judges.
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


BINARY_THRESHOLD = 0.5


def binary_map(refs: list[np.ndarray], gots: list[np.ndarray],
               threshold: float = BINARY_THRESHOLD) -> dict:
    """`text_detection`'s IoU for any map: the elements above ``threshold`` (a note or onset
    present, a frame of speech), over all samples together."""
    result = text_detection(refs, gots, threshold)
    return {"task": "binary_map", "samples": result["samples"], "threshold": threshold,
            "union": result["text_pixels_union"], "iou": result["text_map_iou"],
            "agreement": result["agreement"], "agreement_is": f"IoU above {threshold:g}"}


def text_recognition(refs: list[np.ndarray], gots: list[np.ndarray]) -> dict:
    """A CTC recognizer's output ([1, T, classes], class 0 the blank) decoded greedily (best
    class per step, repeats merged, blanks dropped) from the float model and from the deployed
    pipeline: the share of samples whose text is the same, and the characters that differ
    (edit distance over the float text's length, over all samples)."""
    same = edits = length = 0
    for ref, got in zip(refs, gots):
        a, b = ctc_greedy(ref), ctc_greedy(got)
        same += a == b
        edits += edit_distance(a, b)
        length += len(a)
    n = len(refs)
    return {"task": "text_recognition", "samples": n, "same_text": same,
            "characters": length, "character_errors": edits,
            "character_error_rate": edits / length if length else float(edits > 0),
            "agreement": same / n if n else None, "agreement_is": "same decoded text"}


def ctc_greedy(scores: np.ndarray) -> list[int]:
    """The class sequence a CTC head's scores ([..., T, classes]) decode to greedily."""
    best = np.argmax(np.reshape(scores, (-1, np.shape(scores)[-1])), axis=-1)
    return [int(c) for i, c in enumerate(best) if c != 0 and (i == 0 or c != best[i - 1])]


def edit_distance(a: list[int], b: list[int]) -> int:
    """Levenshtein distance between two sequences."""
    row = list(range(len(b) + 1))
    for i, x in enumerate(a, 1):
        previous, row[0] = row[0], i
        for j, y in enumerate(b, 1):
            previous, row[j] = row[j], min(row[j] + 1, row[j - 1] + 1, previous + (x != y))
    return row[-1]


def detector(totals: dict) -> dict:
    """Box recall from the detection comparison (`npubuild.verify.detections`)."""
    return {"task": "detector", **{k: totals[k] for k in ("float_boxes", "deployed_boxes",
                                                          "matched", "box_recall")},
            "agreement": totals["box_recall"], "agreement_is": "box recall"}
