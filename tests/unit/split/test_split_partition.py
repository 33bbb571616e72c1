"""The cut itself, on abstract DAGs: convex segments, topological order, fewest segments."""

from __future__ import annotations

import itertools

from npubuild.split.partition import npu_islands, partition, segment_of

N, C = True, False


def check_valid(preds, on_npu, segments):
    seg = segment_of(segments, len(preds))
    assert sorted(i for s in segments for i in s.nodes) == list(range(len(preds)))
    for s in segments:
        assert {on_npu[i] for i in s.nodes} == {s.device == "npu"}
    for i, ps in enumerate(preds):
        for p in ps:  # edges never go back: segments are topologically ordered and convex
            assert seg[p] <= seg[i]
            assert seg[p] < seg[i] or on_npu[p] == on_npu[i]
    for a, b in zip(segments, segments[1:]):
        assert a.device != b.device


def brute_force_fewest(preds, on_npu) -> int:
    """The fewest segments of any valid cut, by trying every alternating level assignment."""
    n = len(preds)
    best = n
    for start_npu, k in itertools.product((True, False), range(1, n + 1)):
        if k >= best:
            continue
        choices = [[lvl for lvl in range(k) if ((lvl % 2 == 0) == start_npu) == on_npu[i]]
                   for i in range(n)]
        for levels in itertools.product(*choices):
            if all(levels[p] <= levels[i] for i, ps in enumerate(preds) for p in ps):
                best = min(best, len(set(levels)))
    return best


def test_a_cpu_detour_splits_an_npu_region_in_two():
    # a(N) → b(C) → d(N) and a → d: d cannot join a's segment (the path through b would
    # leave the segment and come back): TVM's MergeCompilerRegions case.
    preds = [[], [0], [0, 1]]
    segments = partition(preds, [N, C, N])
    check_valid(preds, [N, C, N], segments)
    assert [s.nodes for s in segments] == [[0], [1], [2]]


def test_independent_branches_share_segments():
    # chain A: 0(N) → 1(C); chain B: 2(C) → 3(N): three segments, not four
    preds = [[], [0], [], [2]]
    on_npu = [N, C, C, N]
    segments = partition(preds, on_npu)
    check_valid(preds, on_npu, segments)
    assert len(segments) == 3 == brute_force_fewest(preds, on_npu)


def test_all_supported_is_one_npu_segment():
    preds = [[], [0], [0], [1, 2]]
    segments = partition(preds, [N] * 4)
    assert [(s.device, s.nodes) for s in segments] == [("npu", [0, 1, 2, 3])]


def test_random_small_graphs_get_the_fewest_segments():
    import random

    rnd = random.Random(7)
    for _ in range(300):
        n = rnd.randint(1, 7)
        preds = [sorted(rnd.sample(range(i), rnd.randint(0, min(i, 2)))) for i in range(n)]
        on_npu = [rnd.random() < 0.6 for _ in range(n)]
        segments = partition(preds, on_npu)
        check_valid(preds, on_npu, segments)
        assert len(segments) == brute_force_fewest(preds, on_npu), (preds, on_npu)


def test_islands_are_connected_npu_groups_within_a_segment():
    # 0(N) → 1(N); 2(N) alone; 3(C) → 4(N)
    preds = [[], [0], [], [], [3]]
    on_npu = [N, N, N, C, N]
    segments = partition(preds, on_npu)
    islands = sorted(sorted(i) for i in npu_islands(preds, on_npu, segment_of(segments, 5)))
    assert islands == [[0, 1], [2], [4]]


def test_partition_is_linear_on_a_long_alternating_chain():
    import time

    n = 20000
    preds = [[i - 1] if i else [] for i in range(n)]
    on_npu = [(i // 10) % 2 == 0 for i in range(n)]
    start = time.perf_counter()
    segments = partition(preds, on_npu)
    assert time.perf_counter() - start < 2.0
    assert len(segments) == n // 10
