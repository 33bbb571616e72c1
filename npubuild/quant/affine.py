"""Constant affine steps folded into the layer before them, so int8 rounds once, not per step.

Paddle exports (PP-LCNetV3's "learnable affine blocks" in PP-OCRv4) and many hand-written
models follow a convolution with ``Mul(·, s)`` and ``Add(·, b)`` by constants, and an
activation with another scalar ``Mul``/``Add``. Lowered one node at a time, each step is a
layer that rounds onto its own int8 scale: PP-OCRv4 det rounds six times per block where one
conv and one table would do. Folded:

- after a ``conv`` layer (Conv, Gemm, MatMul, BatchNormalization), ``Mul``/``Div`` by a
  constant that is one value per output channel (or a scalar) scales its weights and bias,
  ``Add``/``Sub`` of such a constant shifts its bias, and a ``BatchNormalization`` does both;
- after a ``lut`` layer, the same ops by a *scalar* constant become part of the table's
  function (the table is re-evaluated from the extended fragment, so it stays exact);
- after a ``matmul`` of two activations, ``Mul``/``Div`` by a scalar (attention's
  ``1/√d`` after Q·Kᵀ) becomes its ``factor``, part of its one requantization.

A step folds only where it is the single consumer of the layer's output and that output is no
graph output (nothing else may see the unfolded tensor). The layer keeps its name and takes
the step's node into ``source_nodes`` and the step's output as its own.
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import onnx

from npubuild.quant.floatgraph import FLayer

AFFINE_OPS = {"Mul", "Div", "Add", "Sub", "BatchNormalization"}
FOLDS_AFFINE = {"conv", "lut", "matmul"}


def channel_vector(value: np.ndarray, out_shape: list[int], axis: int | None) -> np.ndarray | None:
    """``value`` as one number per channel along ``axis`` of ``out_shape`` (length C; axis None:
    a scalar only, length 1), if it broadcasts that way without growing the output; else None."""
    value = np.asarray(value, np.float64)
    rank = len(out_shape)
    if value.ndim > rank or not np.all(np.isfinite(value)):
        return None
    full = (1,) * (rank - value.ndim) + value.shape
    if axis is None:
        return value.reshape(1) if value.size == 1 else None
    channels = out_shape[axis]
    if any(d != 1 for i, d in enumerate(full) if i != axis) or full[axis] not in (1, channels):
        return None
    return np.broadcast_to(value.reshape(-1), (channels,)).astype(np.float64)


def affine_of(node: onnx.NodeProto, x: str, const: Callable[[str], np.ndarray | None],
              out_shape: list[int], axis: int | None) -> tuple[np.ndarray, np.ndarray] | None:
    """``node`` as ``y = x · scale + shift`` per channel along ``axis`` of the ``out_shape``
    tensor ``x`` (axis None: scalars only), or None when it is not a constant affine step."""
    if node.op_type == "BatchNormalization":
        return _batchnorm(node, x, const, out_shape, axis)
    ins = [i for i in node.input if i]
    if len(ins) != 2 or x not in ins or ins[0] == ins[1]:
        return None
    first = ins[0] == x
    value = const(ins[1] if first else ins[0])
    vector = None if value is None else channel_vector(value, out_shape, axis)
    if vector is None:
        return None
    ones, zeros = np.ones_like(vector), np.zeros_like(vector)
    if node.op_type == "Mul":
        return vector, zeros
    if node.op_type == "Add":
        return ones, vector
    if node.op_type == "Sub":
        return (ones, -vector) if first else (-ones, vector)
    if node.op_type == "Div" and first and np.all(vector != 0):
        return 1.0 / vector, zeros
    return None


def _batchnorm(node, x, const, out_shape, axis) -> tuple[np.ndarray, np.ndarray] | None:
    """Inference BatchNormalization (channels on axis 1) as a per-channel affine step."""
    if node.input[0] != x or axis != 1 or len(out_shape) < 2 or len(
            [o for o in node.output if o]) != 1:
        return None
    params = [const(n) for n in node.input[1:5]]
    if any(p is None or np.size(p) != out_shape[1] for p in params):
        return None
    gamma, beta, mean, var = (np.asarray(p, np.float64).reshape(-1) for p in params)
    eps = next((a.f for a in node.attribute if a.name == "epsilon"), 1e-5)
    scale = gamma / np.sqrt(var + eps)
    return scale, beta - mean * scale


def fold_into_conv(layer: FLayer, scale: np.ndarray, shift: np.ndarray) -> None:
    """``conv(x) · scale + shift`` as one conv: weights and bias scaled, bias shifted. A
    shift alone (a fully connected layer's bias ``Add``: every scale 1) leaves the weights
    the array they were, which layers reading one weight share (`lower.Context.fc_weight`):
    rxnmap's 16 applications of two encoder layers held a float64 copy each, 1.2 GB."""
    w, b = layer.weights["weight"], layer.weights["bias"]
    if not np.all(scale == 1.0):  # w · 1 is w, bit for bit
        w = w * scale.reshape(-1, *(1,) * (w.ndim - 1))
    layer.weights = {**layer.weights, "weight": w,
                     "bias": np.broadcast_to(b, scale.shape) * scale + shift}


def fold_into_table(layer: FLayer, scale: float, shift: float) -> None:
    """``f(x) · scale + shift`` as the table's function."""
    fn = layer.fn
    if fn is not None:
        layer.fn = lambda x, fn=fn: np.asarray(fn(x), np.float64) * scale + shift


def fold_into_matmul(layer: FLayer, scale: float, shift: float) -> bool:
    """``(a @ b) · scale`` as the matmul's ``factor``; a shift does not fold (False)."""
    if shift != 0:
        return False
    layer.attrs = {**layer.attrs, "factor": layer.attrs.get("factor", 1.0) * scale}
    return True


def fold_axis(layer: FLayer, rank: int) -> int | None:
    """The axis a step after ``layer`` may vary along: a conv's output channels (the last axis
    of a fully connected layer, NCHW's 1 otherwise); None (scalars only) for a table or a
    matmul of two activations."""
    if layer.kind in ("lut", "matmul"):
        return None
    return rank - 1 if layer.attrs.get("fc") else 1
