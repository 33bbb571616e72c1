"""Weights are quantized block by block of output channels (a 100M-parameter Gemm needs no GBs
of float64 temporaries): the result is the same whatever the block size."""

from __future__ import annotations

import numpy as np
from onnx import helper

from npubuild.quant import rounding
from tests.unit.quant.helpers import feeds_for, model, quantize


def grouped_convs():
    rng = np.random.default_rng(5)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", group=2, pads=[1, 1, 1, 1]),
             helper.make_node("Flatten", ["c"], ["f"], name="flat"),
             helper.make_node("Gemm", ["f", "g"], ["y"], name="fc", transB=1)]
    inits = {"w": rng.normal(0, 0.3, (6, 2, 3, 3)), "b": rng.normal(0, 0.1, 6),
             "g": rng.normal(0, 0.1, (5, 6 * 5 * 5))}
    return model(nodes, {"x": [1, 4, 5, 5]}, {"y": [1, 5]}, inits)


def test_blockwise_weight_quantization_equals_the_whole(monkeypatch):
    m = grouped_convs()
    feeds = feeds_for(m, 3)
    whole = quantize(m, feeds)[0]
    monkeypatch.setattr(rounding, "BLOCK_ELEMENTS", 7)  # one output channel per block
    assert len(rounding.row_blocks(np.zeros((6, 2, 3, 3)))) == 6
    blocks = quantize(m, feeds)[0]
    for a, b in zip(whole.layers, blocks.layers):
        for key in ("weight", "bias"):
            if key in a.arrays:
                np.testing.assert_array_equal(a.arrays[key], b.arrays[key])
