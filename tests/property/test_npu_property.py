"""Hypothesis properties of the NPU tiler: allocator non-overlap, backward-H cover and fit."""

import math

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npubuild.npu import (Buffer, LmemOverflow, Rows, Slicing, allocate, build_program, conflicts,
                          plan_groups, tile_group)
from npubuild.npu.builder import GraphBuilder
from npubuild.npu.lmem import ALIGN, align
from npubuild.npu.program import Dma
from npubuild.targets import load_chip
from npubuild.targets.model import Chip

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- allocator ------------------------------------------------------------------------------

buffer_specs = st.lists(st.tuples(st.integers(0, 12), st.integers(0, 6), st.booleans(),
                                  st.integers(1, 3000)), min_size=1, max_size=30)


@SETTINGS
@given(buffer_specs, st.sampled_from([4096, 8192, 32768]), st.sampled_from([1, 4, 8]))
def test_allocator_never_overlaps_live_buffers(specs, capacity, banks):
    buffers = [Buffer(i, "weight" if resident else "activation", f"b{i}", start,
                      math.inf if resident else start + length, size)
               for i, (start, length, resident, size) in enumerate(specs)]
    try:
        placement = allocate(buffers, capacity, capacity // banks)
    except LmemOverflow:
        assert sum(align(b.size) for b in buffers) > capacity  # side by side would have fitted
        return
    assert conflicts(buffers, placement, capacity) == []
    assert all(addr % ALIGN == 0 for addr in placement.addresses.values())
    assert placement.peak <= capacity


# -- random conv/pool/resize/add stacks -----------------------------------------------------

@st.composite
def stacks(draw, channels=8, width=8):
    b = GraphBuilder({"x": (1, channels, draw(st.integers(6, 48)), width)})
    cur, seen = "x", ["x"]
    for _ in range(draw(st.integers(1, 6))):
        h = b.shapes[cur][2]
        kind = draw(st.sampled_from(["conv", "conv", "pool", "resize", "add", "lut"]))
        if kind == "conv":
            k, d = draw(st.integers(1, 5)), draw(st.integers(1, 2))
            p = draw(st.integers(max(0, ((k - 1) * d + 1 - h + 1) // 2), k - 1))
            cur = b.conv(cur, channels, k=k, s=draw(st.integers(1, 3)), p=p, d=d)
        elif kind == "pool" and h >= 2:
            k = draw(st.integers(2, min(4, h)))
            cur = b.pool(cur, k=k, s=draw(st.integers(1, k)), p=draw(st.integers(0, k // 2)))
        elif kind == "resize" and h <= 24:
            cur = b.resize(cur, draw(st.integers(2, 3)))
        elif kind == "add":
            same = [t for t in seen if b.shapes[t] == b.shapes[cur]]
            cur = b.add(cur, draw(st.sampled_from(same)))
        else:
            cur = b.lut(cur)
        seen.append(cur)
    extra = draw(st.sampled_from(seen[1:]))
    return b.build(list(dict.fromkeys([cur, extra])))


def run_rows(layer, ins, reads, pad_top, pad_bottom, out_rows):
    """A 1-D integer model of each op along H (exact, so any halo mistake shows)."""
    if layer.op in ("conv", "pool"):
        fill = 0 if layer.op == "conv" else -10**9
        x = np.concatenate([np.full(pad_top, fill), ins[0], np.full(pad_bottom, fill)])
        taps = [x[i * layer.dilation_h:][::layer.stride_h][:out_rows.size]
                for i in range(layer.kernel_h)]
        return sum((i + 1) * t for i, t in enumerate(taps)) if layer.op == "conv" \
            else np.max(taps, axis=0)
    if layer.op == "resize":
        return ins[0][(np.arange(out_rows.start, out_rows.stop) // layer.scale_h) - reads[0].start]
    if layer.op == "add":
        return ins[0] + 2 * ins[1]
    return 3 * ins[0] + 1


def untiled(graph, x):
    values = {"x": x}
    for layer in graph.layers:
        full = Rows(0, layer.h_out)
        reads = [Rows(0, values[t].size) for t in layer.inputs]
        pads = (layer.pad_top, max(0, (layer.h_out - 1) * layer.stride_h - layer.pad_top
                                   + (layer.kernel_h - 1) * layer.dilation_h + 1
                                   - layer.in_shapes[0][2]))
        pads = pads if layer.op in ("conv", "pool") else (0, 0)
        values[layer.outputs[0]] = run_rows(layer, [values[t] for t in layer.inputs], reads,
                                            *pads, full)
    return values


@SETTINGS
@given(stacks(), st.data())
def test_backward_h_covers_every_row_and_reads_exactly_the_window(graph, data):
    group = graph.group(0, len(graph.layers))
    height = min(graph.shapes[t][2] for t in group.outputs)
    tiling = tile_group(group, Slicing(h=data.draw(st.integers(1, height))), enforce_overlap=False)
    x = np.random.default_rng(0).integers(-50, 50, graph.shapes["x"][2])
    full = untiled(graph, x)
    for t in group.outputs:  # the stored rows partition every output
        stores = sorted(s.window.store[t] for s in tiling.slices)
        assert stores[0].start == 0 and stores[-1].stop == graph.shapes[t][2]
        assert all(a.stop == b.start for a, b in zip(stores, stores[1:]))
    for piece in tiling.slices:
        w = piece.window
        held = {"x": x[w.rows["x"].start:w.rows["x"].stop]}
        for layer in graph.layers:
            lw = w.layers[layer.name]
            if layer.op in ("conv", "pool") and lw.out_rows.size:  # (nothing reads a dead layer)
                _assert_exact_window(layer, lw)
            ins = [held[t][r.start - w.rows[t].start:r.stop - w.rows[t].start]
                   for t, r in zip(layer.inputs, lw.reads)]
            out = run_rows(layer, ins, lw.reads, lw.pad_top, lw.pad_bottom, lw.out_rows)
            assert np.array_equal(out, full[layer.outputs[0]][lw.out_rows.start:lw.out_rows.stop])
            held[layer.outputs[0]] = out


def _assert_exact_window(layer, lw):
    height = layer.in_shapes[0][2]
    first = lw.out_rows.start * layer.stride_h - layer.pad_top
    touched = [r * layer.stride_h - layer.pad_top + i * layer.dilation_h
               for r in range(lw.out_rows.start, lw.out_rows.stop) for i in range(layer.kernel_h)]
    inside = [r for r in touched if 0 <= r < height]
    if not inside:  # the whole window is padding
        assert lw.reads[0].size == 0 and lw.pad_top == max(touched) + 1 - first
        return
    assert lw.reads[0] == Rows(min(inside), max(inside) + 1)
    # effective paddings: window rows before the first / after the last row loaded
    assert lw.pad_top == lw.reads[0].start - first
    assert lw.pad_bottom == max(touched) + 1 - lw.reads[0].stop


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stacks(channels=16, width=64))
def test_every_group_fits_a_small_lmem_without_overlap(graph):
    chip = Chip.model_validate({**load_chip("npu-tiny").model_dump(exclude_unset=True),
                                "lmem_bytes_per_lane": 4096})
    program = build_program(plan_groups(graph, chip, on_no_fit="cpu"))
    for group in program.npu_groups:
        plan = group.plan
        assert conflicts(plan.buffers, plan.placement, chip.lmem_bytes_per_lane) == []
        stored = sum(s.bytes for p in group.slices for s in p.steps
                     if isinstance(s, Dma) and s.op == "store")
        assert stored == sum(graph.tensor_bytes(t) for t in plan.group.outputs)  # each row once
