"""Detection boxes from YOLOv8 outputs, their agreement, and the float-vs-deployed picture."""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

from npubuild.postprocess.yolov8 import decode

SCORE_THRESHOLD = 0.25
NMS_IOU = 0.45
MATCH_IOU = 0.5


def yolov8_output0(outputs: Mapping[str, np.ndarray], input_hw: tuple[int, int]) -> np.ndarray:
    """``output0`` [4 + classes, anchors] of one image: as the model gives it, or decoded from
    the per-scale head tensors (largest map first) a strict recipe outputs."""
    if len(outputs) == 1:
        return next(iter(outputs.values()))[0]
    scales = sorted(outputs.values(), key=lambda t: -t.shape[2] * t.shape[3])
    return decode(*scales, input_size=input_hw)[0]


def boxes(output0: np.ndarray) -> list[tuple[float, float, float, float, int, float]]:
    """(x1, y1, x2, y2, class, score) after the score threshold and per-class NMS."""
    cx, cy, w, h = output0[:4]
    scores = output0[4:]
    cls, best = scores.argmax(axis=0), scores.max(axis=0)
    keep = np.nonzero(best >= SCORE_THRESHOLD)[0]
    found = [(cx[i] - w[i] / 2, cy[i] - h[i] / 2, cx[i] + w[i] / 2, cy[i] + h[i] / 2, int(cls[i]),
              float(best[i])) for i in keep]
    found.sort(key=lambda b: -b[5])
    kept: list = []
    for box in found:
        if all(b[4] != box[4] or iou(b, box) < NMS_IOU for b in kept):
            kept.append(box)
    return [tuple(float(v) if k != 4 else v for k, v in enumerate(b)) for b in kept]


def iou(a, b) -> float:
    w = max(0.0, min(a[2], b[2]) - max(a[0], b[0]))
    h = max(0.0, min(a[3], b[3]) - max(a[1], b[1]))
    inter = w * h
    union = (a[2] - a[0]) * (a[3] - a[1]) + (b[2] - b[0]) * (b[3] - b[1]) - inter
    return inter / union if union > 0 else 0.0


def agreement(reference: list, deployed: list) -> dict:
    """How many float boxes the deployed pipeline finds again (same class, IoU ≥ 0.5)."""
    matched = sum(any(d[4] == r[4] and iou(d, r) >= MATCH_IOU for d in deployed) for r in reference)
    return {"float_boxes": len(reference), "deployed_boxes": len(deployed), "matched": matched}


def draw(image_path: Path, input_hw: tuple[int, int], reference: list, deployed: list,
         out: Path) -> Path:
    """The image at the model's input size with float boxes (green) and deployed ones (red)."""
    from PIL import Image, ImageDraw

    from npubuild.atomic import atomic_path

    with Image.open(image_path) as img:
        canvas = img.convert("RGB").resize((input_hw[1], input_hw[0]))
    scale = 2
    canvas = canvas.resize((canvas.width * scale, canvas.height * scale))
    pen = ImageDraw.Draw(canvas)
    for colour, found, width in (("#22c55e", reference, 4), ("#ef4444", deployed, 2)):
        for x1, y1, x2, y2, cls, score in found:
            pen.rectangle([x1 * scale, y1 * scale, x2 * scale, y2 * scale], outline=colour, width=width)
            pen.text((x1 * scale + 3, y1 * scale + 2), f"{cls}:{score:.2f}", fill=colour)
    pen.text((6, 6), "green: float   red: deployed", fill="#ffffff")
    with atomic_path(out) as tmp:
        canvas.save(tmp, format="PNG")
    return out
