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

from npubuild.metrics import similarity

TOP_K = 5
TEXT_THRESHOLD = 0.3  # DBNet's (PP-OCR det) binarization threshold for the probability map


def classifier(refs: list[np.ndarray], gots: list[np.ndarray]) -> dict:
    """Per sample, the float model's top-1 class against the deployed one: top-1 agreement
    (same class) and top-5 agreement (the float top-1 among the deployed top 5). An output of
    positions and classes ([1, T, classes] once unit dims are dropped: a sequence tagger) is
    judged per position, classes along the last axis; the figures are then the shares of
    positions over all samples."""
    top1 = top5 = positions = 0
    classes = 0
    for ref, got in zip(refs, gots):
        ref, got = class_rows(ref), class_rows(got)
        expected = np.argmax(ref, axis=1)
        ranked = np.argsort(-got, axis=1, kind="stable")[:, :TOP_K]
        top1 += int(np.count_nonzero(np.argmax(got, axis=1) == expected))
        top5 += int(np.count_nonzero((ranked == expected[:, None]).any(axis=1)))
        positions, classes = positions + len(ref), ref.shape[1]
    n = len(refs)
    share = (lambda k: k / positions) if positions else (lambda k: None)
    per_position = positions > n
    return {"task": "classifier", "samples": n, "classes": int(classes), "positions": positions,
            "top1_agreement": share(top1), "top5_agreement": share(top5),
            "agreement": share(top1),
            "agreement_is": "top-1 agreement per position" if per_position else "top-1 agreement"}


def class_rows(output: np.ndarray) -> np.ndarray:
    """A classifier output as rows of class scores: one row for [1, classes] (any unit dims),
    one per position for [1, T, classes]; an output of more dims stays one row."""
    squeezed = np.squeeze(np.asarray(output))
    return squeezed if squeezed.ndim == 2 else np.ravel(squeezed)[None]


def text_detection(refs: list[np.ndarray], gots: list[np.ndarray],
                   threshold: float = TEXT_THRESHOLD) -> dict:
    """IoU of the text maps binarized at ``threshold``, over all samples together (a sample
    without text adds nothing to either side, instead of scoring 0 as its cosine does). Where
    no element of any sample reaches the threshold on either side there is nothing to judge:
    the IoU is undefined (None) and the result's ``note`` says why, rather than a perfect 1.0."""
    inter = union = 0
    for ref, got in zip(refs, gots):
        a, b = np.asarray(ref) > threshold, np.asarray(got) > threshold
        inter += int(np.count_nonzero(a & b))
        union += int(np.count_nonzero(a | b))
    iou = inter / union if union else None
    result = {"task": "text_detection", "samples": len(refs), "threshold": threshold,
              "text_pixels_union": union, "text_map_iou": iou, "agreement": iou,
              "agreement_is": "text-map IoU"}
    return {**result, "note": nothing_above(threshold, len(refs))} if not union else result


def nothing_above(threshold: float, samples: int) -> str:
    """Why a map task judged nothing: its data never reach the threshold."""
    return (f"neither the float model nor the deployed pipeline has an element above "
            f"{threshold:g} in the {samples} sample{'s' * (samples != 1)}: the task judges "
            f"nothing; give verify data where the model fires, or another task_threshold")


BINARY_THRESHOLD = 0.5


def binary_map(refs: list[np.ndarray], gots: list[np.ndarray],
               threshold: float = BINARY_THRESHOLD) -> dict:
    """`text_detection`'s IoU for any map: the elements above ``threshold`` (a note or onset
    present, a frame of speech), over all samples together."""
    result = text_detection(refs, gots, threshold)
    out = {"task": "binary_map", "samples": result["samples"], "threshold": threshold,
           "union": result["text_pixels_union"], "iou": result["text_map_iou"],
           "agreement": result["agreement"], "agreement_is": f"IoU above {threshold:g}"}
    return {**out, "note": result["note"]} if "note" in result else out


def text_recognition(refs: list[np.ndarray], gots: list[np.ndarray]) -> dict:
    """A CTC recognizer's output ([1, T, classes], or time-major [T, 1, classes]) decoded greedily
    (best class per step, repeats merged, blanks dropped) from the float model and from the
    deployed pipeline: the share of samples whose text is the same, and the characters that
    differ (edit distance over the float text's length, over all samples). The blank is the
    first or the last class, whichever the float model's steps pick more (`ctc_blank`)."""
    blank = ctc_blank(refs)
    same = edits = length = 0
    for ref, got in zip(refs, gots):
        a, b = ctc_greedy(ref, blank), ctc_greedy(got, blank)
        same += a == b
        edits += edit_distance(a, b)
        length += len(a)
    n = len(refs)
    return {"task": "text_recognition", "samples": n, "same_text": same,
            "characters": length, "character_errors": edits,
            "character_error_rate": edits / length if length else float(edits > 0),
            "blank": blank, "agreement": same / n if n else None,
            "agreement_is": "same decoded text"}


def ctc_blank(refs: list[np.ndarray]) -> int:
    """The blank class of a CTC head: class 0 (PaddleOCR's, PyTorch's default) or the last class
    (TensorFlow's and Keras' CTC, and PyTorch heads trained with ``blank=classes-1``), whichever
    the float model's greedy decoding picks at more steps: a blank stands between every two
    characters and on every step without one, so the blank is the class most steps pick. Read
    with class 0 as the blank, a last-class blank is decoded as a character and a deployed
    pipeline that loses a class-0 character reads the same."""
    best = np.concatenate([best_classes(r) for r in refs]) if refs else np.zeros(0, int)
    last = np.shape(refs[0])[-1] - 1 if refs else 0
    return last if np.count_nonzero(best == last) > np.count_nonzero(best == 0) else 0


def best_classes(scores: np.ndarray) -> np.ndarray:
    """The best class at every step of a CTC head's scores (one sample: every axis but the
    classes of size 1 except the steps)."""
    return np.argmax(np.reshape(scores, (-1, np.shape(scores)[-1])), axis=-1)


def ctc_greedy(scores: np.ndarray, blank: int = 0) -> list[int]:
    """The class sequence a CTC head's scores ([..., T, classes]) decode to greedily."""
    best = best_classes(scores)
    return [int(c) for i, c in enumerate(best) if c != blank and (i == 0 or c != best[i - 1])]


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


ANCHOR_SCORE_THRESHOLD = 0.5  # MediaPipe's min_score_thresh for its face, palm and pose detectors
ANCHOR_MATCH_IOU = 0.5


def anchor_outputs(shapes: dict[str, tuple[int, ...]]) -> tuple[str, str] | None:
    """(boxes, scores) of an SSD-style anchor detector from its outputs' shapes: two outputs
    [1, anchors, k] with the same anchors, the box regressors the one with k ≥ 4 values per
    anchor and the score logits the one with fewer (MediaPipe's BlazeFace, palm and pose
    detectors: [1, 896, 16] and [1, 896, 1]); None when the outputs are not that."""
    three = {n: s for n, s in shapes.items() if len(s) == 3 and s[0] == 1}
    for boxes, box_shape in sorted(three.items(), key=lambda kv: -kv[1][2]):
        for scores, score_shape in sorted(three.items(), key=lambda kv: kv[1][2]):
            if (scores != boxes and score_shape[1] == box_shape[1] and box_shape[2] >= 4
                    and score_shape[2] < box_shape[2]):
                return boxes, scores
    return None


def anchor_boxes(regressors: np.ndarray) -> np.ndarray:
    """Corners [anchors, 4] of each anchor's box relative to the anchor's centre: the first
    four regressors are the box centre's offset and its size (x, y, w, h). Float and deployed
    boxes of one anchor share that centre, so their IoU needs no anchor table (fixed-size
    anchors, as MediaPipe's SSD anchors are)."""
    r = np.reshape(np.asarray(regressors, np.float64), (-1, np.shape(regressors)[-1]))[:, :4]
    half = np.abs(r[:, 2:4]) / 2
    return np.concatenate([r[:, :2] - half, r[:, :2] + half], axis=1)


def box_ious(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """IoU of corresponding rows of two [n, 4] corner arrays."""
    w = np.clip(np.minimum(a[:, 2], b[:, 2]) - np.maximum(a[:, 0], b[:, 0]), 0, None)
    h = np.clip(np.minimum(a[:, 3], b[:, 3]) - np.maximum(a[:, 1], b[:, 1]), 0, None)
    inter = w * h
    union = ((a[:, 2] - a[:, 0]) * (a[:, 3] - a[:, 1]) + (b[:, 2] - b[:, 0]) * (b[:, 3] - b[:, 1])
             - inter)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(union > 0, inter / union, 0.0)


def sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(np.asarray(x, np.float64), -100.0, 100.0)))


def best_logits(scores: np.ndarray, anchors: int) -> np.ndarray:
    """Each anchor's best class logit (its only one where there is one class), in float64,
    clipped to ±100 as `sigmoid` reads it."""
    return np.clip(np.reshape(np.asarray(scores, np.float64), (anchors, -1)).max(axis=1),
                   -100.0, 100.0)


def anchor_detector(box_refs: list[np.ndarray], box_gots: list[np.ndarray],
                    score_refs: list[np.ndarray], score_gots: list[np.ndarray],
                    threshold: float = ANCHOR_SCORE_THRESHOLD) -> dict:
    """What an SSD-style anchor detector's user keeps: the anchors whose score (the logit
    through a sigmoid, the best class where there are several) reaches ``threshold``, and
    their boxes. An anchor agrees when the float model and the deployed pipeline both keep it
    and its two boxes overlap at IoU ≥ 0.5; the agreement is the agreeing anchors over the
    anchors either side keeps, over all samples (thousands of anchors no object is near are
    left out, as the user's decoder leaves them out). With no anchor kept on either side in any
    sample there is nothing to judge: the agreement is undefined (None) and ``note`` says why."""
    kept_float = kept_deployed = kept_both = agreeing = 0
    ious, kept_ref, kept_got = [], [], []
    for box_ref, box_got, score_ref, score_got in zip(box_refs, box_gots, score_refs, score_gots):
        p_ref = sigmoid(best_logits(score_ref, np.shape(box_ref)[1]))
        p_got = sigmoid(best_logits(score_got, np.shape(box_got)[1]))
        a, b = p_ref >= threshold, p_got >= threshold
        both = np.nonzero(a & b)[0]
        iou = box_ious(anchor_boxes(box_ref)[both], anchor_boxes(box_got)[both])
        ious += iou.tolist()
        rows = np.nonzero(a)[0]
        kept_ref.append(np.reshape(box_ref, (len(p_ref), -1))[rows])
        kept_got.append(np.reshape(box_got, (len(p_got), -1))[rows])
        kept_float, kept_deployed = kept_float + int(a.sum()), kept_deployed + int(b.sum())
        kept_both += len(both)
        agreeing += int(np.count_nonzero(iou >= ANCHOR_MATCH_IOU))
    union = kept_float + kept_deployed - kept_both
    result = {"task": "anchor_detector", "samples": len(box_refs), "threshold": threshold,
            "float_anchors": kept_float, "deployed_anchors": kept_deployed,
            "agreeing_anchors": agreeing,
            "min_box_iou": float(min(ious)) if ious else None,
            "mean_box_iou": float(np.mean(ious)) if ious else None,
            # every regressor (box and keypoints) of the anchors the float model keeps
            "kept_regressor_cosine": similarity(np.concatenate(kept_ref), np.concatenate(
                kept_got)).cosine if kept_float else None,
            "agreement": agreeing / union if union else None,
            "agreement_is": f"anchors above {threshold:g} with the same box (IoU >= 0.5)"}
    return result if union else {**result, "note": nothing_kept(threshold, len(box_refs))}


def nothing_kept(threshold: float, samples: int) -> str:
    """Why an anchor task judged nothing: no anchor reaches the threshold on either side."""
    return (f"neither the float model nor the deployed pipeline keeps an anchor above "
            f"{threshold:g} in the {samples} sample{'s' * (samples != 1)}: the task judges "
            f"nothing; give verify data with the objects in them, or another task_threshold")


# The graded figure of the anchor task (the precision search's): an anchor's score load is how
# far the deployed logit moved towards the threshold over how far the float logit is from it
# (1 at the threshold, above 1 flipped), its box load the IoU's shortfall over what 0.5 allows.
# A float logit closer to the threshold than ANCHOR_TIE_LOGITS counts as that far (a tie is not
# an infinite load), and a load above 1 counts as 1 + log(load): a flipped anchor is one anchor,
# so one score sitting near the threshold (the palm detector's 0.287 read as 0.5) cannot
# outweigh every other anchor in the ranking, while an anchor flipped by the errors of several
# tensors still shows the gain of each (a hard cap would hide it).
ANCHOR_TIE_LOGITS = 0.1


def soft_load(load: np.ndarray) -> np.ndarray:
    """Loads above 1 (past the bar) compressed to 1 + log(load), still increasing."""
    load = np.maximum(np.asarray(load, np.float64), 0.0)
    return np.where(load > 1.0, 1.0 + np.log(np.maximum(load, 1.0)), load)


def anchor_grades(box_refs: list[np.ndarray], box_gots: list[np.ndarray],
                  score_refs: list[np.ndarray], score_gots: list[np.ndarray],
                  threshold: float = ANCHOR_SCORE_THRESHOLD) -> np.ndarray:
    """Per anchor and sample, graded loads (1 at the bar, as the search's cosine loads):
    every anchor's score load, then every float-kept anchor's box load, in a fixed order, so
    two choices' loads subtract entry by entry."""
    t = float(np.log(threshold / (1.0 - threshold)))
    score_loads, box_loads = [], []
    for box_ref, box_got, score_ref, score_got in zip(box_refs, box_gots, score_refs, score_gots):
        n = np.shape(box_ref)[1]
        z_ref, z_got = best_logits(score_ref, n), best_logits(score_got, n)
        d_ref = z_ref - t
        kept = d_ref >= 0
        reach = np.where(kept, np.maximum(d_ref, ANCHOR_TIE_LOGITS),
                         np.minimum(d_ref, -ANCHOR_TIE_LOGITS))
        score = soft_load((z_ref - z_got) / reach)
        iou = box_ious(anchor_boxes(box_ref)[kept], anchor_boxes(box_got)[kept])
        box = soft_load((1.0 - iou) / (1.0 - ANCHOR_MATCH_IOU))
        score_loads.append(score)
        box_loads.append(box)
    return np.concatenate([*score_loads, *box_loads]) if score_loads else np.zeros(0)
