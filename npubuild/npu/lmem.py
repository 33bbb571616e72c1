"""The LMEM allocator: place (lifetime × size) rectangles on the address axis (seed 001).

A buffer's lifetime is fixed; only its address moves. Buffers are placed longest lifetime first
(resident ones before all others), then largest, each at the lowest address where it overlaps no
already placed buffer that is live at the same time. Among the free places the allocator prefers
one that keeps the buffer inside one bank; it counts the buffers left crossing a bank boundary
(``bank_crossings``: could have fitted in a bank; ``bank_spanning``: larger than a bank).
Addresses and sizes are bytes per lane; every lane uses the same addresses.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Iterator, Sequence

from npubuild.npu.buffers import Buffer

ALIGN = 16  # bytes per lane; every buffer starts on this boundary


class LmemOverflow(Exception):
    """No address range fits ``buffer`` next to the buffers live at the same time."""

    def __init__(self, buffer: Buffer, capacity: int):
        super().__init__(f"buffer {buffer.id} ({buffer.kind} {buffer.name!r}, {buffer.size} bytes "
                         f"per lane) does not fit in {capacity} bytes per lane")
        self.buffer = buffer
        self.capacity = capacity


@dataclass(frozen=True)
class Placement:
    addresses: dict[int, int]
    peak: int  # highest end address used, bytes per lane
    bank_crossings: int
    bank_spanning: int


def align(value: int, to: int = ALIGN) -> int:
    return -(-value // to) * to


def placement_order(buffers: Iterable[Buffer]) -> list[Buffer]:
    """Longest lifetime first (resident = infinite), then largest, then id."""
    return sorted(buffers, key=lambda b: (-b.span, -b.size, b.id))


def allocate(buffers: Sequence[Buffer], capacity: int, bank_bytes: int | None = None,
             alignment: int = ALIGN) -> Placement:
    """Addresses for every buffer; raises `LmemOverflow` for a buffer that cannot fit.

    Keeping buffers inside banks can fragment LMEM. When a buffer then misses, the buffers that
    were moved up to a bank boundary before it go back to their lowest free address and the
    placement is redone, until it fits; with every buffer lowest-first the allocation always
    succeeds when the buffers would fit side by side. The crossings left are counted.
    """
    bank, relaxed = bank_bytes or capacity, set()
    while True:
        try:
            return _place(buffers, capacity, bank, alignment, relaxed)
        except _Missed as miss:
            if miss.moved <= relaxed:
                if len(relaxed) == len(buffers):
                    raise LmemOverflow(miss.buffer, capacity) from None
                relaxed = {b.id for b in buffers}
            relaxed |= miss.moved


class _Missed(Exception):
    def __init__(self, buffer: Buffer, moved: set[int]):
        self.buffer, self.moved = buffer, moved


def _place(buffers: Sequence[Buffer], capacity: int, bank: int, alignment: int,
           relaxed: set[int]) -> Placement:
    placed = _Placed()
    moved: set[int] = set()
    crossings = spanning = 0
    for buf in placement_order(buffers):
        size = align(max(buf.size, 1), alignment)
        preferred, lowest = _lowest_fit(placed.busy(buf), size, capacity, bank, alignment)
        addr = lowest if buf.id in relaxed else preferred
        if addr is None:
            raise _Missed(buf, moved)
        moved |= {buf.id} if addr != lowest else set()
        if addr // bank != (addr + size - 1) // bank:
            crossings += size <= bank
            spanning += size > bank
        placed.add(buf, addr, addr + size)
    peak = max((hi for _, hi in placed.every), default=0)
    return Placement(placed.addresses, peak, crossings, spanning)


class _Placed:
    """The address ranges placed so far, by the timesteps they are live at (resident ones
    apart: live at every step), so that a buffer's conflicts are the ranges of its own
    timesteps, not a scan of every buffer placed (timesteps are whole numbers)."""

    def __init__(self):
        self.addresses: dict[int, int] = {}
        self.every: list[tuple[int, int]] = []
        self.resident: list[tuple[int, int]] = []
        self.at: dict[int, list[tuple[int, int]]] = {}

    def busy(self, buf: Buffer) -> list[tuple[int, int]]:
        """The (sorted) ranges of the placed buffers live at the same time as ``buf``."""
        if buf.resident:
            return sorted(self.every)
        found = list(self.resident)
        for step in range(buf.start, int(buf.end) + 1):
            found += self.at.get(step, ())
        return sorted(found)

    def add(self, buf: Buffer, lo: int, hi: int) -> None:
        self.addresses[buf.id] = lo
        self.every.append((lo, hi))
        if buf.resident:
            self.resident.append((lo, hi))
            return
        for step in range(buf.start, int(buf.end) + 1):
            self.at.setdefault(step, []).append((lo, hi))


def _lowest_fit(busy: list[tuple[int, int]], size: int, capacity: int, bank: int,
                alignment: int) -> tuple[int | None, int | None]:
    """The lowest free start that keeps the buffer in one bank (else the lowest), and the lowest."""
    lowest = None
    for lo, hi in _gaps(busy, capacity):
        addr = align(lo, alignment)
        if addr + size > hi:
            continue
        lowest = addr if lowest is None else lowest
        if size > bank:  # it must span banks wherever it goes
            return addr, lowest
        if addr // bank != (addr + size - 1) // bank:
            addr = align((addr // bank + 1) * bank, alignment)
        if addr + size <= hi:
            return addr, lowest
    return lowest, lowest


def _gaps(busy: list[tuple[int, int]], capacity: int) -> Iterator[tuple[int, int]]:
    """Free address ranges between the (sorted) busy ones, lowest first (lazily: the first
    that fits ends the search, and a long group's buffers see hundreds of busy ranges)."""
    reach = 0
    for lo, hi in busy:
        if lo > reach:
            yield reach, lo
        if hi > reach:
            reach = hi
    if reach < capacity:
        yield reach, capacity


def peak_live_bytes(buffers: Sequence[Buffer], timesteps: int, alignment: int = ALIGN) -> int:
    """The most bytes per lane live at one timestep: a lower bound for any placement."""
    resident = sum(align(b.size, alignment) for b in buffers if b.resident)
    change = [0] * (timesteps + 1)  # bytes born minus bytes freed at each step
    for b in buffers:
        first, last = max(b.start, 0), min(b.end, timesteps - 1)
        if not b.resident and first <= last:
            change[first] += align(b.size, alignment)
            change[int(last) + 1] -= align(b.size, alignment)
    live, most = 0, 0
    for step in range(timesteps):
        live += change[step]
        most = max(most, live)
    return resident + most


def conflicts(buffers: Sequence[Buffer], placement: Placement, capacity: int) -> list[str]:
    """Every violation of the allocation invariants (empty when the placement is sound)."""
    problems = []
    spans = {b.id: (placement.addresses[b.id], placement.addresses[b.id] + b.size) for b in buffers}
    for b in buffers:
        lo, hi = spans[b.id]
        if lo < 0 or hi > capacity:
            problems.append(f"buffer {b.id} at [{lo}, {hi}) leaves LMEM (0..{capacity})")
    for i, a in enumerate(buffers):
        for b in buffers[i + 1:]:
            (a_lo, a_hi), (b_lo, b_hi) = spans[a.id], spans[b.id]
            if a.live_with(b) and a_lo < b_hi and b_lo < a_hi and a.size and b.size:
                problems.append(f"buffers {a.id} and {b.id} are live together and overlap in "
                                f"[{max(a_lo, b_lo)}, {min(a_hi, b_hi)})")
    return problems
