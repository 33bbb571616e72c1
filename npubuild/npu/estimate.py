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

from npubuild.npu.cost import FREE_OPS, compute_cycles, constant_read_bytes
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
    weight_read: int = 0


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
    weight_read: int = 0


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
    offchip_bytes: int = 0

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
    layers = {layer.name: layer for layer in program.graph.layers}
    groups = tuple(_group_estimate(g, chip, layers, program.graph.constants)
                   for g in program.npu_groups)
    steps = tuple(_step_estimate(g, program) for g in program.groups if isinstance(g, CpuStep))
    parts = groups + steps
    cycles = sum(g.cycles for g in parts)
    peak = max((g.lmem_peak_bytes_per_lane for g in groups), default=0)
    read, write = sum(g.gmem_read for g in parts), sum(g.gmem_write for g in parts)
    weights = sum(g.weight_read for g in parts)
    return Estimate(groups, sum(g.compute_cycles for g in parts),
                    sum(g.dma_cycles for g in parts), cycles, read, write,
                    peak, peak * chip.lanes, chip.clock_mhz * 1e6 / cycles if cycles else 0.0,
                    tuple(g.layer.name for g in program.groups if g.device == "cpu"), steps,
                    offchip_bytes(chip, read + write, weights))


def offchip_bytes(chip: Chip, gmem: int, weights: int) -> int:
    """Bytes the chip moves to and from off-chip memory: GMEM's traffic when GMEM is off-chip
    (weights included unless they have their own memory), and the weights' own memory's."""
    apart = weights if chip.weights_bandwidth_bytes_per_cycle else 0
    return (gmem - apart) * chip.gmem_off_chip + apart * chip.weights_off_chip


def _group_estimate(group: GroupProgram, chip: Chip, layers: dict,
                    constants: frozenset[str]) -> GroupEstimate:
    """Per timestep the larger of compute and DMA; the weights' memory also serves the constant
    operands element-wise steps stream (`constant_read_bytes`), at its burst efficiency."""
    compute = dma = cycles = read = write = weights = 0
    elem = group.plan.group.elem_bytes
    for piece in group.slices:
        for _, steps in groupby(piece.steps, key=lambda s: s.timestep):
            steps = list(steps)
            computes = [s for s in steps if isinstance(s, Compute)]
            c = sum(_compute_step(s, layers[s.layer], elem, chip) for s in computes)
            streamed = [constant_read_bytes(layers[s.layer], _block(s, layers[s.layer]),
                                            constants, chip) for s in computes]
            loads = [s for s in steps if isinstance(s, Dma)]
            w = sum(s.bytes for s in loads if s.rows is None)
            d = dma_cycles(sum(s.bytes for s in loads) - w, w + sum(m for _, m in streamed), chip)
            compute, dma, cycles = compute + c, dma + d, cycles + max(c, d)
            constants_read = sum(r for r, _ in streamed)  # read as weights are
            read += sum(s.bytes for s in loads if s.op == "load") + constants_read
            write += sum(s.bytes for s in loads if s.op == "store")
            weights += w + constants_read
    plan = group.plan
    return GroupEstimate(group.index, len(plan.group), plan.slicing.as_dict(), compute, dma, cycles,
                         read, write, plan.placement.peak, weights)


def _compute_step(step: Compute, layer, elem: dict, chip: Chip) -> int:
    """The MAC array's cycles for the step, or the fast port's when its operands take longer
    to read and write."""
    cycles = compute_cycles(layer, _block(step, layer), step.macs, chip)
    if chip.lmem_bandwidth_bytes_per_cycle and layer.op not in FREE_OPS:
        moved = sum(op.batch.size * op.channels.size * op.rows.size * layer_w * elem[op.tensor]
                    for op, layer_w in [*((o, s[3]) for o, s in zip(step.inputs, layer.in_shapes)),
                                        *((o, s[3]) for o, s in zip(step.outputs,
                                                                    layer.out_shapes))])
        cycles = max(cycles, ceil(moved / chip.lmem_bandwidth_bytes_per_cycle))
    return cycles


def _block(step: Compute, layer) -> tuple[int, int, int, int]:
    """(batch, channels, rows, W) of the output the step computes."""
    out = step.outputs[0]
    return out.batch.size, out.channels.size, out.rows.size, layer.out_shapes[0][3]


def dma_cycles(activations: int, weights: float, chip: Chip) -> int:
    """DMA cycles of a timestep: through GMEM's port, weights through their own when the chip
    has one (in parallel)."""
    if chip.weights_bandwidth_bytes_per_cycle:
        return max(ceil(activations / chip.gmem_bandwidth_bytes_per_cycle),
                   ceil(weights / chip.weights_bandwidth_bytes_per_cycle))
    return ceil((activations + weights) / chip.gmem_bandwidth_bytes_per_cycle)


def _step_estimate(step: CpuStep, program: Program) -> StepEstimate:
    """Inputs and weights read from GMEM, outputs written (nothing for an alias); an NPU step's
    MACs on the NPU, a CPU step's time left to the CPU measurement."""
    layer, gmem, chip = step.layer, program.gmem, program.chip
    executes = layer.attr("executes", "cpu")
    if all(gmem.aliases.get(t) in layer.inputs for t in layer.outputs):
        read = write = 0
    else:
        read = sum(gmem.tensors[t][1] for t in dict.fromkeys(layer.inputs)) + layer.weight_bytes
        write = sum(gmem.tensors[t][1] for t in layer.outputs)
    weights = layer.weight_bytes if read else 0
    compute, streamed, moved = 0, 0, 0.0
    if executes == "npu":
        compute = compute_cycles(layer, layer.out_shapes[0], layer.macs, chip)
        streamed, moved = constant_read_bytes(layer, layer.out_shapes[0], program.graph.constants,
                                              chip)
    dma = dma_cycles(read + write - weights, weights + moved, chip)
    read, weights = read + streamed, weights + streamed
    return StepEstimate(step.index, layer.name, executes, compute, dma, max(compute, dma), read,
                        write, weights)


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
