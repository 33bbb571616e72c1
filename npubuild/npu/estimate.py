"""The performance estimate a program implies: cycles, fps, GMEM traffic, LMEM peak.

Per timestep of every slice, compute takes ``MACs ÷ (lanes × macs_per_cycle_per_lane)`` cycles
and DMA ``bytes ÷ gmem_bandwidth_bytes_per_cycle``; they overlap, so the timestep costs the
larger. A group costs the sum over its slices' timesteps (slices do not overlap each other).
A step between groups (a group breaker) reads its inputs and weights from GMEM and writes its
outputs: an NPU step also computes (its MACs, at the same rate), a DMA step only moves bytes, a
CPU step's own time is measured apart (below); a reshape moves nothing (its output is an alias
of its input in GMEM). The model costs the sum over groups and steps; fps is the chip clock
over that. The baseline compiles the same layers with one layer per group; the lower bound
moves each weight, model input and output once.

A split model also runs float work on the host CPU (its CPU submodels, float layers kept inside
NPU graphs): `with_cpu` adds those seconds (measured by `npubuild.runtime.cpu_time`) to the NPU
time, with no overlap, so the deployment's fps counts both.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from itertools import groupby
from math import ceil

from npubuild.npu.layer_group import plan_groups
from npubuild.npu.layers import LayerGraph
from npubuild.npu.program import (Compute, CpuStep, Dma, GroupProgram, Program, build_program,
                                  tensor_elem_bytes)
from npubuild.targets.model import Chip


@dataclass(frozen=True)
class GroupEstimate:
    index: int
    layers: int
    slicing: dict
    compute_cycles: int
    dma_cycles: int
    cycles: int
    gmem_read: int
    gmem_write: int
    lmem_peak_bytes_per_lane: int


@dataclass(frozen=True)
class StepEstimate:
    """A whole-tensor step between groups."""

    index: int
    layer: str
    executes: str
    compute_cycles: int
    dma_cycles: int
    cycles: int
    gmem_read: int
    gmem_write: int


@dataclass(frozen=True)
class Estimate:
    groups: tuple[GroupEstimate, ...]
    compute_cycles: int
    dma_cycles: int
    cycles: int
    gmem_read: int
    gmem_write: int
    lmem_peak_bytes_per_lane: int
    lmem_peak_bytes: int
    fps: float
    cpu_layers: tuple[str, ...]
    steps: tuple[StepEstimate, ...] = ()

    @property
    def gmem_bytes(self) -> int:
        return self.gmem_read + self.gmem_write

    @property
    def between_groups_gmem_bytes(self) -> int:
        return sum(s.gmem_read + s.gmem_write for s in self.steps)

    @property
    def between_groups_cycles(self) -> int:
        return sum(s.cycles for s in self.steps)

    def as_dict(self, groups: bool = True) -> dict:
        data = asdict(self)
        data["gmem_bytes"] = self.gmem_bytes
        data["between_groups_gmem_bytes"] = self.between_groups_gmem_bytes
        data["between_groups_cycles"] = self.between_groups_cycles
        if not groups:
            del data["groups"], data["steps"]
        return data


def estimate(program: Program) -> Estimate:
    chip = program.chip
    groups = tuple(_group_estimate(g, chip) for g in program.npu_groups)
    steps = tuple(_step_estimate(g, program) for g in program.groups if isinstance(g, CpuStep))
    parts = groups + steps
    cycles = sum(g.cycles for g in parts)
    peak = max((g.lmem_peak_bytes_per_lane for g in groups), default=0)
    return Estimate(groups, sum(g.compute_cycles for g in parts),
                    sum(g.dma_cycles for g in parts), cycles,
                    sum(g.gmem_read for g in parts), sum(g.gmem_write for g in parts),
                    peak, peak * chip.lanes, chip.clock_mhz * 1e6 / cycles if cycles else 0.0,
                    tuple(g.layer.name for g in program.groups if g.device == "cpu"), steps)


def _group_estimate(group: GroupProgram, chip: Chip) -> GroupEstimate:
    compute = dma = cycles = read = write = 0
    for piece in group.slices:
        for _, steps in groupby(piece.steps, key=lambda s: s.timestep):
            steps = list(steps)
            macs = sum(s.macs for s in steps if isinstance(s, Compute))
            moved = sum(s.bytes for s in steps if isinstance(s, Dma))
            c, d = compute_cycles(macs, chip), ceil(moved / chip.gmem_bandwidth_bytes_per_cycle)
            compute, dma, cycles = compute + c, dma + d, cycles + max(c, d)
            read += sum(s.bytes for s in steps if isinstance(s, Dma) and s.op == "load")
            write += sum(s.bytes for s in steps if isinstance(s, Dma) and s.op == "store")
    plan = group.plan
    return GroupEstimate(group.index, len(plan.group), plan.slicing.as_dict(), compute, dma, cycles,
                         read, write, plan.placement.peak)


def _step_estimate(step: CpuStep, program: Program) -> StepEstimate:
    """Inputs and weights read from GMEM, outputs written (nothing for an alias); an NPU step's
    MACs on the NPU, a CPU step's time left to the CPU measurement."""
    layer, gmem = step.layer, program.gmem
    executes = layer.attr("executes", "cpu")
    if all(gmem.aliases.get(t) in layer.inputs for t in layer.outputs):
        read = write = 0
    else:
        read = sum(gmem.tensors[t][1] for t in dict.fromkeys(layer.inputs)) + layer.weight_bytes
        write = sum(gmem.tensors[t][1] for t in layer.outputs)
    compute = compute_cycles(layer.macs, program.chip) if executes == "npu" else 0
    dma = ceil((read + write) / program.chip.gmem_bandwidth_bytes_per_cycle)
    return StepEstimate(step.index, layer.name, executes, compute, dma, max(compute, dma), read,
                        write)


def compute_cycles(macs: int, chip: Chip) -> int:
    """Cycles of ``macs`` multiply-accumulates on the whole MAC array."""
    return ceil(macs / (chip.lanes * chip.macs_per_cycle_per_lane))


def gmem_lower_bound(graph: LayerGraph) -> int:
    """Each weight once, each model input once, each model output once (at the width GMEM
    holds them: a float output of a CPU layer is 4 bytes an element)."""
    return (graph.weight_bytes
            + sum(graph.tensor_bytes(t, tensor_elem_bytes(graph, t)) for t in graph.inputs)
            + sum(graph.tensor_bytes(t, tensor_elem_bytes(graph, t)) for t in graph.outputs))


def compare(graph: LayerGraph, chip: Chip, *, on_no_fit: str = "error") -> dict:
    """Grouped vs one-layer-per-group estimates and the GMEM lower bound, as report data."""
    grouped = estimate(build_program(plan_groups(graph, chip, on_no_fit=on_no_fit)))
    baseline = estimate(build_program(plan_groups(graph, chip, grouping=False,
                                                  on_no_fit=on_no_fit)))
    return {"grouped": grouped, "baseline": baseline, "lower_bound": gmem_lower_bound(graph)}


def report_fields(grouped: Estimate, baseline: Estimate) -> dict:
    """The ``estimate`` section of ``report.json`` (ARCHITECTURE §6)."""
    return {"cycles": grouped.cycles, "gmem_bytes": grouped.gmem_bytes,
            "gmem_bytes_no_grouping": baseline.gmem_bytes,
            "lmem_peak_bytes": grouped.lmem_peak_bytes, "fps": round(grouped.fps, 2),
            "groups": len(grouped.groups), "cycles_no_grouping": baseline.cycles,
            "fps_no_grouping": round(baseline.fps, 2)}


def with_cpu(cycles: int, cycles_no_grouping: int, clock_hz: float, cpu_parts: dict,
             method: str) -> dict:
    """The deployment's fps (NPU cycles plus the CPU parts' seconds, run one after the other),
    the NPU-only fps, and the CPU parts themselves, as ``report.json`` estimate fields. A part
    not measured (``seconds`` None, ``not_measured`` says why) is left out of the sum and
    listed in ``cpu.not_measured``."""
    cpu = sum(p["seconds"] for p in cpu_parts.values() if p.get("seconds") is not None)
    missing = {name: p.get("not_measured", "") for name, p in cpu_parts.items()
               if p.get("seconds") is None}

    def fps(npu_cycles: int) -> float:
        total = npu_cycles / clock_hz + cpu
        return round(1.0 / total, 2) if total > 0 else 0.0

    return {"fps": fps(cycles), "fps_no_grouping": fps(cycles_no_grouping),
            "npu_fps": round(clock_hz / cycles, 2) if cycles else 0.0,
            "npu_seconds": round(cycles / clock_hz, 9), "cpu_seconds": round(cpu, 6),
            "cpu": {"method": method, "parts": cpu_parts,
                    **({"not_measured": missing} if missing else {})}}
