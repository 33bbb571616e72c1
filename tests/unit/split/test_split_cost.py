"""The split's cost rates: where a layer kept in float runs (the NPU's float16 rate on chips that
take float layers themselves, else the host CPU) and the MACs of a whole model."""

from __future__ import annotations

import pytest

from npubuild.split.cost import (CPU_MACS_PER_SECOND, NPU_UTILISATION, float_macs_per_second,
                                 model_macs, npu_macs_per_second)
from npubuild.targets import load_chip
from tests.unit.split.split_models import Net


def test_a_chip_without_a_float16_rate_runs_float_layers_at_the_hosts_rate():
    chip = load_chip("npu-16m")
    assert chip.float_macs_per_cycle_per_lane is None
    assert float_macs_per_second(chip) == CPU_MACS_PER_SECOND


@pytest.mark.parametrize("name", ["rk3588", "bm1684x"])
def test_a_chip_that_takes_float_layers_runs_them_at_its_float16_rate(name):
    chip = load_chip(name)
    expected = (chip.lanes * chip.float_macs_per_cycle_per_lane * chip.clock_mhz * 1e6
                * NPU_UTILISATION)
    assert float_macs_per_second(chip) == expected
    assert float_macs_per_second(chip) == npu_macs_per_second(chip) / 2  # half of int8


def test_model_macs_counts_a_convs_multiply_accumulates_and_one_per_element_elsewhere():
    net = Net()
    x = net.input("x", [1, 3, 8, 8])
    y = net.op("Relu", [net.conv(x, 3, 4, name="c")], name="r")  # 3x3, pads 1: 8x8 out
    assert model_macs(net.model([y])) == 4 * 8 * 8 * 3 * 3 * 3 + 4 * 8 * 8


@pytest.mark.parametrize("op,gates", [("LSTM", 4), ("GRU", 3), ("RNN", 1)])
def test_model_macs_counts_a_recurrent_layers_gate_products_over_every_step(op, gates):
    import numpy as np

    net = Net()
    x = net.input("x", [1, 10, 16])  # batch-first: layout=1
    hidden = 8
    w = net.init("w", np.zeros((2, gates * hidden, 16), np.float32))
    r = net.init("r", np.zeros((2, gates * hidden, hidden), np.float32))
    y = net.op(op, [x, w, r], name="rnn", hidden_size=hidden, direction="bidirectional", layout=1)
    expected = 10 * 2 * gates * hidden * (16 + hidden)  # steps x directions x gates x H x (I + H)
    assert model_macs(net.model([y])) == expected
