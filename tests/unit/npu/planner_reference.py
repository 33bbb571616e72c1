"""The straightforward layer-group planner, kept as the oracle the fast one must match: every
buffer checked against every buffer placed before it, the live bytes counted timestep by
timestep, every group's backward-H walked from scratch and every fit computed anew (the
planner as it was before `WindowWalks`, the allocator's timestep index and the fit memo)."""

from __future__ import annotations

from typing import Sequence
from unittest import mock

from npubuild.npu import layer_group, lmem
from npubuild.npu.buffers import Buffer
from npubuild.npu.cuts import refine
from npubuild.npu.layer_group import LayerGroups, NoFit, fit_group
from npubuild.npu.lmem import Placement, align, placement_order


def allocate(buffers: Sequence[Buffer], capacity: int, bank_bytes: int | None = None,
             alignment: int = lmem.ALIGN) -> Placement:
    bank, relaxed = bank_bytes or capacity, set()
    while True:
        try:
            return _place(buffers, capacity, bank, alignment, relaxed)
        except lmem._Missed as miss:
            if miss.moved <= relaxed:
                if len(relaxed) == len(buffers):
                    raise lmem.LmemOverflow(miss.buffer, capacity) from None
                relaxed = {b.id for b in buffers}
            relaxed |= miss.moved


def _place(buffers, capacity, bank, alignment, relaxed) -> Placement:
    placed, moved, crossings, spanning = [], set(), 0, 0
    for buf in placement_order(buffers):
        size = align(max(buf.size, 1), alignment)
        busy = sorted((lo, hi) for other, lo, hi in placed if other.live_with(buf))
        preferred, lowest = lmem._lowest_fit(busy, size, capacity, bank, alignment)
        addr = lowest if buf.id in relaxed else preferred
        if addr is None:
            raise lmem._Missed(buf, moved)
        moved |= {buf.id} if addr != lowest else set()
        if addr // bank != (addr + size - 1) // bank:
            crossings += size <= bank
            spanning += size > bank
        placed.append((buf, addr, addr + size))
    peak = max((hi for _, _, hi in placed), default=0)
    return Placement({b.id: lo for b, lo, _ in placed}, peak, crossings, spanning)


def peak_live_bytes(buffers: Sequence[Buffer], timesteps: int,
                    alignment: int = lmem.ALIGN) -> int:
    resident = sum(align(b.size, alignment) for b in buffers if b.resident)
    per_step = [sum(align(b.size, alignment) for b in buffers
                    if not b.resident and b.start <= t <= b.end) for t in range(timesteps)]
    return resident + max(per_step, default=0)


def plan_groups(graph, chip, *, grouping: bool = True, on_no_fit: str = "error",
                max_group_layers: int = 256) -> LayerGroups:
    """`layer_group.plan_groups` the straightforward way."""
    with mock.patch.object(layer_group, "allocate", allocate), \
            mock.patch.object(layer_group, "peak_live_bytes", peak_live_bytes):
        items = []
        end = len(graph.layers)
        while end > 0:
            start = end - 1
            found = fit_group(graph.group(start, end), chip)
            if isinstance(found, NoFit):
                items.append(layer_group._no_fit(graph.layers[start], found, chip, on_no_fit))
                end = start
                continue
            while grouping and start > 0 and end - start < max_group_layers:
                wider = fit_group(graph.group(start - 1, end), chip)
                if isinstance(wider, NoFit):
                    break
                found, start = wider, start - 1
            items.append(found)
            end = start
        items.reverse()
        if grouping:
            items = refine(items, graph, lambda a, b: layer_group._fitting(
                fit_group(graph.group(a, b), chip)))
        return LayerGroups(graph, chip, grouping, tuple(items))
