"""Where two neighbouring groups meet: move the cut to where the least traffic crosses it.

The tail-to-head search (`layer_group.plan_groups`) grows each group as far towards the head as
LMEM allows, so the cut in front of it falls wherever the fit ran out — often at the widest
tensor of the network (YOLOv8n-640: after its first conv, 1.6 MB stored and loaded back, where
a cut two layers later crosses half of that). For each pair of neighbouring groups this finds
how far the earlier group can reach into the later one and still fit (H-sliced if it must be),
tries the cuts up to there that cross the fewest bytes, and takes the one whose two groups move
the fewest GMEM bytes: their inputs' rows per slice (halos included), their stores and their
weights — what the estimate will count.
"""

from __future__ import annotations

from typing import Callable

from npubuild.npu.layers import LayerGraph
from npubuild.npu.tiling import GroupTiling

CANDIDATES = 8  # the narrowest cuts tried per pair of groups
PASSES = 3


def group_traffic(tiling: GroupTiling) -> int:
    """GMEM bytes a tiled group moves: every slice's input rows (halos included) and stores,
    and its weights once (resident across N/H slices, one part per C slice; layers with the
    same weights load them once)."""
    group = tiling.group
    total = sum({layer.weights_id: layer.weight_bytes for layer in group.layers}.values())
    for piece in tiling.slices:
        for t in group.inputs:
            total += _rows_bytes(tiling, piece, t, piece.window.rows[t].size)
        for t in group.outputs:
            total += _rows_bytes(tiling, piece, t, piece.window.store[t].size)
    return total


def _rows_bytes(tiling: GroupTiling, piece, tensor: str, rows: int) -> int:
    _, _, _, w = tiling.group.shapes[tensor]
    return (piece.batch.size * tiling.channels(tensor, piece).size * rows * w
            * tiling.group.elem_bytes[tensor])


def cut_widths(graph: LayerGraph, start: int, stop: int) -> dict[int, int]:
    """Bytes of the tensors a cut before layer ``k`` would cross, for ``start < k < stop``."""
    made_at = {t: i for i, layer in enumerate(graph.layers) for t in layer.outputs}
    last_read = {}
    for i, layer in enumerate(graph.layers[start:stop], start):
        for t in layer.inputs:
            last_read[t] = i
    # a tensor crosses the cuts after it is made and up to its last read: add its bytes where
    # that range starts and take them off past its end (one sweep, not one scan per cut)
    change = [0] * (stop + 1)
    for t, i in last_read.items():
        first = max(made_at.get(t, -1) + 1, start + 1)
        if first <= i:
            change[first] += graph.tensor_bytes(t)
            change[i + 1] -= graph.tensor_bytes(t)
    widths, width = {}, 0
    for k in range(start + 1, stop):
        width += change[k]
        widths[k] = width
    return widths


def refine(items: list, graph: LayerGraph, fit: Callable,
           monotone: Callable = lambda a, b: False) -> list:
    """``items`` (groups in order; anything else stays put) with each cut between two
    neighbouring groups moved to where their traffic is least. ``fit(start, stop)`` returns
    the fitting plan of ``graph.group(start, stop)`` or None; ``monotone(a, b)``: whether the
    earlier of two neighbouring groups may be taken to fit up to a point as it reaches into
    the later (then its reach is found only at the cuts tried, `_lazy_candidates`)."""
    for _ in range(PASSES):
        changed = False
        for k in range(len(items) - 1):
            better = _better_cut(items[k], items[k + 1], graph, fit, monotone)
            if better is not None:
                items[k], items[k + 1] = better
                changed = True
        if not changed:
            break
    return items


def _better_cut(a, b, graph: LayerGraph, fit: Callable, monotone: Callable):
    """Move the cut later (the tail-to-head search left the later group as long as it fits):
    up to where the earlier group still fits, to the narrowest cuts first."""
    if not (hasattr(a, "tiling") and hasattr(b, "tiling")):
        return None
    start, cut = a.group.start, b.group.start
    stop = cut + len(b.group)
    if start + len(a.group) != cut or stop - cut < 2:
        return None
    widths = cut_widths(graph, start, stop)
    narrower = [k for k in range(cut + 1, stop) if widths[k] < widths[cut]]
    if not narrower:  # no cut to try: no need to know how far the earlier group reaches
        return None
    narrower.sort(key=lambda k: (widths[k], k))
    if monotone(a, b):
        candidates = _lazy_candidates(narrower, lambda k: fit(start, k))
    else:
        reach = _last(cut + 1, stop - 1, lambda k: fit(start, k) is not None)
        tried = [k for k in narrower if k <= reach][:CANDIDATES]  # fitted only these
        candidates = [(k, fit(start, k)) for k in tried]
    best, best_cost = None, group_traffic(a.tiling) + group_traffic(b.tiling)
    for k, first in candidates:
        second = fit(k, stop)
        if first is None or second is None:
            continue
        cost = group_traffic(first.tiling) + group_traffic(second.tiling)
        if cost < best_cost:
            best, best_cost = (first, second), cost
    return best


def _lazy_candidates(cuts: list[int], fit_to: Callable) -> list:
    """The first `CANDIDATES` of ``cuts`` (narrowest first) up to which the earlier group
    fits, with its plans, when its fits hold up to a point: a cut past one that failed fails
    unasked. The cuts `_last`'s bisection would admit, without its fits of the longest
    groups (an unrolled recurrence's groups reach hundreds of layers into the next)."""
    found, fails_at = [], None
    for k in cuts:
        if len(found) == CANDIDATES:
            break
        if fails_at is not None and k >= fails_at:
            continue
        first = fit_to(k)
        if first is None:
            fails_at = k
        else:
            found.append((k, first))
    return found


def _last(lo: int, hi: int, ok: Callable[[int], bool]) -> int:
    """The largest k in [lo, hi] with ok(k), assuming ok holds up to a point; lo - 1 if none."""
    if lo > hi or not ok(lo):
        return lo - 1
    while lo < hi:
        mid = (lo + hi + 1) // 2
        lo, hi = (mid, hi) if ok(mid) else (lo, mid - 1)
    return lo
