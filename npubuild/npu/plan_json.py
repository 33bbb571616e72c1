"""``plan.json``: the program as plain JSON, for review and for the simulator to load.

Ranges (rows, channels, batch items) are ``[start, stop)`` lists; a resident buffer's lifetime
ends in ``null`` (infinity). Every address is bytes per lane; every ``gmem`` value an offset.
"""

from __future__ import annotations

import math
from dataclasses import asdict, is_dataclass
from pathlib import Path
from typing import Any

from npubuild.atomic import write_json
from npubuild.npu.estimate import Estimate
from npubuild.npu.layers import LayerSpec
from npubuild.npu.program import CpuStep, GroupProgram, Program

PLAN_FORMAT = "npubuild.plan/1"

LAYOUT = {
    "lmem": "per lane; activation element (n, c, r, w) of a buffer holding batch [n0, ...), "
            "channels [c0, ...) and rows [r0, r0 + R) is in lane (c - c0) % lanes at byte "
            "addr + (((n - n0) * ceil(C / lanes) + (c - c0) // lanes) * R + (r - r0)) * W + w "
            "(times act_bytes); weights: output channel o in lane (o - o0) % lanes at addr + "
            "((o - o0) // lanes) * weight_bytes / C_out; lookup tables copied to every lane",
    "gmem": "weights per layer as given; activations NCHW, act_bytes per element",
    "time": "one slice = timesteps 0..T-1 (0: loads only, k+1: layer k, T-1: stores only); "
            "slices run in order, C-major then N then H, on the same addresses",
}


def plan_dict(program: Program, estimate: Estimate | None = None) -> dict:
    chip, graph = program.chip, program.graph
    data = {
        "format": PLAN_FORMAT,
        "chip": {k: getattr(chip, k) for k in (
            "name", "lanes", "lmem_bytes_per_lane", "lmem_banks", "bank_bytes",
            "gmem_bandwidth_bytes_per_cycle", "clock_mhz", "macs_per_cycle_per_lane")},
        "layout": LAYOUT,
        "grouped": program.grouped,
        "inputs": list(graph.inputs),
        "outputs": list(graph.outputs),
        "gmem": {"size": program.gmem.size,
                 "weights": {k: {"offset": o, "bytes": b}
                             for k, (o, b) in program.gmem.weights.items()},
                 "tensors": {k: {"offset": o, "bytes": b, "shape": list(graph.shapes[k])}
                             for k, (o, b) in program.gmem.tensors.items()}},
        "layers": {layer.name: layer_dict(layer) for layer in graph.layers},
        "groups": [_group(g) if isinstance(g, GroupProgram) else _cpu(g) for g in program.groups],
    }
    if estimate is not None:
        data["estimate"] = estimate.as_dict()
    return data


def write_plan(path: str | Path, program: Program, estimate: Estimate | None = None) -> Path:
    return write_json(path, plan_dict(program, estimate))


def layer_dict(layer: LayerSpec) -> dict:
    data = _plain(asdict(layer))
    if not data["weight_key"]:  # (weights of its own: plan.json as it was)
        del data["weight_key"]
    data["attrs"] = {k: _plain(v) for k, v in layer.attrs}
    return data


def _group(group: GroupProgram) -> dict:
    plan = group.plan
    return {
        "index": group.index, "device": "npu",
        "layers": list(plan.group.names),
        "inputs": list(plan.group.inputs), "outputs": list(plan.group.outputs),
        "slicing": plan.slicing.as_dict(),
        "timesteps": plan.schedule.timesteps,
        "buffers": [{"id": b.id, "kind": b.kind, "name": b.name, "layer": b.layer,
                     "lifetime": [b.start, None if b.resident else b.end],
                     "bytes_per_lane": b.size, "addr": plan.placement.addresses[b.id]}
                    for b in plan.buffers],
        "lmem": {"peak_bytes_per_lane": plan.placement.peak,
                 "bank_crossings": plan.placement.bank_crossings,
                 "bank_spanning": plan.placement.bank_spanning},
        "slices": [{"index": s.index, "batch": list(s.batch),
                    "channels": list(s.channels) if s.channels else None, "part": s.part,
                    "steps": [_plain(asdict(step)) for step in s.steps]} for s in group.slices],
    }


def _cpu(step: CpuStep) -> dict:
    return {"index": step.index, "device": "cpu", "layer": step.layer.name, "reason": step.reason}


def _plain(value: Any) -> Any:
    """Tuples (and `Rows`) to lists, infinities to null, recursively."""
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if is_dataclass(value):
        return _plain(asdict(value))
    if isinstance(value, float) and math.isinf(value):
        return None
    return value
