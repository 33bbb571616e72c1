"""The LMEM allocator: order, non-overlap, banks, overflow, and the checker."""

import math

import pytest

from npubuild.npu import Buffer, LmemOverflow, allocate, conflicts
from npubuild.npu.lmem import Placement, peak_live_bytes, placement_order


def buf(i, start, end, size, kind="activation"):
    return Buffer(i, kind, f"t{i}", start, end, size)


def test_buffers_live_at_once_get_disjoint_addresses_and_dead_ones_reuse_space():
    buffers = [buf(0, 0, 2, 256), buf(1, 1, 3, 256), buf(2, 3, 4, 256)]
    placement = allocate(buffers, capacity=1024)
    assert conflicts(buffers, placement, 1024) == []
    assert placement.addresses[2] == placement.addresses[0]  # 0 is dead when 2 is born
    assert placement.peak == 512


def test_longest_lifetime_first_then_largest():
    buffers = [buf(0, 0, 1, 64), buf(1, 0, 5, 32), buf(2, 0, 1, 128), buf(3, 2, math.inf, 16)]
    assert [b.id for b in placement_order(buffers)] == [3, 1, 2, 0]
    placement = allocate(buffers, capacity=4096)
    assert placement.addresses[3] == 0 and placement.addresses[1] == 16


def test_resident_buffers_conflict_with_every_timestep():
    weight = buf(0, 3, math.inf, 64, kind="weight")
    early = buf(1, 0, 1, 64)  # lives before the weight loads, but the table repeats per slice
    placement = allocate([weight, early], capacity=1024)
    assert placement.addresses[0] != placement.addresses[1]


def test_bank_crossings_are_avoided_when_possible_and_counted_otherwise():
    buffers = [buf(0, 0, 5, 800), buf(1, 0, 5, 400)]
    placement = allocate(buffers, capacity=4096, bank_bytes=1024)
    assert placement.addresses[1] == 1024 and placement.bank_crossings == 0
    tight = allocate(buffers, capacity=1280, bank_bytes=1024)
    assert tight.addresses[1] == 800 and tight.bank_crossings == 1
    big = allocate([buf(0, 0, 1, 1500)], capacity=4096, bank_bytes=1024)
    assert big.bank_spanning == 1 and big.bank_crossings == 0


def test_overflow_names_the_buffer():
    with pytest.raises(LmemOverflow, match="t1"):
        allocate([buf(0, 0, 3, 600), buf(1, 1, 2, 600)], capacity=1024)


def test_checker_catches_a_broken_allocation():
    buffers = [buf(0, 0, 2, 256), buf(1, 1, 3, 256)]
    broken = Placement({0: 0, 1: 128}, 384, 0, 0)
    assert "live together and overlap in [128, 256)" in conflicts(buffers, broken, 1024)[0]
    assert "leaves LMEM" in conflicts(buffers, Placement({0: 0, 1: 900}, 1156, 0, 0), 1024)[0]


def test_peak_live_bytes_is_a_lower_bound():
    buffers = [buf(0, 0, 2, 100), buf(1, 1, 3, 100), buf(2, 0, math.inf, 10, "weight")]
    assert peak_live_bytes(buffers, 4) == 112 + 112 + 16
