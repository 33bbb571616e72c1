"""Layer-group search, slicing order, lifetimes, ids and the no-fit paths."""

import math

import pytest

from npubuild.errors import BuildError
from npubuild.npu import CpuLayer, Slicing, plan_groups
from npubuild.npu.builder import GraphBuilder
from npubuild.npu.lmem import conflicts
from npubuild.targets import load_chip
from npubuild.targets.model import Chip


def chip(name="npu-tiny", **changes) -> Chip:
    return Chip.model_validate({**load_chip(name).model_dump(exclude_unset=True), **changes})


def chain(shape=(1, 16, 96, 96)):
    b = GraphBuilder({"x": shape})
    y = b.conv("x", 16, k=3)
    y = b.mul(y, b.lut(y))
    y = b.pool(y, k=2)
    y = b.add(y, b.conv(y, 16, k=3))
    return b.build([y])


def test_small_chain_is_one_unsliced_group_on_a_roomy_chip():
    groups = plan_groups(chain((1, 16, 32, 32)), load_chip("npu-16m"))
    [plan] = groups.npu_groups
    assert plan.slicing == Slicing(1, 1, 1) and len(plan.group) == 6
    weight = plan.buffer("conv0/weight")
    assert (weight.start, weight.end) == (0, 1)  # loaded one step early, freed after use


def test_tiny_chip_forces_h_slicing_with_resident_weights():
    target = load_chip("npu-tiny")
    groups = plan_groups(chain(), target)
    assert any(p.slicing.h > 1 for p in groups.npu_groups)
    for plan in groups.npu_groups:
        assert conflicts(plan.buffers, plan.placement, target.lmem_bytes_per_lane) == []
        if plan.slicing.h > 1:
            assert all(b.end == math.inf for b in plan.buffers if b.kind == "weight")


def test_n_is_sliced_before_h():
    graph = chain((4, 16, 24, 24))
    slicing = [[p.slicing for p in plan_groups(graph, chip(lmem_bytes_per_lane=kib * 1024))
                .npu_groups] for kib in (1024, 16, 8, 4)]
    assert slicing[:3] == [[Slicing(1, 1)], [Slicing(2, 1)], [Slicing(4, 1)]]
    assert any(s.h > 1 for s in slicing[3])
    assert all(s.n == 4 for s in slicing[3] if s.h > 1)  # H only once N is cut to single items


def test_lifetimes_and_breadth_first_ids():
    b = GraphBuilder({"x": (1, 8, 16, 16)})
    a = b.conv("x", 8)
    c = b.lut(b.conv(a, 8))  # conv1 then lut2: depth 2 and 3
    e = b.lut(a)  # lut3: depth 2, so breadth-first before lut2
    out = b.concat([c, e])
    [plan] = plan_groups(b.build([out]), load_chip("npu-16m")).npu_groups
    names = [buf.name for buf in sorted(plan.buffers, key=lambda x: x.id)]
    assert names == ["x", "conv0/weight", "conv0_out", "conv1/weight", "conv1_out",
                     "lut3/weight", "lut3_out", "lut2/weight", "lut2_out", "concat4_out"]
    life = {buf.name: (buf.start, buf.end) for buf in plan.buffers}
    assert life["x"] == (0, 1)                 # loaded at T0, read by conv0 at T1
    assert life["conv0_out"] == (1, 4)         # read by conv1 (T2) and lut3 (T4)
    assert life["lut2/weight"] == (2, 3)       # lut2 computes at T3
    assert life["concat4_out"] == (5, 6)       # stored the step after it is made
    assert plan.schedule.timesteps == 7


def test_layer_that_cannot_fit_alone_is_named_with_its_bytes():
    b = GraphBuilder({"x": (1, 8, 4, 1100)})
    y = b.concat([b.lut("x"), "x"])  # a row of concat: 4 × 1100 bytes per lane
    graph = b.build([b.lut(y)])
    target = chip(lmem_bytes_per_lane=4096)
    with pytest.raises(BuildError, match=r"layer 'concat1' \(concat\) does not fit in LMEM "
                                         r"even alone: it needs \d+ bytes per lane.*"
                                         r"4096 bytes per lane"):
        plan_groups(graph, target)
    groups = plan_groups(graph, target, on_no_fit="cpu")
    kinds = [type(g).__name__ for g in groups.items]
    assert kinds == ["GroupPlan", "CpuLayer", "GroupPlan"]
    assert isinstance(groups.items[1], CpuLayer) and "concat1" in groups.items[1].reason


def test_heavy_conv_is_sliced_along_output_channels():
    b = GraphBuilder({"x": (1, 256, 10, 10)})
    graph = b.build([b.conv("x", 256, k=3)])  # 73 KiB of weights per lane on 8 lanes
    [plan] = plan_groups(graph, load_chip("npu-tiny")).npu_groups
    assert plan.slicing.c > 1
    assert plan.buffer("conv0/weight").size <= load_chip("npu-tiny").lmem_bytes_per_lane


def test_no_grouping_baseline_has_one_layer_per_group():
    graph = chain((1, 16, 32, 32))
    groups = plan_groups(graph, load_chip("npu-16m"), grouping=False)
    assert [len(p.group) for p in groups.npu_groups] == [1] * len(graph.layers)
