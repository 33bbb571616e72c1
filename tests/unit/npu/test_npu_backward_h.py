"""Backward-H geometry and seed 001's overlap rule."""

import pytest

from npubuild.npu import Rows, Slicing, TilingRejected, input_rows, overlap, overlap_ok, split_rows
from npubuild.npu.builder import GraphBuilder
from npubuild.npu.tiling import tile_group


def test_seed_overlap_example_numbers():
    rejected = [Rows(0, 80), Rows(20, 100)]
    accepted = [Rows(0, 60), Rows(20, 100)]
    assert overlap(rejected) == 60 and not overlap_ok(rejected, 100)
    assert overlap(accepted) == 40 and overlap_ok(accepted, 100)


def _one_conv(k: int):
    b = GraphBuilder({"x": (1, 8, 100, 4)})
    y = b.conv("x", 8, k=k, p=0)
    graph = b.build([y])
    return graph.group(0, 1), y


def test_seed_overlap_example_through_the_tiler():
    group, y = _one_conv(61)  # H out 40 → halves [0,20) [20,40) read [0,80) and [20,100)
    with pytest.raises(TilingRejected, match="60 overlapping rows"):
        tile_group(group, Slicing(h=2))
    group, y = _one_conv(41)  # H out 60 → halves read [0,70) and [30,100): overlap 40
    tiling = tile_group(group, Slicing(h=2))
    assert [s.window.rows["x"] for s in tiling.slices] == [Rows(0, 70), Rows(30, 100)]


def test_conv_rows_and_effective_pads():
    b = GraphBuilder({"x": (1, 4, 16, 16)})
    b.conv("x", 4, k=3, s=2, p=1)
    conv = b.layers[0]
    assert input_rows(conv, Rows(0, 4)) == ((0, 8), 1, 0)   # rows -1..7: one pad row on top
    assert input_rows(conv, Rows(4, 8)) == ((7, 16), 0, 0)  # rows 7..15
    b = GraphBuilder({"x": (1, 4, 15, 15)})
    b.conv("x", 4, k=3, s=1, p=1)
    assert input_rows(b.layers[0], Rows(10, 15)) == ((9, 15), 0, 1)


def test_dilated_conv_pool_and_resize_rows():
    b = GraphBuilder({"x": (1, 4, 32, 32)})
    y = b.conv("x", 4, k=3, d=2)  # pad 2
    z = b.pool(y, k=5, s=1, p=2)
    b.resize(z, 2)
    conv, pool, resize = b.layers
    assert input_rows(conv, Rows(8, 12)) == ((6, 14), 0, 0)
    assert input_rows(pool, Rows(0, 3)) == ((0, 5), 2, 0)
    assert input_rows(resize, Rows(3, 9)) == ((1, 5), 0, 0)


def test_split_rows_is_a_near_equal_partition():
    assert split_rows(10, 3) == [Rows(0, 4), Rows(4, 7), Rows(7, 10)]
    with pytest.raises(ValueError):
        split_rows(3, 4)
