"""The MAC array's utilisation rules (npubuild.npu.cost), each against cycles worked out by hand
for ethos-u55-256: 2x2x8 microblocks, 32 input channels per dense-conv step, 4 cycles a step and at
least 32, 4 kernel elements per depthwise step, output 0.25 cycles an element (add 0.75, max
pool 0.125, lookup table 1.0)."""

from __future__ import annotations

from npubuild.npu import build_program, estimate, plan_groups
from npubuild.npu.builder import GraphBuilder
from npubuild.npu.cost import (compute_cycles, constant_read_bytes, elementwise_block,
                               fully_connected_cycles)
from npubuild.npu.layers import LayerSpec
from npubuild.targets import load_chip

U55 = load_chip("ethos-u55-256")
U65 = load_chip("ethos-u65-256")


def _only(builder: GraphBuilder, out: str):
    layer = builder.layers[-1]
    return layer, builder.shapes[out]


def test_a_deep_3x3_conv_fills_the_array():
    b = GraphBuilder({"x": (1, 64, 8, 8)})
    layer, out = _only(b, b.conv("x", 16, k=3))
    # 4x4 microblocks x 2 channel groups; 9 kernel elements x 2 chunks of 32 input channels;
    # 4 cycles x 16 microblocks = 64 per step: 64 x 18 x 2
    assert compute_cycles(layer, out, layer.macs, U55) == 64 * 18 * 2 == layer.macs // 256


def test_three_input_channels_cost_a_whole_part_kernel_step():
    b = GraphBuilder({"x": (1, 3, 8, 8)})
    layer, out = _only(b, b.conv("x", 16, k=3))
    # part-kernel first (8 channels or fewer): ceil(9 / 4) = 3 steps of 8 channels, 64 cycles
    # each, x 2 channel groups = 384 (the peak would take 108)
    assert compute_cycles(layer, out, layer.macs, U55) == 384
    assert -(-layer.macs // 256) == 108


def test_a_depthwise_conv_uses_a_few_percent_of_the_array():
    b = GraphBuilder({"x": (1, 32, 8, 8)})
    layer, out = _only(b, b.conv("x", 32, k=3, groups=32))
    assert layer.op == "dwconv"
    # 16 microblocks -> 64 cycles a step; ceil(9 / 4) = 3 steps; 4 channel groups
    assert compute_cycles(layer, out, layer.macs, U55) == 64 * 3 * 4 == 768
    assert layer.macs // 256 == 72


def test_a_small_output_pays_the_minimum_step():
    # one output position: 4 cycles of work, 32 of write-back, per step
    assert fully_connected_cycles(U55.mac_array, 1, 1024, 576) == 32 * 18 * 128
    b = GraphBuilder({"x": (1, 64, 3, 3)})
    layer, out = _only(b, b.conv("x", 64, k=1))
    # 2x2 microblocks -> max(32, 16) = 32; 2 depth chunks; 8 channel groups
    assert compute_cycles(layer, out, layer.macs, U55) == 32 * 2 * 8


def test_pools_and_element_wise_ops_run_at_the_output_rate():
    b = GraphBuilder({"x": (1, 16, 8, 8)})
    pool, out = _only(b, b.pool("x", k=3, s=1, p=1))
    assert compute_cycles(pool, out, pool.macs, U55) == 9 * 16 * 2  # max(4, 9) per microblock
    add, out = _only(b, b.add("x", "x"))
    assert compute_cycles(add, out, add.macs, U55) == 1024 * 3 // 4
    lut, out = _only(b, b.lut("x"))
    assert compute_cycles(lut, out, lut.macs, U55) == 1024
    cat, out = _only(b, b.concat(["x", "x"]))
    assert compute_cycles(cat, out, cat.macs, U55) == 0  # producers write into place


def test_without_a_mac_array_every_mac_runs_at_peak():
    chip = load_chip("npu-16m")
    b = GraphBuilder({"x": (1, 3, 8, 8)})
    layer, out = _only(b, b.conv("x", 16, k=3))
    assert compute_cycles(layer, out, layer.macs, chip) == -(-layer.macs // (64 * 128))


def test_weights_stream_through_their_own_port_and_operands_through_the_fast_one():
    b = GraphBuilder({"x": (1, 64, 8, 8)})
    graph = b.build([b.conv("x", 64, k=1)])
    conv = graph.layers[0]
    est = estimate(build_program(plan_groups(graph, U55)))
    act = 64 * 8 * 8
    # T0: input (8 B/cycle, SRAM arena) and weights (1 B/cycle, flash) in parallel;
    # T1: the conv (64 cycles a step for 16 microblocks, 2 chunks of 32 input channels, 8
    # channel groups) or its 4096 + 4096 operand bytes over the 8 B/cycle fast port; T2: store
    t0 = max(act // 8, conv.weight_bytes)
    t1 = max(64 * 2 * 8, (act + act) // 8)
    assert (t0, t1) == (conv.weight_bytes, 1024)
    assert est.cycles == t0 + t1 + act // 8
    assert est.offchip_bytes == conv.weight_bytes  # the SRAM arena is on chip
    est65 = estimate(build_program(plan_groups(graph, U65)))
    assert est65.offchip_bytes == est65.gmem_bytes  # DRAM: everything GMEM moves


def test_an_element_wise_block_is_the_largest_that_fits_the_shared_buffer():
    # input block bytes = h x w x depth <= 8192; 24x24 outputs: depth 16 reaches 22x22x16 = 7744
    # at most, depth 32 fills it first with 16x16 (64 would tie: the shallower block stays)
    assert elementwise_block(U55.mac_array, (1, 64, 24, 24)) == (16, 16, 32)
    # 12x12: 144 positions hold at most 56 channels, and 8x8 of 128 channels fill it
    assert elementwise_block(U55.mac_array, (1, 160, 12, 12)) == (8, 8, 128)


def _bn_mul(shape):
    """Batch norm's per-channel Mul left after a concat: x times a constant [1, C, 1, 1]."""
    b = GraphBuilder({"x": shape, "scale": (1, shape[1], 1, 1)})
    return b, b.mul("x", "scale")


def test_a_constant_operand_is_streamed_at_the_output_shape_in_bursts_of_the_block_depth():
    b, y = _bn_mul((1, 64, 24, 24))
    mul = b.layers[-1]
    # one byte per output element (36864); a 128-byte flash burst carries 32 bytes of depth
    assert constant_read_bytes(mul, (1, 64, 24, 24), {"scale"}, U55) == (36864, 4 * 36864)
    # a 128-channel block uses the whole burst
    b, y = _bn_mul((1, 160, 12, 12))
    assert constant_read_bytes(b.layers[-1], (1, 160, 12, 12), {"scale"}, U55) == (23040, 23040)
    # not a constant (a squeeze-and-excite gate), or a scalar: nothing streamed
    assert constant_read_bytes(mul, (1, 64, 24, 24), set(), U55) == (0, 0)
    b = GraphBuilder({"x": (1, 64, 24, 24), "k": (1, 1, 1, 1)})
    b.mul("x", "k")
    assert constant_read_bytes(b.layers[-1], (1, 64, 24, 24), {"k"}, U55) == (0, 0)


def test_the_streamed_constant_takes_the_weights_port():
    b, y = _bn_mul((1, 64, 24, 24))
    act = 64 * 24 * 24
    # T0 loads x and the 64-byte constant over the 8 B/cycle arena port; T1 the Mul's 0.375
    # cycles an element (13824) against 4 x 36864 flash bytes at 1 B/cycle; T2 stores y
    t0, t1, t2 = (act + 64) // 8, max(act * 3 // 8, 4 * act), act // 8
    est = estimate(build_program(plan_groups(b.build([y], constants=("scale",)), U55)))
    assert est.cycles == t0 + t1 + t2 == 156680
    assert est.offchip_bytes == act  # read from flash once per output element
    est65 = estimate(build_program(plan_groups(b.build([y], constants=("scale",)), U65)))
    assert est65.offchip_bytes == est65.gmem_bytes == (act + 64) + act + act  # DRAM: all of it
    plain = estimate(build_program(plan_groups(b.build([y]), U55)))
    assert plain.cycles == t0 + act * 3 // 8 + t2  # a computed operand stays in the arena


def _at(layer, precision: str):
    """``layer`` as a quantized graph marks 16-bit MAC operands (`LayerSpec.precision`)."""
    from dataclasses import replace

    return replace(layer, attrs=layer.attrs + (("precision", precision),))


def test_sixteen_bit_operands_run_at_the_chips_fraction_of_the_int8_rate():
    chip = load_chip("npu-16m")  # 64 lanes x 128 int8 MACs a cycle; int16 0.5, w16a16 0.25
    assert (chip.int16_mac_rate, chip.w16a16_mac_rate) == (0.5, 0.25)
    b = GraphBuilder({"x": (1, 64, 8, 8)})
    layer, out = _only(b, b.conv("x", 64, k=3))
    assert layer.macs == 64 * 8 * 8 * 64 * 9 == 2359296
    assert compute_cycles(layer, out, layer.macs, chip) == 2359296 // 8192 == 288
    assert compute_cycles(_at(layer, "int16"), out, layer.macs, chip) == 2359296 // 4096 == 576
    assert compute_cycles(_at(layer, "w16a16"), out, layer.macs, chip) == 2359296 // 2048 == 1152
    slow = chip.model_copy(update={"w16a16_mac_rate": 0.125})  # a chip file's own figure
    assert compute_cycles(_at(layer, "w16a16"), out, layer.macs, slow) == 2359296 // 1024


def test_on_a_mac_array_sixteen_bits_slow_the_array_not_the_output_stage():
    int16 = U55.model_copy(update={"int16_mac_rate": 0.5})
    b = GraphBuilder({"x": (1, 64, 8, 8)})
    layer, out = _only(b, b.conv("x", 16, k=3))
    # the array's 64 x 18 x 2 = 2304 cycles (see the first test) at half the rate
    assert compute_cycles(_at(layer, "int16"), out, layer.macs, int16) == 2 * 2304
    pool, out = _only(b, b.pool("x", k=3, s=1, p=1))
    # max(4, 9) cycles per microblock, 16 microblocks, 8 channel groups: 1152, doubled
    assert compute_cycles(_at(pool, "int16"), out, pool.macs, int16) == 2 * 1152
    add, out = _only(b, b.add("x", "x"))  # the output stage alone: 0.75 cycles an element
    assert compute_cycles(_at(add, "int16"), out, add.macs, int16) == 4096 * 3 // 4
    # a fully connected layer run whole: 32 cycles a step (the minimum), 18 depth chunks of
    # 32, 128 channel groups of 8 = 73728, doubled
    fc = LayerSpec("fc", "move", ("v",), ("y",), ((1, 576, 1, 1),), ((1, 1024, 1, 1),),
                   macs=576 * 1024, attrs=(("weights", (1024, 576)),))
    assert compute_cycles(fc, (1, 1024, 1, 1), fc.macs, int16) == 73728
    assert compute_cycles(_at(fc, "int16"), (1, 1024, 1, 1), fc.macs, int16) == 2 * 73728
