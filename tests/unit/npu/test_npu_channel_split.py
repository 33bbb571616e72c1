"""A convolution with more output channels than the chip computes in one step (``Conv``'s
``max_channels``) is compiled alone, in output-channel slices within the limit, bit-exact."""

from __future__ import annotations

from npubuild.npu.from_qgraph import layers_from_qgraph, plan_qgraph
from npubuild.npu.layer_group import channel_slices
from npubuild.targets import load_chip
from tests.unit.npu.qstacks import Stack, compile_qgraph, quantize, simulate_and_compare


def narrow_chip(max_channels: int):
    tiny = load_chip("npu-tiny")
    conv = tiny.ops["Conv"].model_copy(update={"max_channels": max_channels})
    return tiny.model_copy(update={"ops": {**tiny.ops, "Conv": conv}})


def wide_pointwise():
    s = Stack((1, 8, 12, 12))
    a = s.conv("x", 8, 3)
    b = s.conv(a, 40, 1)                   # 40 outputs > 16: three C slices at least
    return s.model([s.unary(s.conv(b, 8, 1), "Relu")]), b


def test_the_wide_conv_runs_alone_in_channel_slices_within_the_limit():
    chip = narrow_chip(16)
    model, wide = wide_pointwise()
    layers = layers_from_qgraph(quantize(model))
    groups = plan_qgraph(layers, chip)
    [plan] = [g for g in groups.npu_groups if wide in g.group.names]
    assert plan.group.names == [wide] if isinstance(plan.group.names, list) else \
        list(plan.group.names) == [wide]
    assert plan.slicing.c >= channel_slices(plan.group.layers[0], chip) == 3
    assert all(piece.channels.stop - piece.channels.start <= 16 for piece in plan.tiling.slices)
    assert not groups.cpu_layers


def test_channel_sliced_conv_is_bit_exact_in_the_simulator():
    qgraph = quantize(wide_pointwise()[0])
    _, program, program_file = compile_qgraph(qgraph, narrow_chip(16))
    simulate_and_compare(qgraph, program_file)


def test_without_a_limit_the_wide_conv_groups_with_its_neighbours():
    model, wide = wide_pointwise()
    groups = plan_qgraph(layers_from_qgraph(quantize(model)), load_chip("npu-tiny"))
    assert any(wide in g.group.names and len(g.group) > 1 for g in groups.npu_groups)


def test_a_depthwise_conv_wider_than_the_limit_runs_in_channel_slices_bit_exact():
    """EfficientNet's 1152-channel depthwise convs on a 1024-channel chip: each output channel
    reads only its own input channel, so a C slice reads the same channel range."""
    s = Stack((1, 40, 6, 6))
    wide = s.conv(s.conv("x", 40, 1), 0, 3, depthwise=True)
    qgraph = quantize(s.model([s.conv(wide, 8, 1)]))
    chip = narrow_chip(16)
    layers, program, program_file = compile_qgraph(qgraph, chip)
    [plan] = [g.plan for g in program.npu_groups if wide in g.plan.group.names]
    assert list(plan.group.names) == [wide] and plan.slicing.c >= 3
    assert not [g for g in program.groups if g.device == "cpu"]
    simulate_and_compare(qgraph, program_file)
