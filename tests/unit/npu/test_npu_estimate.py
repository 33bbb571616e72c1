"""The estimate: cycles per timestep, GMEM traffic, fps, the baseline and the lower bound."""

from math import ceil

from npubuild.npu import (build_program, compare, estimate, gmem_lower_bound, plan_groups,
                          report_fields)
from npubuild.npu.builder import GraphBuilder
from npubuild.targets import load_chip


def test_one_conv_by_hand():
    chip = load_chip("npu-16m")
    b = GraphBuilder({"x": (1, 64, 32, 32)})
    graph = b.build([b.conv("x", 64, k=3)])
    est = estimate(build_program(plan_groups(graph, chip)))
    conv = graph.layers[0]
    act = 64 * 32 * 32
    bw, mpc = chip.gmem_bandwidth_bytes_per_cycle, chip.lanes * chip.macs_per_cycle_per_lane
    # T0 loads input and weights, T1 computes, T2 stores
    expected = ceil((act + conv.weight_bytes) / bw) + ceil(conv.macs / mpc) + ceil(act / bw)
    assert est.cycles == expected
    assert (est.gmem_read, est.gmem_write) == (act + conv.weight_bytes, act)
    assert est.gmem_bytes == gmem_lower_bound(graph)
    assert abs(est.fps - chip.clock_mhz * 1e6 / expected) < 1e-6


def test_grouping_cuts_traffic_against_the_baseline():
    b = GraphBuilder({"x": (1, 32, 64, 64)})
    y = b.conv("x", 32)
    y = b.mul(y, b.lut(y))
    graph = b.build([b.conv(y, 32)])
    result = compare(graph, load_chip("npu-16m"))
    grouped, baseline = result["grouped"], result["baseline"]
    assert grouped.gmem_bytes == result["lower_bound"] < baseline.gmem_bytes
    assert grouped.cycles < baseline.cycles
    fields = report_fields(grouped, baseline)
    assert {"cycles", "gmem_bytes", "gmem_bytes_no_grouping", "lmem_peak_bytes",
            "fps"} <= set(fields)
