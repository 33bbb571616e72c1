"""Cut a placed graph into the fewest convex NPU/CPU segments, in topological order.

Segments alternate between the devices. Every node gets the earliest level it can have: a
level of its own device's parity, at least its producers' levels, and past them when a producer
is on the other device. Along any path levels never decrease and a device change raises them,
so a path that leaves a segment can never come back to it: every segment is convex and the
segments, sorted by level, are topologically ordered (TVM's MergeCompilerRegions problem
cannot arise). A path with k device changes needs k + 1 segments in any valid cut and the
earliest levels meet that bound, so trying both starting devices gives the fewest segments.
One pass over the edges per try: linear time.
"""

from __future__ import annotations

from dataclasses import dataclass, field

NPU, CPU = "npu", "cpu"


@dataclass
class Segment:
    index: int
    device: str
    nodes: list[int] = field(default_factory=list)  # topological order


def levels(preds: list[list[int]], on_npu: list[bool], npu_even: bool) -> list[int]:
    """The earliest alternating level of every node (preds index a topological order)."""
    level = [0] * len(preds)
    for i, ps in enumerate(preds):
        mine = on_npu[i]
        low = 0
        for p in ps:
            v = level[p] + (on_npu[p] != mine)
            if v > low:
                low = v
        if (low & 1) != (mine != npu_even):
            low += 1
        level[i] = low
    return level


def partition(preds: list[list[int]], on_npu: list[bool]) -> list[Segment]:
    """Segments of a placed graph, fewest first; ties start with an NPU segment."""
    best: list[int] | None = None
    for npu_even in (True, False):
        level = levels(preds, on_npu, npu_even)
        if best is None or len(set(level)) < len(set(best)):
            best = level
    index = {lvl: k for k, lvl in enumerate(sorted(set(best or [])))}
    segments = [Segment(k, "") for k in range(len(index))]
    for node, lvl in enumerate(best or []):
        seg = segments[index[lvl]]
        seg.nodes.append(node)
        seg.device = NPU if on_npu[node] else CPU
    return segments


def segment_of(segments: list[Segment], size: int) -> list[int]:
    out = [-1] * size
    for seg in segments:
        for node in seg.nodes:
            out[node] = seg.index
    return out


def npu_islands(preds: list[list[int]], on_npu: list[bool], seg_of: list[int]) -> list[list[int]]:
    """Connected groups of NPU nodes within one segment (union-find over their edges)."""
    parent = list(range(len(preds)))

    def root(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for i, ps in enumerate(preds):
        if on_npu[i]:
            for p in ps:
                if on_npu[p] and seg_of[p] == seg_of[i]:
                    parent[root(p)] = root(i)
    groups: dict[int, list[int]] = {}
    for i in range(len(preds)):
        if on_npu[i]:
            groups.setdefault(root(i), []).append(i)
    return list(groups.values())
