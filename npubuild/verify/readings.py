"""The task a failing model's outputs look like, judged on the same samples before it is hinted.

A user who writes ``min_cosine: 0.99`` for an SSD-style anchor detector (MediaPipe's face, palm
and pose detectors) has verify judge the regressors of thousands of anchors no object is near,
which nobody decodes; `verify.task: anchor_detector` judges what the decoder reads. When verify
fails and the outputs' shapes are an anchor detector's (`tasks.anchor_outputs`), the verdict is
judged again with that task on the same samples and values, and the hint says what it measured
("judged as an anchor detector (...) it passes: 11 of 11 float anchors kept, none added, box
IoU >= 0.958"), or that it fails too. The verdict itself is the recipe's: nothing here changes it.

A classifier is not read here: ``verify.task: classifier`` is judged beside ``min_cosine``, not
instead of it, so no task reading could turn a cosine failure into a pass.
"""

from __future__ import annotations

from typing import Callable

import numpy as np

READ_AGREEMENT = 0.9  # the bar a reading judges with where the recipe sets none (README's)


def anchor_spec(spec, sample: dict, outputs) -> object | None:
    """``spec`` (the recipe's ``verify``) with the outputs judged as an anchor detector's,
    when they have that shape and the recipe does not already judge them so; else None."""
    from npubuild.verify.verdict import anchor_pair

    if spec.task not in (None, "anchor_detector"):
        return None
    if spec.task == "anchor_detector" and spec.min_task_agreement is not None:
        return None
    read = spec.model_copy(update={
        "task": "anchor_detector",
        "min_task_agreement": READ_AGREEMENT if spec.min_task_agreement is None
        else spec.min_task_agreement})
    pair = anchor_pair(read, sample, outputs)
    if pair is None or spec.task is None and not looks_like_anchors(*(
            np.shape(sample[name]) for name in pair)):
        return None
    return read


def looks_like_anchors(box_shape: tuple, score_shape: tuple) -> bool:
    """Whether outputs the recipe does not call an anchor detector's are one, read stricter
    than the task reads what the recipe names: one score per anchor and a box with (x, y)
    keypoint pairs (MediaPipe's [1, 896, 16] and [1, 896, 1]), so a music model's note map
    [1, frames, 88] beside its contour map [1, frames, 264] is not read as anchors."""
    return score_shape[2] == 1 and box_shape[2] % 2 == 0


def measure(spec, sample: dict, outputs, judge: Callable) -> dict | None:
    """The anchor-detector reading of a failed verdict: ``judge(spec)`` is verify's verdict on
    the same samples under another ``verify`` section; None where the outputs are not an
    anchor detector's."""
    read = anchor_spec(spec, sample, outputs)
    if read is None:
        return None
    verdict = judge(read)
    return {"task": "anchor_detector", "min_task_agreement": read.min_task_agreement,
            "passed": verdict.passed, "failures": verdict.failures, "figures": verdict.task}


def text(reading: dict | None) -> str:
    """The hint's sentence for a reading (empty without one)."""
    if not reading:
        return ""
    figures = reading["figures"]
    added = figures["deployed_anchors"] - figures["agreeing_anchors"]
    iou = figures.get("min_box_iou")
    what = (f"{figures['agreeing_anchors']} of {figures['float_anchors']} float anchors kept "
            f"with the same box, " + ("none added" if added <= 0 else
                                      f"{added} more kept by the deployed pipeline")
            + (f", box IoU >= {iou:.3f}" if iou is not None else "")
            + f", over {figures['samples']} samples")
    recipe = (f"verify.task: anchor_detector, min_task_agreement: "
              f"{reading['min_task_agreement']:g}")
    if reading["passed"]:
        return (f"judged as an anchor detector ({recipe}: the anchors a decoder keeps instead of "
                f"the cosines of every anchor's raw regressors) it passes on the same samples: "
                f"{what}")
    return (f"judged as an anchor detector ({recipe}) it fails too on the same samples "
            f"({'; '.join(reading['failures'])}): {what}")
