"""The program: per group and slice, DMA loads, compute steps and DMA stores on LMEM addresses.

A group's slices run one after another on the group's timestep table (`buffers.schedule`);
within a timestep the loads, the compute step and the stores touch disjoint LMEM (the allocator
guarantees it), so any order is correct. Layout contracts, also written into ``plan.json``:

- GMEM holds every weight (per layer, output channel major, as the quantizer lays it out; layers
  whose weights are the same bytes share one offset) and
  every tensor that crosses a group border, NCHW, ``act_bytes`` per element, at ``gmem`` offsets.
- LMEM: a buffer of ``batch × channels × rows × W`` puts element (n, c, r, w) in lane
  ``c % lanes`` at per-lane byte ``addr + (((n - n0) · ceil(C/lanes) + (c - c0) // lanes) · R
  + (r - r0)) · W + w`` (times ``act_bytes``), where ``n0``, ``c0``, ``r0`` are the first batch
  item, channel and row the buffer holds and ``R`` its row count in this slice. A weight buffer
  puts output channel ``o`` in lane ``(o - o0) % lanes``; a lookup table is copied to every lane.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Union

from npubuild.npu.backward_h import Rows
from npubuild.npu.buffers import weight_owners
from npubuild.npu.layer_group import CpuLayer, GroupPlan, LayerGroups
from npubuild.npu.layers import LayerGraph, LayerSpec
from npubuild.npu.tiling import SliceWindow
from npubuild.targets.model import Chip

GMEM_ALIGN = 64


@dataclass(frozen=True)
class Operand:
    """A compute step's view of one LMEM buffer in one slice."""

    tensor: str
    buffer: int
    addr: int
    batch: Rows
    channels: Rows
    rows_held: Rows  # the rows the buffer holds in this slice
    rows: Rows  # the rows this step reads or writes


@dataclass(frozen=True)
class Dma:
    """A transfer between GMEM and LMEM (``load``: GMEM → LMEM, ``store``: LMEM → GMEM)."""

    op: str
    timestep: int
    tensor: str
    buffer: int
    addr: int
    gmem: int
    batch: Rows | None
    channels: Rows
    rows_held: Rows | None
    rows: Rows | None  # activations: rows moved; weights: None
    bytes: int


@dataclass(frozen=True)
class Compute:
    op: str  # always "compute"; the layer's op family is ``kind``
    timestep: int
    layer: str
    kind: str
    inputs: tuple[Operand, ...]
    outputs: tuple[Operand, ...]
    weight: dict | None
    scratch: dict | None
    pad_top: int
    pad_bottom: int
    macs: int


Step = Union[Dma, Compute]


@dataclass(frozen=True)
class SliceProgram:
    index: int
    batch: Rows
    channels: Rows | None
    part: int
    steps: tuple[Step, ...]


@dataclass(frozen=True)
class GroupProgram:
    index: int
    plan: GroupPlan
    slices: tuple[SliceProgram, ...]
    device: str = "npu"


@dataclass(frozen=True)
class CpuStep:
    index: int
    layer: LayerSpec
    reason: str
    device: str = "cpu"


@dataclass(frozen=True)
class GmemLayout:
    weights: dict[str, tuple[int, int]]  # layer → (offset, bytes)
    tensors: dict[str, tuple[int, int]]  # tensor → (offset, bytes)
    size: int
    aliases: dict[str, str] = field(default_factory=dict)  # a reshape's output → its input


@dataclass(frozen=True)
class Program:
    chip: Chip
    graph: LayerGraph
    grouped: bool
    gmem: GmemLayout
    groups: tuple[Union[GroupProgram, CpuStep], ...]

    @property
    def npu_groups(self) -> list[GroupProgram]:
        return [g for g in self.groups if isinstance(g, GroupProgram)]


def build_program(groups: LayerGroups) -> Program:
    """Lay out GMEM and emit every group's slices as DMA and compute steps."""
    gmem = gmem_layout(groups)
    items = []
    for index, item in enumerate(groups.items):
        if isinstance(item, CpuLayer):
            items.append(CpuStep(index, item.layer, item.reason))
        else:
            slices = tuple(_slice_program(item, piece, gmem, groups.chip.lanes)
                           for piece in item.tiling.slices)
            items.append(GroupProgram(index, item, slices))
    return Program(groups.chip, groups.graph, groups.grouped, gmem, tuple(items))


def gmem_layout(groups: LayerGroups) -> GmemLayout:
    """Weights first, then every tensor that crosses a group (or CPU layer) border. Layers
    whose weights are the same bytes (one `LayerSpec.weight_key`) share the first one's offset:
    GMEM holds an unrolled recurrence's weight once, not once per step. A reshape
    between groups reinterprets C-order bytes: its output is its input's GMEM slot (an alias),
    so it moves no data."""
    graph, offset = groups.graph, 0
    weights, tensors, slots = {}, {}, {}
    for layer in graph.layers:
        if layer.weight_bytes:
            slot = slots.get(layer.weights_id)
            if slot is None or slot[1] != layer.weight_bytes:  # (the same bytes: same size)
                slot = slots[layer.weights_id] = (offset, layer.weight_bytes)
                offset += _gmem_align(layer.weight_bytes)
            weights[layer.name] = slot
    crossing = list(graph.inputs)
    aliases = {}
    for item in groups.items:
        if isinstance(item, CpuLayer):
            crossing += list(item.layer.inputs + item.layer.outputs)
            if is_alias(item.layer):
                aliases[item.layer.outputs[0]] = item.layer.inputs[0]
        else:
            crossing += list(item.group.inputs + item.group.outputs)
    for t in dict.fromkeys(crossing):  # widths from the graph's index (a scan each: quadratic)
        size = graph.tensor_bytes(t, tensor_elem_bytes(graph, t))
        source = aliases.get(t)
        if source in tensors and tensors[source][1] == size:
            tensors[t] = tensors[source]
            continue
        aliases.pop(t, None)
        tensors[t] = (offset, size)
        offset += _gmem_align(size)
    return GmemLayout(weights, tensors, offset, aliases)


def is_alias(layer: LayerSpec) -> bool:
    """A reshape (Reshape, Flatten, Squeeze, Unsqueeze) run between groups: no data moves."""
    return layer.attr("kind") == "reshape" and len(layer.inputs) == len(layer.outputs) == 1


def _gmem_align(size: int) -> int:
    return -(-size // GMEM_ALIGN) * GMEM_ALIGN


def tensor_elem_bytes(graph: LayerGraph, tensor: str) -> int:
    """Bytes per element of a tensor in GMEM: the width of the first layer touching it."""
    return graph.elem_bytes.get(tensor, 1)


def _slice_program(plan: GroupPlan, piece: SliceWindow, gmem: GmemLayout,
                   lanes: int) -> SliceProgram:
    """A slice's steps by timestep. Weights load in the group's first slice; with C slices,
    the next C slice's weights load (into the other weight buffer) while the last slice of
    this one computes."""
    steps: list[Step] = []
    by_step = _layers_by_timestep(plan)
    upcoming = _next_chunk(plan, piece)
    for t in range(plan.schedule.timesteps):  # (a slice may need no rows of a tensor: H-concat)
        steps += [_load(plan, piece, gmem, name) for name, at in plan.schedule.loads.items()
                  if at == t and piece.window.rows[name].size]
        steps += [_weight_load(plan, piece, gmem, name)
                  for name, at in plan.schedule.weight_loads.items()
                  if at == t and piece.index == 0]
        if t in by_step and piece.window.layers[by_step[t].name].out_rows.size:
            steps.append(_compute(plan, piece, by_step[t]))
            if upcoming is not None and by_step[t].name in plan.schedule.weight_loads:
                steps.append(_weight_load(plan, upcoming, gmem, by_step[t].name, at=t))
        steps += [_store(plan, piece, gmem, name) for name, at in plan.schedule.stores.items()
                  if at == t]
    return SliceProgram(piece.index, piece.batch, piece.channels, piece.part, tuple(steps))


def _layers_by_timestep(plan: GroupPlan) -> dict[int, LayerSpec]:
    layers = {layer.name: layer for layer in plan.group.layers}
    return {t: layers[name] for name, t in plan.schedule.compute.items()}


def _next_chunk(plan: GroupPlan, piece: SliceWindow) -> SliceWindow | None:
    """The first slice of the next C slice when ``piece`` is the last of its own."""
    slices = plan.tiling.slices
    following = slices[piece.index + 1] if piece.index + 1 < len(slices) else None
    if following is None or following.channels == piece.channels:
        return None
    return following


def _chunk(plan: GroupPlan, piece: SliceWindow) -> int:
    """Which C slice ``piece`` belongs to (0 without C slicing)."""
    if piece.channels is None:
        return 0
    starts = sorted({s.channels.start for s in plan.tiling.slices})
    return starts.index(piece.channels.start)


def _weight_buffer(plan: GroupPlan, piece: SliceWindow, layer: str):
    """Even C slices use ``<layer>/weight``, odd ones ``<layer>/weight.next``; a layer whose
    weights an earlier layer of the group has (`buffers.weight_owners`) reads that one's."""
    owner = weight_owners(plan.group)[layer]
    return plan.buffer(f"{owner}/weight" + (".next" if _chunk(plan, piece) % 2 else ""))


def _activation_bytes(plan: GroupPlan, piece: SliceWindow, tensor: str, rows: Rows) -> int:
    _, _, _, w = plan.group.shapes[tensor]
    chans = plan.tiling.channels(tensor, piece)
    return piece.batch.size * chans.size * rows.size * w * plan.group.elem_bytes[tensor]


def _load(plan: GroupPlan, piece: SliceWindow, gmem: GmemLayout, tensor: str) -> Dma:
    buf, rows = plan.buffer(tensor), piece.window.rows[tensor]
    return Dma("load", plan.schedule.loads[tensor], tensor, buf.id,
               plan.placement.addresses[buf.id], gmem.tensors[tensor][0], piece.batch, plan.tiling.channels(tensor, piece), rows,
               rows, _activation_bytes(plan, piece, tensor, rows))


def _store(plan: GroupPlan, piece: SliceWindow, gmem: GmemLayout, tensor: str) -> Dma:
    buf, rows = plan.buffer(tensor), piece.window.store[tensor]
    return Dma("store", plan.schedule.stores[tensor], tensor, buf.id,
               plan.placement.addresses[buf.id], gmem.tensors[tensor][0], piece.batch,
               plan.tiling.channels(tensor, piece), piece.window.rows[tensor], rows,
               _activation_bytes(plan, piece, tensor, rows))


def _weight_load(plan: GroupPlan, piece: SliceWindow, gmem: GmemLayout, layer_name: str,
                 at: int | None = None) -> Dma:
    """The weights ``piece`` computes with, into its weight buffer (at timestep ``at``, by
    default the schedule's)."""
    layer = next(l for l in plan.group.layers if l.name == layer_name)
    buf = _weight_buffer(plan, piece, layer_name)
    chans = piece.channels or Rows(0, layer.weight_channels)
    size = layer.weight_bytes * chans.size // layer.weight_channels
    timestep = plan.schedule.weight_loads[layer_name] if at is None else at
    return Dma("load", timestep, buf.name, buf.id,
               plan.placement.addresses[buf.id], gmem.weights[layer_name][0], None, chans,
               None, None, size)


def _operand(plan: GroupPlan, piece: SliceWindow, tensor: str, rows: Rows) -> Operand:
    buf = plan.buffer(tensor)
    return Operand(tensor, buf.id, plan.placement.addresses[buf.id], piece.batch,
                   plan.tiling.channels(tensor, piece), piece.window.rows[tensor], rows)


def _compute(plan: GroupPlan, piece: SliceWindow, layer: LayerSpec) -> Compute:
    window = piece.window.layers[layer.name]
    inputs = tuple(_operand(plan, piece, t, r) for t, r in zip(layer.inputs, window.reads))
    outputs = tuple(_operand(plan, piece, t, window.out_rows) for t in layer.outputs)
    weight = scratch = None
    if layer.weight_bytes:
        buf = _weight_buffer(plan, piece, layer.name)
        weight = {"buffer": buf.id, "addr": plan.placement.addresses[buf.id],
                  "channels": piece.channels or Rows(0, layer.weight_channels)}
    if layer.scratch_elem_bytes:
        buf = plan.buffer(f"{layer.name}/scratch")
        scratch = {"buffer": buf.id, "addr": plan.placement.addresses[buf.id]}
    n, c, h, _ = layer.out_shapes[0]
    chans = outputs[0].channels.size
    macs = layer.macs * window.out_rows.size * piece.batch.size * chans // (h * n * c)
    return Compute("compute", plan.schedule.compute[layer.name], layer.name, layer.op, inputs,
                   outputs, weight, scratch, window.pad_top, window.pad_bottom, macs)
