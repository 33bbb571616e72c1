"""LMEM buffers of a tiled group and their lifetimes in timesteps (seed 001).

One slice runs on a table of timesteps, repeated for every slice at the same addresses:
timestep 0 only loads; layer ``k`` (in the group's order) computes at timestep ``k + 1``;
the last timestep only stores. DMA overlaps compute: a group input is loaded one timestep before
its first reader runs, a layer's weights one timestep before the layer (seed 001: w4's
``[T5, T5]`` becomes ``[T2, T5]``), and a group output is stored the timestep after it is made.

Buffer kinds: ``activation`` (freed after its last reader, or after its store), ``weight``
(freed after its layer — after the last layer of the group with the same weights, which read
them from this one buffer, loaded once — unless N, H or C is sliced; then resident: ``end = inf``, loaded by the
first slice only and kept for every slice; a C-sliced layer has two, alternating between its C
slices, so the next slice's weights load while this one computes) and ``scratch`` (a layer's intermediate, freed when
the layer is done). Ids are assigned breadth-first over the group's layers: a layer's new inputs,
then its weight, its scratch, its outputs. Sizes are bytes per lane of the largest slice.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass

from npubuild.npu.layers import Group, LayerSpec, lane_bytes
from npubuild.npu.tiling import GroupTiling, SliceSizes, tiling_sizes

INF = math.inf
KINDS = ("activation", "weight", "scratch")


@dataclass(frozen=True)
class Buffer:
    """A (lifetime × bytes-per-lane) rectangle the allocator places on the address axis."""

    id: int
    kind: str
    name: str
    start: int
    end: float  # inclusive timestep; INF = resident across slices
    size: int
    layer: str | None = None

    @property
    def resident(self) -> bool:
        return self.end == INF

    def live_with(self, other: "Buffer") -> bool:
        """Whether the two are ever live at once (resident buffers are live at every step)."""
        if self.resident or other.resident:
            return True
        return self.start <= other.end and other.start <= self.end

    @property
    def span(self) -> float:
        return self.end - self.start + 1


@dataclass(frozen=True)
class Schedule:
    """Timesteps of one slice: compute, loads, weight loads, stores."""

    timesteps: int
    compute: dict[str, int]
    loads: dict[str, int]
    weight_loads: dict[str, int]
    stores: dict[str, int]


def schedule(group: Group) -> Schedule:
    compute = {layer.name: k + 1 for k, layer in enumerate(group.layers)}
    readers = _readers(group)
    loads = {t: compute[readers[t][0]] - 1 for t in group.inputs}
    weight_loads = {name: compute[name] - 1 for name in weight_owners(group).values()}
    producer = {t: l.name for l in group.layers for t in l.outputs}
    stores = {t: compute[producer[t]] + 1 for t in group.outputs}
    return Schedule(len(group) + 2, compute, loads, weight_loads, stores)


def weight_owners(group: Group) -> dict[str, str]:
    """Each layer with weights → the layer whose weight buffer it reads: itself, or the first
    layer of the group (in compute order) with the same weights (`LayerSpec.weight_key`),
    which loads them once for all of them."""
    first: dict[str, str] = {}
    return {l.name: first.setdefault(l.weights_id, l.name) for l in group.layers
            if l.weight_bytes}


def _readers(group: Group) -> dict[str, list[str]]:
    readers: dict[str, list[str]] = {}
    for layer in group.layers:
        for t in dict.fromkeys(layer.inputs):
            readers.setdefault(t, []).append(layer.name)
    return readers


def bfs_order(group: Group) -> list[LayerSpec]:
    """The group's layers breadth-first from its inputs (Kahn's algorithm, FIFO)."""
    producer = {t: i for i, l in enumerate(group.layers) for t in l.outputs}
    deps = [{producer[t] for t in l.inputs if t in producer} for l in group.layers]
    users: dict[int, list[int]] = {}
    for i, d in enumerate(deps):
        for j in sorted(d):
            users.setdefault(j, []).append(i)
    waiting = [len(d) for d in deps]
    queue = deque(i for i, n in enumerate(waiting) if n == 0)
    order = []
    while queue:
        i = queue.popleft()
        order.append(group.layers[i])
        for j in users.get(i, []):
            waiting[j] -= 1
            if waiting[j] == 0:
                queue.append(j)
    return order


def group_buffers(tiling: GroupTiling | SliceSizes, lanes: int) -> tuple[Buffer, ...]:
    """Every buffer of the group with its lifetime and per-lane size, ids breadth-first (from a
    tiling, or from its `SliceSizes` alone)."""
    if isinstance(tiling, GroupTiling):
        tiling = tiling_sizes(tiling)
    group, plan = tiling.group, schedule(tiling.group)
    resident = tiling.slicing.weights_resident
    readers = _readers(group)
    buffers: list[Buffer] = []

    def add(kind, name, start, end, size, layer=None):
        buffers.append(Buffer(len(buffers), kind, name, start, end, size, layer))

    seen: set[str] = set()
    owners = weight_owners(group)
    last_use = {owners[name]: plan.compute[name] for name in owners}  # (compute order)
    for layer in bfs_order(group):
        step = plan.compute[layer.name]
        for t in layer.inputs:
            if t in group.inputs and t not in seen:
                seen.add(t)
                add("activation", t, plan.loads[t], _last_read(plan, readers[t]),
                    _activation_size(tiling, t, lanes))
        if layer.weight_bytes and owners[layer.name] == layer.name:
            size = _weight_size(tiling, layer, lanes)
            add("weight", f"{layer.name}/weight", step - 1,
                INF if resident else last_use[layer.name], size, layer.name)
            if tiling.slicing.c > 1:  # double-buffered: the next C slice's weights stream in
                add("weight", f"{layer.name}/weight.next", step - 1, INF, size, layer.name)
        if layer.scratch_elem_bytes:
            add("scratch", f"{layer.name}/scratch", step, step,
                _activation_size(tiling, layer.outputs[0], lanes, layer.scratch_elem_bytes),
                layer.name)
        for t in layer.outputs:
            end = max([_last_read(plan, readers.get(t, [])), plan.stores.get(t, step)])
            add("activation", t, step, end, _activation_size(tiling, t, lanes))
    return tuple(buffers)


def _last_read(plan: Schedule, readers: list[str]) -> int:
    return max((plan.compute[name] for name in readers), default=0)


def _activation_size(sizes: SliceSizes, tensor: str, lanes: int, elem_bytes: int = 0) -> int:
    """Bytes per lane of the tensor's largest slice (every factor at its largest: the slices
    are every N slice with every C slice and H part)."""
    n, c, h, w = sizes.group.shapes[tensor]
    eb = elem_bytes or sizes.group.elem_bytes[tensor]
    return lane_bytes(sizes.batch, sizes.channels(tensor), sizes.rows[tensor], w, eb, lanes)


def _weight_size(sizes: SliceSizes, layer: LayerSpec, lanes: int) -> int:
    return layer.weight_bytes_per_lane(lanes, sizes.weight_channels)
