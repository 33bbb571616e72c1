"""Detection boxes from YOLOv8 outputs, their agreement, and the float-vs-deployed picture."""

from __future__ import annotations

from contextlib import nullcontext
from pathlib import Path
from typing import Mapping

import numpy as np

from npubuild.postprocess.yolov8 import decode

SCORE_THRESHOLD = 0.25
NMS_IOU = 0.45
MATCH_IOU = 0.5


def yolov8_output0(outputs: Mapping[str, np.ndarray], input_hw: tuple[int, int]) -> np.ndarray:
    """``output0`` [4 + classes, anchors] of one image: as the model gives it, joined from the
    boxes [1, 4, anchors] and class scores [1, classes, anchors] of a model cut before its final
    Concat (each output keeps its own int8 scale), or decoded from the per-scale head tensors
    (largest map first) a strict recipe outputs."""
    if len(outputs) == 1:
        return next(iter(outputs.values()))[0]
    if all(np.ndim(t) == 3 for t in outputs.values()):
        parts = sorted(outputs.values(), key=lambda t: t.shape[1] != 4)  # the boxes first
        return np.concatenate(parts, axis=1)[0]
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


def class_names(model, given: list[str] | None) -> list[str]:
    """Class names by id: the recipe's ``verify.class_names``, else the model's ``names``
    metadata (Ultralytics writes ``{0: 'person', ...}``), else none (boxes show ids)."""
    import ast

    if given:
        return list(given)
    meta = {p.key: p.value for p in model.metadata_props}
    try:
        names = ast.literal_eval(meta.get("names", "")) if meta.get("names") else None
    except (ValueError, SyntaxError):
        return []
    if isinstance(names, dict):
        return [str(names[k]) for k in sorted(names)]
    return [str(n) for n in names] if isinstance(names, (list, tuple)) else []


def label(cls: int, names: list[str]) -> str:
    return names[cls] if 0 <= cls < len(names) else f"class {cls}"


def as_records(found: list, names: list[str]) -> list[dict]:
    """Boxes for verify.json: corners in input pixels (0.1 px), class id and name, score."""
    return [{"box": [round(v, 1) for v in b[:4]], "class": b[4], "name": label(b[4], names),
             "score": round(b[5], 3)} for b in found]


TILE = 300          # px per image in the picture (the model input rescaled)
COLUMNS = 4
FONT_PX = 14


def tensor_picture(x: np.ndarray, layout: str):
    """A model's image input as a picture (values stretched to 0..255): what a sample read from
    a .npy/.npz file looks like to the model."""
    from PIL import Image

    x = np.asarray(x, np.float64)[0]
    if x.ndim == 3 and (layout == "NCHW" or (layout != "NHWC" and x.shape[0] in (1, 3))):
        x = x.transpose(1, 2, 0)
    low, high = float(x.min()), float(x.max())
    pixels = np.round(255 * (x - low) / (high - low)).astype(np.uint8) if high > low else \
        np.zeros(x.shape, np.uint8)
    return Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels)


def draw(pictures: list[tuple[str, object]], input_hw: tuple[int, int],
         found: list[tuple[list, list]], names: list[str], out: Path) -> Path:
    """Every verify sample at the model's input size, float boxes (green, thick) and deployed
    boxes (red), each labelled with its class name and score, in a grid with a caption row;
    ``pictures`` are (caption, image file or PIL image) per sample."""
    from PIL import Image, ImageDraw, ImageFont

    from npubuild.atomic import atomic_path

    font = ImageFont.load_default(size=FONT_PX)
    rows = -(-len(pictures) // COLUMNS)
    caption = FONT_PX + 12
    sheet = Image.new("RGB", (TILE * min(COLUMNS, len(pictures)), rows * (TILE + caption)), "white")
    for i, ((name, picture), (reference, deployed)) in enumerate(zip(pictures, found)):
        with (Image.open(picture) if isinstance(picture, Path) else nullcontext(picture)) as img:
            tile = img.convert("RGB").resize((input_hw[1], input_hw[0])).resize((TILE, TILE))
        sx, sy = TILE / input_hw[1], TILE / input_hw[0]
        pen = ImageDraw.Draw(tile)
        for colour, boxes, width, below in (("#16a34a", reference, 4, False),
                                            ("#dc2626", deployed, 2, True)):
            for x1, y1, x2, y2, cls, score in boxes:
                box = [x1 * sx, y1 * sy, x2 * sx, y2 * sy]
                pen.rectangle(box, outline=colour, width=width)
                text = f"{label(cls, names)} {score:.2f}"
                tx, ty = box[0] + 2, (box[3] - FONT_PX - 6) if below else box[1] + 2
                left, top, right, bottom = pen.textbbox((tx, ty), text, font=font)
                pen.rectangle([left - 2, top - 2, right + 2, bottom + 2], fill=colour)
                pen.text((tx, ty), text, fill="white", font=font)
        x, y = (i % COLUMNS) * TILE, (i // COLUMNS) * (TILE + caption)
        sheet.paste(tile, (x, y))
        ImageDraw.Draw(sheet).text(
            (x + 6, y + TILE + 4), f"{name}: {len(reference)} float / {len(deployed)} deployed",
            fill="#111", font=font)
    with atomic_path(out) as tmp:
        # an adaptive 256-colour palette keeps the photos recognisable at a third of the size
        sheet.quantize(colors=256).save(tmp, format="PNG", optimize=True)
    return out
