"""Stage ``compile``: every quantized NPU graph → layer groups, LMEM plan, program, proof.

Reads ``quantize/graph_<i>.qgraph.json`` (+ ``.npz``; ``calibration.json`` for the ranges of the
graph inputs, ``graph_<i>.sample.npz`` — one real sample's inputs — when quantize saved one),
the chip and the recipe's ``compile`` section. For every graph:

    layers_from_qgraph → plan_qgraph (LayerGroup; compile.layer_group, compile.on_no_fit)
      → build_program → estimate (and the one-layer-per-group baseline)

and writes into ``compile/``:

- ``graph_<i>/plan.json``: the groups, slices, buffers, LMEM addresses and DMA/compute steps
  (``npubuild.npu.plan_json``; breakers carry ``kind``/``executes``) and the estimates;
- ``graph_<i>/program.npz``: the program the simulator executes (`npubuild.npu.program_file`);
- ``graph_<i>/lmem_group_<k>.svg``: the LMEM allocation timeline of every group;
- ``graph_ir_<i>/``: the IR dump (seed 004; `npubuild.npu.ir_dump`), validated on write.

The estimate in ``report.json`` adds the CPU part of the deployment — the split's CPU submodels
(``split/graph_infos.json``) and float layers inside NPU graphs — timed with ONNX Runtime on the
build machine (`npubuild.runtime.cpu_time`): ``fps`` is the deployment's, ``npu_fps`` the NPU's.

Proves: the simulator, executing ``program.npz`` on a real LMEM array, reproduces the integer
reference (``run_reference``) bit for bit on every tensor that crosses GMEM — every NPU graph
output and every group-boundary tensor — for ``compile.proof_samples`` seeded random inputs
(the full int8 range, then values within the calibrated input ranges) and the real sample if
there is one. Otherwise the stage fails naming the graph, the group, the slice and the tensor.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np

from npubuild.atomic import write_json
from npubuild.errors import BuildError, working_on
from npubuild.metrics import bit_identical, differing
from npubuild.npu import build_program, conflicts, estimate, gmem_lower_bound, write_timelines
from npubuild.npu.estimate import Estimate, with_cpu
from npubuild.npu.from_qgraph import QLayers, layers_from_qgraph, plan_qgraph
from npubuild.npu.ir_dump import dump_ir
from npubuild.npu.program import Program
from npubuild.npu.program_file import ProgramFile, load_program, program_document, save_program
from npubuild.quant import schemes
from npubuild.quant.qgraph import QGraph
from npubuild.quant.reference import quantize_inputs, run_reference
from npubuild.runtime import cpu_time
from npubuild.runtime.simulator import Simulator, SimulatorFault
from npubuild.stages import StageContext

STAGE = "compile"
SEED = 0


def run(ctx: StageContext) -> dict:
    """Compile through the chip's backend (`npubuild.backends`): this module's own compiler
    for the simulated chips, the vendor's toolchain for real ones."""
    from npubuild import backends

    if ctx.chip is None:
        raise BuildError("no target chip was given", stage=STAGE)
    return backends.of(ctx.chip).compile(ctx)


def compile_simulated(ctx: StageContext) -> dict:
    """The simulated chips: layer groups, LMEM plan, program and the simulator's proof."""
    qdir = Path(ctx.upstream["quantize"])
    paths = sorted(qdir.glob("graph_*.qgraph.json"), key=_graph_index)
    if not paths:
        return no_npu_report(ctx)
    results = []
    for path in paths:
        with working_on(graph=path.name.split(".")[0]):
            results.append(compile_graph(QGraph.load(path), ctx, qdir))
    return report(results, ctx)


def _graph_index(path: Path) -> int:
    return int(path.name.split(".")[0].split("_")[1])


# ---- one graph -------------------------------------------------------------------------------

@dataclass
class Compiled:
    name: str
    layers: QLayers
    program: Program
    grouped: Estimate
    baseline: Estimate
    proof: dict
    seconds: dict


def compile_graph(qgraph: QGraph, ctx: StageContext, qdir: Path) -> Compiled:
    spec, chip, times = ctx.recipe.compile, ctx.chip, {}
    start = time.perf_counter()
    layers = layers_from_qgraph(qgraph)
    program = build_program(plan_qgraph(layers, chip, grouping=spec.layer_group,
                                        on_no_fit=spec.on_no_fit))
    _check_allocations(program, qgraph.name)
    grouped = estimate(program)
    baseline = grouped if not spec.layer_group else estimate(build_program(
        plan_qgraph(layers, chip, grouping=False, on_no_fit=spec.on_no_fit)))
    times["plan"] = time.perf_counter() - start
    out = ctx.out / qgraph.name
    doc, arrays = program_document(program, layers, grouped)
    doc["estimate_no_grouping"] = baseline.as_dict(groups=False)
    doc["gmem_lower_bound"] = gmem_lower_bound(layers.graph)
    write_json(out / "plan.json", {k: v for k, v in doc.items() if k != "kernels"})
    program_path = save_program(out / "program.npz", doc, arrays)
    write_timelines(program, out)
    times["write"] = time.perf_counter() - start - times["plan"]
    samples = list(proof_inputs(qgraph, qdir, spec.proof_samples))
    proof = prove(load_program(program_path), qgraph,
                  ctx.progress(samples, total=len(samples),
                               description=f"compile: {qgraph.name} simulator proof, samples"))
    times["simulator"] = proof["seconds"]
    label, inputs = samples[-1]  # the real sample if there is one, else calibrated-range data
    values = run_reference(qgraph, inputs) if spec.ir_feature_maps else None
    dump_ir(qgraph, ctx.out / f"graph_ir_{qgraph.name.removeprefix('graph_')}", values, label)
    times["total"] = time.perf_counter() - start
    return Compiled(qgraph.name, layers, program, grouped, baseline, proof, times)


def _check_allocations(program: Program, name: str) -> None:
    """The allocator's invariant, checked once more on what the program uses."""
    for group in program.npu_groups:
        plan = group.plan
        problems = conflicts(plan.buffers, plan.placement, program.chip.lmem_bytes_per_lane)
        if problems:
            raise BuildError(f"{name} group {group.index}: {problems[0]}", stage=STAGE)


# ---- the proof -------------------------------------------------------------------------------

def proof_inputs(qgraph: QGraph, qdir: Path, count: int) -> Iterator[tuple[str, dict]]:
    """Seeded random integer inputs: the full range first, then within the calibrated ranges;
    last, one real sample when quantize saved ``graph_<i>.sample.npz``."""
    ranges = _input_ranges(qdir, qgraph.name)
    rng = np.random.default_rng(SEED)
    for k in range(count):
        calibrated = k % 2 == 1 and ranges
        yield (f"seeded random inputs #{k} ({'calibrated range' if calibrated else 'full range'})",
               {t: _random_input(qgraph, t, rng, ranges.get(t) if calibrated else None)
                for t in qgraph.inputs})
    sample = qdir / f"{qgraph.name}.sample.npz"
    if sample.is_file():
        with np.load(sample, allow_pickle=False) as npz:
            feeds = {t: npz[t] for t in qgraph.inputs}
        floats = {t: v for t, v in feeds.items() if v.dtype.kind == "f"}
        ints = quantize_inputs(qgraph, floats) if floats else {}
        yield (f"real sample ({sample.name})", {t: ints.get(t, feeds[t]) for t in qgraph.inputs})


def _input_ranges(qdir: Path, name: str) -> dict[str, tuple[float, float]]:
    path = qdir / "calibration.json"
    if not path.is_file():
        return {}
    tensors = json.loads(path.read_text()).get("graphs", {}).get(name, {}).get("tensors", {})
    return {t: tuple(info["range"]) for t, info in tensors.items() if info.get("range")}


def _random_input(qgraph: QGraph, name: str, rng, real_range) -> np.ndarray:
    t = qgraph.tensors[name]
    if t.is_float:
        return rng.standard_normal(t.shape).astype(np.float32)
    if real_range is None:
        lo, hi = schemes.qrange(t.dtype)
        return rng.integers(lo, hi + 1, t.shape).astype(t.dtype)
    return schemes.quantize(rng.uniform(*real_range, t.shape), t.scale, t.zero_point, t.dtype)


def prove(program: ProgramFile, qgraph: QGraph, samples: Iterable[tuple[str, dict]]) -> dict:
    """Simulator vs integer reference on every GMEM tensor; raises on the first difference."""
    sim = Simulator(program)
    labels = []
    skip = set(program.doc["inputs"])
    compared = sorted(set(program.doc["gmem"]["tensors"]) - skip)
    for label, inputs in samples:  # lazily: `samples` may be a progress bar
        labels.append(label)
        try:
            got = sim.run(inputs)
        except SimulatorFault as exc:
            raise BuildError(f"{exc} (on {label})", stage=STAGE) from None
        want = run_reference(qgraph, inputs)
        for t in _in_program_order(program.doc, compared):
            if not bit_identical(want[t], got[t]):
                raise BuildError(_difference(program.doc, t, got[t], want[t], label),
                                 stage=STAGE)
    return {"bit_exact": True, "samples": labels,
            "tensors_compared": len(compared), "seconds": round(sim.stats.seconds, 3),
            "seconds_per_run": round(sim.stats.seconds / max(len(labels), 1), 3),
            "steps_per_run": sim.stats.steps // max(len(labels), 1)}


def _in_program_order(doc: dict, tensors: list[str]) -> list[str]:
    made = []
    for g in doc["groups"]:
        made += g["outputs"]
    rank = {t: i for i, t in enumerate(made)}
    return sorted(tensors, key=lambda t: rank.get(t, -1))


def _difference(doc: dict, tensor: str, got: np.ndarray, want: np.ndarray, label: str) -> str:
    """Which group and slice wrote the first differing element, and the numbers."""
    bad = np.argwhere(differing(want, got))
    where = tuple(int(i) for i in bad[0])
    view = doc["tensors"][tensor]["view"]
    n, c, h, _ = np.unravel_index(np.ravel_multi_index(where, got.shape), view)
    writer = "a step between groups"
    for g in doc["groups"]:
        if tensor not in g["outputs"]:
            continue
        if g["device"] != "npu":
            writer = f"group {g['index']} ({g['executes']} step {g['layer']!r})"
            break
        for s in g["slices"]:
            for st in s["steps"]:
                if st["op"] == "store" and st["tensor"] == tensor and _inside(st, n, c, h):
                    writer = f"group {g['index']} slice {s['index']} (rows {st['rows']})"
        break
    return (f"{doc['graph']} {writer}: tensor {tensor!r} differs from the integer reference on "
            f"{len(bad)} of {got.size} elements (first at index {list(where)}: simulator "
            f"{got[where]}, reference {want[where]}) on {label}")


def _inside(step: dict, n: int, c: int, h: int) -> bool:
    (b0, b1), (c0, c1), (r0, r1) = step["batch"], step["channels"], step["rows"]
    return b0 <= n < b1 and c0 <= c < c1 and r0 <= h < r1


# ---- report ----------------------------------------------------------------------------------

def graph_report(c: Compiled) -> tuple[dict, dict]:
    """The compile summary and the estimate of one graph."""
    groups = c.program.npu_groups
    breakers = {}
    for b in c.layers.breakers.values():
        breakers.setdefault(b.executes, []).append(b.layer)
    stepped = [g.layer for g in c.program.groups
               if g.device == "cpu" and g.layer.name not in c.layers.breakers]
    for layer in stepped:  # reshapes the plan left alone: aliases (`plan_qgraph`); fully
        if layer.attr("executes") in ("dma", "npu"):  # connected layers LMEM cannot hold
            breakers.setdefault(layer.attr("executes"), []).append(layer.name)
    cpu_fallback = [layer.name for layer in stepped
                    if layer.attr("executes") not in ("dma", "npu")]
    summary = {
        "layers": len(c.layers.graph.layers), "tiled_layers": len(c.layers.graph.layers)
        - len(c.layers.breakers) - len(stepped), "groups": len(groups),
        "slices": sum(len(g.slices) for g in groups),
        "h_sliced_groups": sum(g.plan.slicing.h > 1 for g in groups),
        "c_sliced_groups": sum(g.plan.slicing.c > 1 for g in groups),
        "bank_crossings": sum(g.plan.placement.bank_crossings for g in groups),
        "between_groups": breakers, "cpu_no_fit": cpu_fallback,
        "seconds": {k: round(v, 3) for k, v in c.seconds.items()},
        "files": [f"{c.name}/plan.json", f"{c.name}/program.npz",
                  f"graph_ir_{c.name.split('_')[1]}/{c.name}.json"]}
    cycles, base_cycles = c.grouped.cycles, c.baseline.cycles
    clock = c.program.chip.clock_mhz * 1e6
    est = {"cycles": cycles, "gmem_bytes": c.grouped.gmem_bytes,
           "offchip_bytes": c.grouped.offchip_bytes,
           "gmem_bytes_no_grouping": c.baseline.gmem_bytes,
           "gmem_bytes_lower_bound": gmem_lower_bound(c.layers.graph),
           "lmem_peak_bytes": c.grouped.lmem_peak_bytes,
           "fps": round(clock / cycles, 2) if cycles else 0.0,
           "groups": len(groups), "cycles_no_grouping": base_cycles,
           "fps_no_grouping": round(clock / base_cycles, 2) if base_cycles else 0.0,
           "compute_cycles": c.grouped.compute_cycles, "dma_cycles": c.grouped.dma_cycles,
           "between_groups_gmem_bytes": c.grouped.between_groups_gmem_bytes,
           "between_groups_cycles": c.grouped.between_groups_cycles}
    return summary, est


NO_NPU_NOTE = ("the split placed every node on the CPU: there is no NPU graph to compile, "
               "and the deployed pipeline runs entirely in ONNX Runtime")


def no_npu_report(ctx: StageContext) -> dict:
    """Zero NPU segments (``split.policy: cpu_only``, or nothing the chip runs): nothing to
    compile, said so in the report and in ``compile/compile.json``; the NPU estimate is zero."""
    ctx.log.warning("compile: %s", NO_NPU_NOTE)
    write_json(ctx.out / "compile.json", {"graphs": {}, "note": NO_NPU_NOTE})
    return {STAGE: {"chip": ctx.chip.name, "layer_group": ctx.recipe.compile.layer_group,
                    "graphs": {}, "npu_graphs": 0, "note": NO_NPU_NOTE},
            "simulator": {"graphs": {}, "note": "no NPU graph: nothing ran in the simulator"},
            "estimate": {"cycles": 0, "groups": 0, "gmem_bytes": 0, "lmem_peak_bytes": 0,
                         "note": "no NPU graph: the NPU estimate is empty",
                         **with_cpu(0, 0, ctx.chip.clock_mhz * 1e6, cpu_time.deployment_parts(
                             ctx.upstream.get("split"), []), cpu_time.METHOD)}}


def report(results: list[Compiled], ctx: StageContext) -> dict:
    graphs = {c.name: graph_report(c) for c in results}
    estimates = [e for _, e in graphs.values()]
    cycles = sum(e["cycles"] for e in estimates)
    base = sum(e["cycles_no_grouping"] for e in estimates)
    clock = ctx.chip.clock_mhz * 1e6
    total = {"cycles": cycles, "fps": round(clock / cycles, 2) if cycles else 0.0,
             "cycles_no_grouping": base, "fps_no_grouping": round(clock / base, 2) if base else 0.0,
             "lmem_peak_bytes": max(e["lmem_peak_bytes"] for e in estimates),
             "groups": sum(e["groups"] for e in estimates)}
    for key in ("gmem_bytes", "gmem_bytes_no_grouping", "gmem_bytes_lower_bound", "offchip_bytes"):
        total[key] = sum(e[key] for e in estimates)
    parts = cpu_time.deployment_parts(ctx.upstream.get("split"), [c.layers.qgraph for c in results])
    total.update(with_cpu(cycles, base, clock, parts, cpu_time.METHOD))
    proofs = {c.name: c.proof for c in results}
    return {
        STAGE: {"chip": ctx.chip.name, "layer_group": ctx.recipe.compile.layer_group,
                "graphs": {name: s for name, (s, _) in graphs.items()}},
        "simulator": {"bit_exact": all(p["bit_exact"] for p in proofs.values()),
                      "graphs": proofs},
        "estimate": {**total, "graphs": {name: e for name, (_, e) in graphs.items()}},
    }
