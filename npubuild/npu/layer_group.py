"""LayerGroup (seed 001): cut the layer list into groups that each run inside LMEM.

Groups are searched from the tail towards the head: a group starts as the last unplaced layer
and grows towards the head while the longer group still fits; then each cut between two
neighbouring groups moves to where the least GMEM traffic crosses it (`npubuild.npu.cuts`). A group fits when some slicing —
N first, then H (backward-H, overlap ≤ h/2), and for a lone layer whose weights are too big, C —
gives buffers the allocator can place in ``chip.lmem_bytes_per_lane``. A convolution with more
output channels than the chip computes in one step (``Conv``'s ``max_channels``) runs alone,
sliced along C into pieces within that limit, as an NPU compiler splits it. The slicing search takes
the smallest N, then bisects H between 2 and the largest count the overlap rule allows (fit is
close to monotone in H), then tries a few more H counts if fragmentation defeats the allocator.

A layer that does not fit even alone is an error naming it and the bytes it needs, or with
``on_no_fit="cpu"`` becomes a `CpuLayer` that breaks the groups around it; a fully connected
layer (``fc``), a split along H or a channel permutation (``permute``: a row of every channel
more than a lane holds) that does not fit alone runs whole from GMEM between groups
(`whole_step`: the NPU computes the first, the DMA engine moves the others).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Callable, Union

from npubuild.errors import BuildError
from npubuild.npu.buffers import Buffer, Schedule, group_buffers, schedule
from npubuild.npu.cuts import refine
from npubuild.npu.layers import Group, LayerGraph, LayerSpec
from npubuild.npu.lmem import LmemOverflow, Placement, allocate, peak_live_bytes
from npubuild.npu.tiling import (GroupTiling, SliceSizes, Slicing, TilingRejected, WindowWalks,
                                 slice_sizes, tile_group, tiling_sizes)
from npubuild.targets.model import Chip

EXTRA_H_TRIES = 8
WINDOWS_UP_TO = 16  # H counts judged by walking their windows (more: all parts at once, numpy)
CONV_FAMILIES = frozenset({"conv", "dwconv"})  # tiler op families lowered from ONNX Conv


@dataclass(frozen=True)
class GroupPlan:
    """A group that fits: its tiling, buffers, schedule and LMEM placement."""

    tiling: GroupTiling
    buffers: tuple[Buffer, ...]
    schedule: Schedule
    placement: Placement
    device: str = field(default="npu", init=False)

    @property
    def group(self) -> Group:
        return self.tiling.group

    @property
    def slicing(self) -> Slicing:
        return self.tiling.slicing

    @cached_property
    def _by_name(self) -> dict[str, Buffer]:
        return {b.name: b for b in self.buffers}

    def buffer(self, name: str) -> Buffer:
        """The buffer of a tensor, or of ``<layer>/weight`` / ``<layer>/scratch``."""
        return self._by_name[name]

    def address(self, name: str) -> int:
        return self.placement.addresses[self.buffer(name).id]


@dataclass(frozen=True)
class CpuLayer:
    """A layer left to the CPU because it does not fit LMEM even alone."""

    layer: LayerSpec
    reason: str
    device: str = field(default="cpu", init=False)


@dataclass(frozen=True)
class NoFit:
    """Why a group does not fit: the smallest per-lane need seen and at which slicing."""

    reason: str
    need: int
    slicing: Slicing | None


GroupItem = Union[GroupPlan, CpuLayer]


@dataclass(frozen=True)
class LayerGroups:
    """The groups (and CPU layers) of a layer graph, in execution order."""

    graph: LayerGraph
    chip: Chip
    grouped: bool
    items: tuple[GroupItem, ...]

    @property
    def npu_groups(self) -> list[GroupPlan]:
        return [g for g in self.items if isinstance(g, GroupPlan)]

    @property
    def cpu_layers(self) -> list[CpuLayer]:
        return [g for g in self.items if isinstance(g, CpuLayer)]


class GroupFits:
    """`fit_group`'s answers for one chip, remembered by what they depend on: where the group
    starts, its layers (each `LayerSpec` by content), and the tensors it loads and stores.

    A plan asks again for groups it already fitted (the cut search), and the precision search
    plans one graph once per precision choice it prices, each choice changing a few tensors'
    widths: most of its groups are the same groups. One instance across those plans (compile
    makes a fresh one per plan: a remembered answer is the answer `fit_group` gives).

    At most ``keep`` answers are kept, the least recently asked dropped first: a searched
    quantize asks for tens of thousands of groups (iris landmark: 48,568, 9 KB each), and
    an answer asked again after it was dropped is computed again, the same answer.
    `computed` counts each question once however often it was computed, so what the
    precision search charges its clock for group fits does not depend on ``keep``."""

    KEEP = 4096

    def __init__(self, chip: Chip, keep: int | None = None):
        self.chip = chip
        self.keep = self.KEEP if keep is None else keep
        self._layer_ids: dict[LayerSpec, int] = {}
        self._found: OrderedDict[tuple, GroupPlan | NoFit] = OrderedDict()
        self._asked: set[tuple] = set()

    @property
    def computed(self) -> int:
        """How many distinct groups were fitted so far (each counted once)."""
        return len(self._asked)

    @property
    def kept(self) -> int:
        """How many answers are held now (at most ``keep``)."""
        return len(self._found)

    def layer_ids(self, graph: LayerGraph) -> tuple[int, ...]:
        """A small number per distinct layer of ``graph`` (hashing a layer once per plan,
        not once per group that holds it)."""
        return tuple(self._layer_ids.setdefault(layer, len(self._layer_ids))
                     for layer in graph.layers)

    def fit(self, graph: LayerGraph, ids: tuple[int, ...], start: int, stop: int,
            walks: WindowWalks, explain: bool) -> GroupPlan | NoFit:
        group = graph.group(start, stop)
        key = (start, ids[start:stop], group.inputs, group.outputs, explain)
        found = self._found.get(key)
        if found is not None:
            self._found.move_to_end(key)
            return found
        found = self._found[key] = fit_group(group, self.chip, walks, explain=explain)
        self._asked.add(key)
        if len(self._found) > self.keep:
            self._found.popitem(last=False)
        return found


def plan_groups(graph: LayerGraph, chip: Chip, *, grouping: bool = True,
                on_no_fit: str = "error", max_group_layers: int = 256,
                fits: GroupFits | None = None) -> LayerGroups:
    """Groups from the tail towards the head; ``grouping=False`` gives one layer per group.

    ``on_no_fit``: ``"error"`` raises a `BuildError` for a layer that fits in no slicing,
    ``"cpu"`` leaves it to the CPU. ``max_group_layers`` bounds the search time on deep models.
    ``fits``: answers kept from earlier plans on the same chip (`GroupFits`).
    """
    if fits is None:
        fits = GroupFits(chip)
    elif fits.chip is not chip:
        raise ValueError("GroupFits holds another chip's answers")
    ids = fits.layer_ids(graph)
    walks = WindowWalks()  # one graph: each layer walked once per group end and H count

    def fit(start: int, stop: int, explain: bool = False) -> GroupPlan | NoFit:
        return fits.fit(graph, ids, start, stop, walks, explain)

    items: list[GroupItem] = []
    end = len(graph.layers)
    while end > 0:
        start = end - 1
        found = fit(start, end, explain=True)
        if isinstance(found, NoFit):
            items.append(_no_fit(graph.layers[start], found, chip, on_no_fit))
            end = start
            continue
        if grouping:
            found, start = _grow(found, start, end, max(0, end - max_group_layers), fit)
        items.append(found)
        end = start
    items.reverse()
    if grouping:
        items = refine(items, graph, lambda a, b: _fitting(fit(a, b)),
                       lambda a, b: _holds_whole_reader(a) or _holds_whole_reader(b))
    return LayerGroups(graph, chip, grouping, tuple(items))


def _holds_whole_reader(plan: GroupPlan) -> bool:
    """Whether a group holds a layer that reads its whole input (`reads_whole_input`): such
    a group is never H-sliced, so whether it fits depends on what it holds, taken to grow
    with it (the searches for such groups, hundreds of layers long, assume so)."""
    return any(map(reads_whole_input, plan.group.layers))


def _grow(found: GroupPlan, start: int, end: int, head: int,
          fit: Callable[[int, int], GroupPlan | NoFit]) -> tuple[GroupPlan, int]:
    """The group ending at ``end`` grown towards ``head`` one layer at a time while it fits,
    from ``found`` (the group from ``start``). Once it holds a layer that reads its whole
    input (`reads_whole_input`: an unrolled recurrence's steps, groups of hundreds of
    layers) it grows by doubling steps, then bisects back to the first start that fails:
    each fit costs its group's length, so one layer at a time would cost the square of it.
    The first doubling step is one layer, so a group that stops there is the same group."""
    step, whole = 1, _holds_whole_reader(found)
    while start > head:
        wider_start = max(head, start - step)
        wider = fit(wider_start, end)
        if isinstance(wider, NoFit):
            if start - wider_start == 1:
                break
            return _bisect_start(found, start, wider_start, end, fit)
        whole = whole or any(map(reads_whole_input, wider.group.layers[:start - wider_start]))
        found, start = wider, wider_start
        step = 2 * step if whole else 1
    return found, start


def _bisect_start(found: GroupPlan, fits_from: int, fails_from: int, end: int,
                  fit: Callable[[int, int], GroupPlan | NoFit]) -> tuple[GroupPlan, int]:
    """The group ending at ``end`` from the earliest start between ``fails_from`` (its group
    does not fit) and ``fits_from`` (``found`` fits), assuming fits hold up to a point."""
    while fits_from - fails_from > 1:
        mid = (fits_from + fails_from) // 2
        wider = fit(mid, end)
        if isinstance(wider, NoFit):
            fails_from = mid
        else:
            found, fits_from = wider, mid
    return found, fits_from


def _fitting(found: GroupPlan | NoFit) -> GroupPlan | None:
    return None if isinstance(found, NoFit) else found


def fits_alone(layer: LayerSpec, chip: Chip) -> str | None:
    """Why ``layer`` cannot run on ``chip``'s NPU even in a group of its own (None: it can).
    The split stage asks this of every node it would place on the NPU, so that compile never
    refuses what split placed: one answer, from the compiler's own slicing search."""
    graph = LayerGraph((layer,), tuple(dict.fromkeys(layer.inputs)), layer.outputs,
                       dict(zip(layer.inputs + layer.outputs, layer.in_shapes + layer.out_shapes)))
    found = fit_group(graph.group(0, 1), chip)
    return no_fit_message(layer, found, chip) if isinstance(found, NoFit) else None


def no_fit_message(layer: LayerSpec, why: NoFit, chip: Chip) -> str:
    at = f" at the finest slicing tried ({why.slicing})" if why.slicing else ""
    if why.slicing is None and not why.need:  # refused before any slicing was tried
        return f"layer {layer.name!r} ({layer.op}) cannot run on the NPU: {why.reason}"
    return (f"layer {layer.name!r} ({layer.op}) does not fit in LMEM even alone: it needs "
            f"{why.need} bytes per lane{at}, LMEM has {chip.lmem_bytes_per_lane} bytes per "
            f"lane ({chip.lanes} lanes × {chip.lmem_bytes_per_lane}); {why.reason}")


def _no_fit(layer: LayerSpec, why: NoFit, chip: Chip, on_no_fit: str) -> CpuLayer:
    message = no_fit_message(layer, why, chip)
    if reads_whole_input(layer) or layer.op == "permute":  # too big for LMEM: whole from GMEM,
        return CpuLayer(whole_step(layer), message)  # as before such layers joined groups
    if on_no_fit == "cpu":
        return CpuLayer(layer, message)
    raise BuildError(message, stage="compile",
                     hint="use a chip with more LMEM, or set compile.on_no_fit: cpu to run "
                          "this layer on the CPU")


def reads_whole_input(layer: LayerSpec) -> bool:
    """A fully connected layer (``fc``) or a split along H: each output row reads every input
    row (`backward_h.input_rows`), so such a layer runs in a group that is not H-sliced."""
    return layer.op == "fc" or (layer.op == "split" and layer.attr("axis") == 2)


def whole_step(layer: LayerSpec) -> LayerSpec:
    """A layer that reads its whole input (`reads_whole_input`), or a channel permutation, as a
    step between groups, as it ran before it could join one: the NPU computes a fully
    connected layer whole from GMEM, the DMA engine moves a split's parts and a permutation's
    channels (a strided copy; group breakers)."""
    executes = "npu" if layer.op == "fc" else "dma"
    return replace(layer, op="move", attrs=layer.attrs + (("executes", executes),))


def fit_group(group: Group, chip: Chip, walks: WindowWalks | None = None, *,
              explain: bool = True) -> GroupPlan | NoFit:
    """The first slicing (N, then H, then C for a lone layer) whose buffers fit LMEM;
    ``walks``: backward-H walks shared by the groups of one graph (`WindowWalks`);
    ``explain=False``: a `NoFit` without the smallest need (for a search that only asks
    whether a group fits)."""
    trials = _Trials(group, chip, walks)
    c_max, c_min = _c_max(group), _c_min(group, chip)
    if c_min > 1 and (c_max == 1 or len(group) > 1):
        wide = next(l for l in group.layers if channel_slices(l, chip) > 1)
        return NoFit(f"layer {wide.name!r} has {wide.c_out} output channels, more than the chip "
                     f"computes in one step ({channel_limit(wide, chip)}): it runs alone, "
                     f"sliced along C", 0, None)
    found = trials.search(c_min)
    if found is None and c_max > c_min:
        c = _bisect_first(c_min + 1, c_max, lambda c: trials.search(c) is not None)
        found = trials.search(c) if c is not None else None
    return found or NoFit(trials.reason, *(trials.lowest_need() if explain else (0, None)))


def channel_limit(layer: LayerSpec, chip: Chip) -> int | None:
    """The most output channels one NPU step of ``layer`` computes (``Conv``'s max_channels)."""
    spec = chip.ops.get("Conv") if layer.op in CONV_FAMILIES else None
    return spec.max_channels if spec is not None else None


def channel_slices(layer: LayerSpec, chip: Chip) -> int:
    """How many C slices ``layer`` needs at least to stay within the chip's channel limit."""
    limit = channel_limit(layer, chip)
    return -(-layer.c_out // limit) if limit else 1


def _c_min(group: Group, chip: Chip) -> int:
    return max(channel_slices(layer, chip) for layer in group.layers)


def _c_max(group: Group) -> int:
    layer = group.layers[0]
    if len(group) > 1 or not layer.c_sliceable:
        return 1
    return layer.c_out


class _Trials:
    """Tries slicings of one group and keeps the best failure for messages. A slicing of many
    H parts is judged and sized from the rows of all its parts at once (`slice_sizes`; its
    windows built only for a plan), one of a few by walking its windows (numpy's overhead
    would cost more); buffers and live bytes are measured only when a fit is asked (the
    bisection for the most H slices asks only whether the overlap rule accepts it)."""

    def __init__(self, group: Group, chip: Chip, walks: WindowWalks | None = None):
        self.group, self.chip, self.walks = group, chip, walks
        self.capacity = chip.lmem_bytes_per_lane
        self.cache: dict[Slicing, SliceSizes | None] = {}
        self.tilings: dict[Slicing, GroupTiling] = {}
        self.measured: dict[Slicing, tuple[tuple[Buffer, ...], int]] = {}
        self.reason = ""

    def search(self, c: int) -> GroupPlan | None:
        """N first (H unsliced), then bisect H with every N slice, for ``c`` C slices."""
        batch = min(self.group.shapes[t][0] for t in self.group.outputs)
        height = min(self.group.shapes[t][2] for t in self.group.outputs)
        for n in range(1, batch + 1):
            if (plan := self.place(Slicing(n, 1, c))) is not None:
                return plan
        h_max = _bisect_last(1, height, lambda h: self.tiled(Slicing(batch, h, c)) is not None)
        if h_max < 2:
            return None
        h_fit = _bisect_first(2, h_max, lambda h: self.fits(Slicing(batch, h, c)))
        if h_fit is None:
            return None
        for h in range(h_fit, min(h_max, h_fit + EXTRA_H_TRIES) + 1):
            if (plan := self.place(Slicing(batch, h, c))) is not None:
                return plan
        return None

    def tiled(self, slicing: Slicing) -> SliceSizes | None:
        if slicing not in self.cache:
            try:
                if slicing.h <= WINDOWS_UP_TO:  # a few windows: walked, kept for the plan
                    self.tilings[slicing] = tile_group(self.group, slicing, walks=self.walks)
                    self.cache[slicing] = tiling_sizes(self.tilings[slicing])
                else:
                    self.cache[slicing] = slice_sizes(self.group, slicing)
            except TilingRejected as exc:
                self.reason = str(exc)
                self.cache[slicing] = None
        return self.cache[slicing]

    def measure(self, slicing: Slicing) -> tuple[tuple[Buffer, ...], int]:
        """The buffers of an accepted tiling and the most bytes per lane live at once."""
        if slicing not in self.measured:
            buffers = group_buffers(self.cache[slicing], self.chip.lanes)
            self.measured[slicing] = buffers, peak_live_bytes(buffers, len(self.group) + 2)
        return self.measured[slicing]

    def lowest_need(self) -> tuple[int, Slicing | None]:
        """The smallest live bytes of every tiling tried and its slicing (the first on a tie)."""
        need, at = 0, None
        for slicing, tiling in self.cache.items():
            if tiling is not None and (at is None or self.measure(slicing)[1] < need):
                need, at = self.measure(slicing)[1], slicing
        return need, at

    def fits(self, slicing: Slicing) -> bool:
        return self.tiled(slicing) is not None and self.measure(slicing)[1] <= self.capacity

    def place(self, slicing: Slicing) -> GroupPlan | None:
        if not self.fits(slicing):
            if self.tiled(slicing) is not None:
                self.reason = (f"{slicing}: {self.measure(slicing)[1]} bytes per lane live at "
                               f"once > {self.capacity}")
            return None
        buffers, _ = self.measure(slicing)
        try:
            placement = allocate(buffers, self.capacity, self.chip.bank_bytes)
        except LmemOverflow as exc:
            self.reason = f"{slicing}: {exc}"
            return None
        tiling = self.tilings.get(slicing) or tile_group(self.group, slicing, walks=self.walks)
        return GroupPlan(tiling, buffers, schedule(self.group), placement)


def _bisect_last(lo: int, hi: int, ok: Callable[[int], bool]) -> int:
    """The largest x in [lo, hi] with ok(x), assuming ok holds up to a point; lo - 1 if none."""
    if not ok(lo):
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo


def _bisect_first(lo: int, hi: int, ok: Callable[[int], bool]) -> int | None:
    """The smallest x in [lo, hi] with ok(x), assuming ok holds from a point on; None if none."""
    if lo > hi or not ok(hi):
        return None
    while lo < hi:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if ok(mid) else (mid + 1, hi)
    return lo
