"""Slicing a layer group along N, H (and, for one heavy layer, C) into slices that fit LMEM.

For an H slicing into ``h`` parts, each group output's rows are split into ``h`` near-equal
ranges (the rows that slice *stores*). Walking the layers backwards, a layer computes the hull
of what its outputs' consumers need, and backward-H gives the rows it reads from each input
(`backward_h.input_rows`). A tensor's buffer holds the hull of everything read from it, so a
layer may read a sub-range of a buffer; every compute step records the rows it reads, the rows
the buffer holds and the effective paddings.

N slices split the batch; every N slice sees the same H windows. Every tensor of a group has
the same batch (N of its view): layers of another batch next to them (GTCRN's [1, 33, 8] and
[33, 1, 8] GRU states, joined side by side) reject every slicing, so they start another group.
C slices exist only for a group of one layer whose weights alone do not fit (TPU-MLIR runs such
layers on their own too): a ``conv`` computes a range of output channels from all input
channels, a channel-wise layer reads and writes the same range. Slices run C-major, then N,
then H, so a C slice's weights load once.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import product

import numpy as np

from npubuild.npu import h_parts
from npubuild.npu.backward_h import Rows, input_rows, overlap, overlap_ok, share, split_rows
from npubuild.npu.layers import Group


class TilingRejected(Exception):
    """A slicing that cannot work for this group; the message says why."""


@dataclass(frozen=True)
class Slicing:
    n: int = 1
    h: int = 1
    c: int = 1

    @property
    def count(self) -> int:
        return self.n * self.h * self.c

    @property
    def weights_resident(self) -> bool:
        """Seed 001: when N or H is sliced, weights stay in LMEM for every slice (and when C
        is, each C slice's part stays until the next part replaces it)."""
        return self.n > 1 or self.h > 1 or self.c > 1

    def as_dict(self) -> dict[str, int]:
        return {"n": self.n, "h": self.h, "c": self.c}

    def __str__(self) -> str:
        return f"N/{self.n} H/{self.h}" + (f" C/{self.c}" if self.c > 1 else "")


@dataclass(frozen=True)
class LayerWindow:
    """What one layer computes in one H part."""

    out_rows: Rows
    reads: tuple[Rows, ...]
    pad_top: int
    pad_bottom: int


@dataclass(frozen=True)
class HWindow:
    """One H part: rows every tensor's buffer holds, rows each group output stores."""

    part: int
    rows: dict[str, Rows]
    store: dict[str, Rows]
    layers: dict[str, LayerWindow]


@dataclass(frozen=True)
class SliceWindow:
    index: int
    batch: Rows
    channels: Rows | None  # output channels of the group's single layer when C is sliced
    window: HWindow

    @property
    def part(self) -> int:
        return self.window.part


@dataclass(frozen=True)
class GroupTiling:
    group: Group
    slicing: Slicing
    slices: tuple[SliceWindow, ...]

    def channels(self, tensor: str, piece: SliceWindow) -> Rows:
        """The channels of ``tensor`` a slice holds (all of them unless C is sliced)."""
        full = Rows(0, self.group.shapes[tensor][1])
        if piece.channels is None:
            return full
        layer = self.group.layers[0]
        if tensor in layer.outputs:
            return piece.channels
        if any(t == tensor and layer.input_follows_channels(i) for i, t in enumerate(layer.inputs)):
            return piece.channels
        return full


@dataclass(frozen=True)
class SliceSizes:
    """The largest slice of a slicing, tensor by tensor: what buffer sizes depend on (the most
    rows a tensor's buffer holds in one H part, the largest N and C slice), without windows."""

    group: Group
    slicing: Slicing
    rows: dict[str, int]

    @property
    def batch(self) -> int:
        return -(-self.group.shapes[self.group.outputs[0]][0] // self.slicing.n)

    def channels(self, tensor: str) -> int:
        """The most channels of ``tensor`` one slice holds (`GroupTiling.channels`)."""
        full = self.group.shapes[tensor][1]
        if self.slicing.c == 1:
            return full
        layer = self.group.layers[0]
        follows = tensor in layer.outputs or any(
            t == tensor and layer.input_follows_channels(i) for i, t in enumerate(layer.inputs))
        return -(-layer.c_out // self.slicing.c) if follows else full

    @property
    def weight_channels(self) -> int | None:
        """The most output channels one C slice computes (None: not C-sliced)."""
        return -(-self.group.layers[0].c_out // self.slicing.c) if self.slicing.c > 1 else None


def slice_sizes(group: Group, slicing: Slicing) -> SliceSizes:
    """`tile_group`'s verdict (the same `TilingRejected`) and its largest slice, from the rows of
    every H part at once (`npubuild.npu.h_parts`): what the slicing search asks of many H counts
    before it builds one tiling."""
    _check_limits(group, slicing)
    rows = h_parts.h_rows(group, slicing.h)
    if slicing.h > 1:
        for layer in group.layers:
            for t in dict.fromkeys(layer.inputs):
                height, loaded = group.shapes[t][2], h_parts.overlap(rows[t])
                if height > 1 and 2 * loaded > height:
                    raise TilingRejected(_overlap_message(t, layer, height, loaded, slicing.h))
    return SliceSizes(group, slicing, {t: int(np.maximum(stop - start, 0).max())
                                       for t, (start, stop) in rows.items()})


def tiling_sizes(tiling: GroupTiling) -> SliceSizes:
    """The `SliceSizes` of a tiling, from its windows."""
    rows: dict[str, int] = {}
    for piece in tiling.slices:
        for t, r in piece.window.rows.items():
            rows[t] = max(rows.get(t, 0), r.size)
    return SliceSizes(tiling.group, tiling.slicing, rows)


def tile_group(group: Group, slicing: Slicing, *, enforce_overlap: bool = True,
               walks: "WindowWalks | None" = None) -> GroupTiling:
    """Backward-H through the group for every slice; raises `TilingRejected` with the reason.

    ``enforce_overlap=False`` skips seed 001's h/2 rule (to inspect a slicing it would reject);
    ``walks`` reuses the backward-H walks of groups of the same graph that end where this one
    does (the group search grows a group one layer at a time towards the head).
    """
    _check_limits(group, slicing)
    window = walks.window if walks is not None else _h_window
    windows = [window(group, slicing.h, part) for part in range(slicing.h)]
    if slicing.h > 1 and enforce_overlap:
        _check_overlap(group, windows)
    batch = group.shapes[group.outputs[0]][0]
    batches = split_rows(batch, slicing.n)
    chans = split_rows(group.layers[0].c_out, slicing.c) if slicing.c > 1 else [None]
    slices = tuple(SliceWindow(i, b, c, w)
                   for i, (c, b, w) in enumerate(product(chans, batches, windows)))
    return GroupTiling(group, slicing, slices)


def _check_limits(group: Group, slicing: Slicing) -> None:
    if len(group.batches) > 1:  # a slice's batch range is one for every tensor it moves
        raise TilingRejected(f"its tensors have batches {', '.join(map(str, group.batches))}: "
                             "a slice loads, computes and stores one batch range")
    batch = min(group.shapes[t][0] for t in group.outputs)
    height = min(group.shapes[t][2] for t in group.outputs)
    if slicing.n > batch:
        raise TilingRejected(f"cannot cut a batch of {batch} into {slicing.n} N slices")
    if slicing.h > height:
        raise TilingRejected(f"cannot cut an output of H={height} into {slicing.h} H slices")
    if slicing.c > 1:
        layer = group.layers[0]
        if len(group) > 1 or not layer.c_sliceable:
            raise TilingRejected("C slicing is only for a group of one conv, depthwise conv or "
                                 "channel-wise layer")
        if slicing.c > layer.c_out:
            raise TilingRejected(f"cannot cut {layer.c_out} channels into {slicing.c} C slices")


def _h_window(group: Group, parts: int, part: int) -> HWindow:
    rows = {t: share(group.shapes[t][2], parts, part) for t in group.outputs}
    store = dict(rows)
    layers: dict[str, LayerWindow] = {}
    for layer in reversed(group.layers):
        layers[layer.name] = _walk_layer(layer, rows, parts, part)
    return HWindow(part, rows, store, layers)


def _walk_layer(layer, rows: dict[str, Rows], parts: int, part: int) -> LayerWindow:
    """One step of the backward walk: the rows ``layer`` computes (what its outputs' readers
    and stores need) and reads; ``rows`` takes both."""
    wanted = [rows[t] for t in layer.outputs if t in rows]
    out = _hull(wanted) if wanted else _own_share(layer.h_out, parts, part)
    for t in layer.outputs:
        rows[t] = out
    needs = [input_rows(layer, out, i) for i in range(len(layer.inputs))]
    for t, need in zip(layer.inputs, needs):  # (a window wholly in padding reads nothing)
        rows[t] = need.rows.hull(rows.get(t))
    first = needs[0]
    return LayerWindow(out, tuple(n.rows for n in needs), first.pad_top, first.pad_bottom)


class WindowWalks:
    """Backward-H walks kept per (group end, H parts, part) for the groups of one layer graph.

    A layer's window depends only on the layers after it in its group and on which of its
    outputs the group stores, and both are fixed by where the group ends (no layer before a
    group reads what the group makes). So the walk of ``layers[s:end]`` is the walk of
    ``layers[s + 1:end]`` taken one layer further: the group search, growing a group towards
    the head, walks each layer once per H count instead of once per length; a group that
    starts later takes the walk's windows of its own layers and the rows its layers read. The
    windows are the ones `_h_window` gives (a row hull does not depend on the order it is taken
    in).
    """

    ENDS = 4  # the group ends whose walks are kept (the most recent), to bound memory

    def __init__(self):
        self._walks: dict[int, dict[tuple[int, int], _Walk]] = {}

    def window(self, group: Group, parts: int, part: int) -> HWindow:
        """The `HWindow` of ``part`` of ``parts`` H parts of ``group``."""
        end = group.start + len(group)
        if end not in self._walks:
            if len(self._walks) >= self.ENDS:
                del self._walks[next(iter(self._walks))]
            self._walks[end] = {}
        walk = self._walks[end].setdefault((parts, part), _Walk(end, {}, {}))
        walk.extend(group, parts, part)
        store = {t: share(group.shapes[t][2], parts, part) for t in group.outputs}
        if walk.start == group.start:
            return HWindow(part, dict(walk.rows), store, dict(walk.layers))
        return HWindow(part, walk.rows_from(group), store,
                       {layer.name: walk.layers[layer.name] for layer in group.layers})


@dataclass
class _Walk:
    """A backward-H walk from a group's end down to layer ``start``."""

    start: int
    rows: dict[str, Rows]
    layers: dict[str, LayerWindow]

    def extend(self, group: Group, parts: int, part: int) -> None:
        """Walk on to ``group``'s head (its stored outputs start with their own share)."""
        stored, rows = set(group.outputs), self.rows
        for layer in reversed(group.layers[:self.start - group.start]):
            for t in layer.outputs:
                if t in stored:
                    rows[t] = share(group.shapes[t][2], parts, part).hull(rows.get(t))
            self.layers[layer.name] = _walk_layer(layer, rows, parts, part)
        self.start = min(self.start, group.start)

    def rows_from(self, group: Group) -> dict[str, Rows]:
        """The rows of a group that starts after the walk's head: what its layers make is as
        walked; its inputs hold only what its own layers read (in the walk's order)."""
        made = {t: self.rows[t] for layer in group.layers for t in layer.outputs}
        rows = dict(made)
        for layer in reversed(group.layers):
            for t, read in zip(layer.inputs, self.layers[layer.name].reads):
                if t not in made:
                    rows[t] = read.hull(rows.get(t))
        return rows


def _own_share(height: int, parts: int, part: int) -> Rows:
    """Rows of a dead output (no reader, not stored): its share, or everything if too short."""
    return share(height, parts, part) if parts <= height else Rows(0, height)


def _hull(ranges: list[Rows]) -> Rows:
    hull = ranges[0]
    for r in ranges[1:]:
        hull = hull.hull(r)
    return hull


def _check_overlap(group: Group, windows: list[HWindow]) -> None:
    for layer in group.layers:
        for t in dict.fromkeys(layer.inputs):
            height = group.shapes[t][2]
            if height == 1:  # a row broadcast to every slice (e.g. a squeeze-excite scale)
                continue
            ranges = [w.rows[t] for w in windows]
            if not overlap_ok(ranges, height):
                raise TilingRejected(_overlap_message(t, layer, height, overlap(ranges),
                                                      len(windows)))


def _overlap_message(tensor: str, layer, height: int, loaded: int, parts: int) -> str:
    return (f"input {tensor!r} of layer {layer.name!r} (H={height}) would be loaded with "
            f"{loaded} overlapping rows over {parts} H slices (more than H/2 = {height / 2:g})")
