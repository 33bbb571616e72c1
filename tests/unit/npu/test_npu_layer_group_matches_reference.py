"""The fast group planner chooses exactly what the straightforward one does
(`tests/unit/npu/planner_reference.py`): same groups, slicings, buffers, addresses and
estimate, on random chains with skips and random LMEM sizes that force N, H and C slicing and
no-fit layers; and the allocator, the backward-H walks it reuses and the rows of every H part
it computes at once (`npubuild.npu.h_parts`) agree piece by piece."""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npubuild.npu import build_program, estimate, h_parts, plan_dict
from npubuild.npu.backward_h import Rows, input_rows, window_rows
from npubuild.npu.buffers import Buffer
from npubuild.npu.builder import GraphBuilder
from npubuild.npu.layer_group import GroupFits, plan_groups
from npubuild.npu.layers import LayerGraph, LayerSpec
from npubuild.npu.lmem import LmemOverflow, allocate, peak_live_bytes
from npubuild.npu.tiling import (Slicing, TilingRejected, WindowWalks, slice_sizes,
                                 tile_group, tiling_sizes)
from npubuild.targets import load_chip
from npubuild.targets.model import Chip
from tests.unit.npu import planner_reference as reference

SETTINGS = settings(max_examples=40, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@st.composite
def chains(draw):
    """A small network: convs (strided, dilated, depthwise), pools, tables, element-wise
    products, skip adds, concats and resizes; every tensor no layer reads is an output, and
    sometimes an inner one too."""
    n, c, h = draw(st.integers(1, 2)), draw(st.sampled_from([4, 8, 16])), draw(st.integers(6, 40))
    b = GraphBuilder({"x": (n, c, h, draw(st.integers(4, 24)))})
    made = ["x"]
    for _ in range(draw(st.integers(1, 9))):
        x = made[-1] if draw(st.booleans()) else draw(st.sampled_from(made))
        shape = b.shapes[x]
        op = draw(st.sampled_from(["conv", "conv", "dw", "pool", "lut", "mul", "add", "concat",
                                   "resize"]))
        if op == "conv":
            k = draw(st.sampled_from([1, 3, 5]))
            s = draw(st.sampled_from([1, 1, 2])) if shape[2] > 2 * k else 1
            d = draw(st.sampled_from([1, 2])) if shape[2] > 4 * k else 1
            y = b.conv(x, draw(st.sampled_from([4, 8, 16, 32])), k=k, s=s, d=d)
        elif op == "dw":
            y = b.conv(x, shape[1], k=3, groups=shape[1])
        elif op == "pool" and shape[2] >= 4:
            y = b.pool(x, k=2, mode=draw(st.sampled_from(["max", "avg"])))
        elif op == "lut":
            y = b.lut(x)
        elif op == "mul":
            y = b.mul(x, b.lut(x))
        elif op in ("add", "concat"):
            same = [t for t in made if b.shapes[t] == shape]
            other = draw(st.sampled_from(same))
            y = b.add(x, other) if op == "add" else b.concat([x, other])
        elif op == "resize" and shape[2] <= 20:
            y = b.resize(x)
        else:
            continue
        made.append(y)
    read = {t for layer in b.layers for t in layer.inputs}
    outputs = [t for layer in b.layers for t in layer.outputs if t not in read]  # no dead ends
    if len(made) > 2 and draw(st.booleans()):
        outputs.append(made[len(made) // 2])  # an inner tensor stored too
    return b.build(list(dict.fromkeys(outputs)))


def chips():
    tiny = load_chip("npu-tiny").model_dump(exclude_unset=True)
    return st.builds(lambda lanes, lmem, banks: Chip.model_validate(
        {**tiny, "lanes": lanes, "lmem_bytes_per_lane": lmem, "lmem_banks": banks}),
        st.sampled_from([1, 2, 8]), st.sampled_from([1024, 2048, 4096, 8192, 32768]),
        st.sampled_from([1, 2, 4]))


@SETTINGS
@given(chains(), chips(), st.booleans())
def test_the_fast_planner_chooses_what_the_straightforward_one_does(graph, chip, grouping):
    fast = plan_groups(graph, chip, grouping=grouping, on_no_fit="cpu")
    slow = reference.plan_groups(graph, chip, grouping=grouping, on_no_fit="cpu")
    assert [type(g).__name__ for g in fast.items] == [type(g).__name__ for g in slow.items]
    fast_program, slow_program = build_program(fast), build_program(slow)
    assert plan_dict(fast_program, estimate(fast_program)) == \
        plan_dict(slow_program, estimate(slow_program))


def _planned(groups) -> dict:
    program = build_program(groups)
    return plan_dict(program, estimate(program))


@SETTINGS
@given(chains(), chips(), st.data(), st.sampled_from([0, 1, 3, GroupFits.KEEP]))
def test_group_fits_kept_across_plans_give_the_plans_of_fresh_searches(graph, chip, data, keep):
    """The precision search plans one graph once per precision choice with one `GroupFits`:
    each choice widens a few layers' activations, and every plan must be the one a fresh
    search makes (compile's), however few answers the instance keeps; and what it counts
    as computed (the search's clock is charged by it) does not depend on how many it keeps."""
    fits, unbounded = GroupFits(chip, keep=keep), GroupFits(chip, keep=10**9)
    for _ in range(3):
        wide = data.draw(st.sets(st.integers(0, len(graph.layers) - 1), max_size=3)
                         ) if graph.layers else set()
        layers = tuple(replace(layer, act_bytes=2) if i in wide else layer
                       for i, layer in enumerate(graph.layers))
        variant = LayerGraph(layers, graph.inputs, graph.outputs, graph.shapes)
        for g in (variant, graph):
            assert _planned(plan_groups(g, chip, on_no_fit="cpu", fits=fits)) == \
                _planned(plan_groups(g, chip, on_no_fit="cpu"))
            plan_groups(g, chip, on_no_fit="cpu", fits=unbounded)
            assert fits.computed == unbounded.computed
            assert fits.kept <= keep


def test_group_fits_refuse_another_chips_plan():
    graph = GraphBuilder({"x": (1, 8, 8, 8)})
    y = graph.conv("x", 8, k=3)
    with pytest.raises(ValueError, match="another chip"):
        plan_groups(graph.build([y]), load_chip("npu-16m"), fits=GroupFits(load_chip("npu-tiny")))


@st.composite
def buffer_sets(draw):
    count, timesteps = draw(st.integers(1, 24)), draw(st.integers(1, 10))
    buffers = []
    for i in range(count):
        start = draw(st.integers(0, timesteps - 1))
        end = math.inf if draw(st.integers(0, 5)) == 0 else draw(st.integers(start, timesteps))
        buffers.append(Buffer(i, "activation", f"t{i}", start, end,
                              draw(st.integers(0, 700))))
    return buffers, timesteps


@settings(max_examples=200, deadline=None)
@given(buffer_sets(), st.sampled_from([1024, 2048, 4096]), st.sampled_from([None, 256, 512]))
def test_the_allocator_places_as_the_all_pairs_scan_does(found, capacity, bank):
    buffers, timesteps = found
    assert peak_live_bytes(buffers, timesteps) == reference.peak_live_bytes(buffers, timesteps)
    try:
        want = reference.allocate(buffers, capacity, bank)
    except LmemOverflow as exc:
        try:
            allocate(buffers, capacity, bank)
        except LmemOverflow as got:
            assert str(got) == str(exc)
        else:
            raise AssertionError("the fast allocator placed what the reference could not")
        return
    assert allocate(buffers, capacity, bank) == want


@settings(SETTINGS, max_examples=120)
@given(chains(), st.integers(1, 6), st.randoms(use_true_random=False))
def test_reused_walks_give_the_windows_of_a_fresh_walk(graph, parts, rng):
    """Groups of every start and end, asked in a random order of one `WindowWalks`; and the
    verdict and largest slice from the rows of every part at once."""
    spans = [(a, b) for b in range(1, len(graph.layers) + 1) for a in range(b)]
    rng.shuffle(spans)
    walks = WindowWalks()
    for a, b in spans:
        group = graph.group(a, b)
        try:
            fresh = tile_group(group, Slicing(1, parts, 1))
        except TilingRejected as exc:
            for judge in (lambda: tile_group(group, Slicing(1, parts, 1), walks=walks),
                          lambda: slice_sizes(group, Slicing(1, parts, 1))):
                try:
                    judge()
                except TilingRejected as got:
                    assert str(got) == str(exc)
                else:
                    raise AssertionError(f"accepted what a fresh walk rejects: {exc}")
            continue
        assert tile_group(group, Slicing(1, parts, 1), walks=walks) == fresh
        assert slice_sizes(group, Slicing(1, parts, 1)) == tiling_sizes(fresh)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 7), st.integers(1, 4), st.integers(0, 6), st.integers(1, 3),
       st.integers(1, 40), st.lists(st.tuples(st.integers(0, 45), st.integers(0, 12)),
                                    min_size=1, max_size=6))
def test_window_rows_of_every_part_at_once_are_backward_hs(kernel, stride, pad, dilation,
                                                           height, outs):
    starts = np.array([a for a, _ in outs], np.int64)
    stops = np.array([a + n for a, n in outs], np.int64)
    got = h_parts.window_rows((starts, stops), kernel, stride, pad, dilation, height)
    want = [window_rows(Rows(a, b), kernel, stride, pad, dilation, height).rows
            for a, b in zip(starts.tolist(), stops.tolist())]
    assert list(zip(*(g.tolist() for g in got))) == [tuple(r) for r in want]


def _layer(op, in_shapes, out_shape, **fields):
    names = tuple(f"i{k}" for k in range(len(in_shapes)))
    return LayerSpec("l", op, names, ("o",), tuple(in_shapes), (out_shape,), **fields)


LAYERS = [
    _layer("concat", [(1, 4, 5, 3), (1, 4, 7, 3), (1, 4, 2, 3)], (1, 4, 14, 3),
           attrs=(("axis", 2),)),
    _layer("reshape", [(1, 4, 6, 10)], (1, 4, 15, 4)),
    _layer("reshape", [(1, 4, 15, 4)], (1, 4, 6, 10)),
    _layer("resize", [(1, 4, 5, 5)], (1, 4, 14, 14),
           attrs=(("row_spans", tuple((max(0, r * 5 // 14 - 1), min(5, r * 5 // 14 + 2))
                                      for r in range(14))),)),
    _layer("resize", [(1, 4, 5, 5)], (1, 4, 15, 15), scale_h=3),
    _layer("add", [(1, 4, 14, 3), (1, 4, 1, 3)], (1, 4, 14, 3)),
]


@settings(max_examples=100, deadline=None)
@given(st.sampled_from(LAYERS), st.lists(st.tuples(st.integers(0, 15), st.integers(0, 6)),
                                         min_size=1, max_size=6))
def test_other_layers_read_the_rows_of_backward_h_for_every_part(layer, outs):
    h_out = layer.out_shapes[0][2]
    outs = [(min(a, h_out), min(a + n, h_out)) for a, n in outs]
    outs = [(a, b) if a < b else (0, 0) for a, b in outs]  # a walk's empty range is [0, 0)
    starts, stops = (np.array(v, np.int64) for v in zip(*outs))
    for i in range(len(layer.inputs)):
        got = h_parts.input_rows(layer, (starts, stops), i)
        want = [tuple(input_rows(layer, Rows(a, b), i).rows) for a, b in outs]
        assert list(zip(*(g.tolist() for g in got))) == want
