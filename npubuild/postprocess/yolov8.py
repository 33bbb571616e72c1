"""YOLOv8's detection-head decode, on the CPU, for recipes that end the model at the three
per-scale head tensors (seed 002's way of keeping every NPU tensor 4-D, see
recipes/yolov8-strict.yaml).

Each per-scale tensor is ``[N, 4*bins + classes, H, W]``: a distribution over ``bins`` distances
for each box side (DFL), then class logits. `decode` computes exactly what the exported model's
head does after those tensors — flatten and join the scales, DFL (softmax over the bins, then
the expectation), distances to boxes around the anchor points (cell centres), scaled by the
stride, and sigmoid of the class logits — and returns the model's original ``output0``:
``[N, 4 + classes, sum(H*W)]`` with rows ``cx, cy, w, h, class scores...``.
"""

from __future__ import annotations

import numpy as np

DFL_BINS = 16


def decode(*scales: np.ndarray, input_size: tuple[int, int] | None = None,
           bins: int = DFL_BINS) -> np.ndarray:
    """Rebuild YOLOv8's ``output0`` from its per-scale head tensors (largest map first).

    ``input_size`` (height, width) gives each scale's stride; by default a scale's stride is
    the first map's, doubled per scale, with the first stride taken as 8 (YOLOv8's P3).
    """
    strides = _strides(scales, input_size)
    flat = np.concatenate([s.reshape(s.shape[0], s.shape[1], -1) for s in scales], axis=2)
    box_logits, class_logits = flat[:, : 4 * bins], flat[:, 4 * bins:]
    distances = _dfl(box_logits, bins)  # [N, 4, A]: left, top, right, bottom
    anchors, anchor_strides = _anchors(scales, strides)
    top_left = anchors - distances[:, :2]
    bottom_right = anchors + distances[:, 2:]
    centre = (top_left + bottom_right) / 2
    size = bottom_right - top_left
    boxes = np.concatenate([centre, size], axis=1) * anchor_strides
    return np.concatenate([boxes, _sigmoid(class_logits)], axis=1).astype(np.float32)


def _strides(scales, input_size) -> list[float]:
    if input_size is not None:
        return [input_size[0] / s.shape[2] for s in scales]
    first = scales[0].shape[2]
    return [8.0 * first / s.shape[2] for s in scales]


def _dfl(box_logits: np.ndarray, bins: int) -> np.ndarray:
    n, _, anchors = box_logits.shape
    logits = box_logits.reshape(n, 4, bins, anchors).astype(np.float64)
    weights = np.exp(logits - logits.max(axis=2, keepdims=True))
    weights /= weights.sum(axis=2, keepdims=True)
    return np.einsum("nsba,b->nsa", weights, np.arange(bins, dtype=np.float64))


def _anchors(scales, strides) -> tuple[np.ndarray, np.ndarray]:
    points, point_strides = [], []
    for scale, stride in zip(scales, strides):
        h, w = scale.shape[2:]
        ys, xs = np.meshgrid(np.arange(h) + 0.5, np.arange(w) + 0.5, indexing="ij")
        points.append(np.stack([xs.ravel(), ys.ravel()]))
        point_strides.append(np.full(h * w, stride))
    return np.concatenate(points, axis=1)[None], np.concatenate(point_strides)[None, None]


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-x.astype(np.float64)))
