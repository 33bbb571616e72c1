"""Rockchip NPUs (RK3588 ...) through rknn-toolkit2: ONNX → ``.rknn``, run in its PC simulator.

Per NPU graph, in ``compile/graph_ir_<i>/``: the ONNX the toolkit was given (fused ops
inlined), the calibration inputs, one ``.rknn`` per quantizer —

- ``vendor``: the toolkit's own quantizer (``build(do_quantization=True)``) on the recipe's
  calibration data, what users ship today;
- ``npubuild``: npubuild's calibration handed over as its QDQ model (quantize's
  ``graph_<i>.qdq.onnx`` without its tie-breaking Adds; the toolkit reads the scales and does
  not quantize again)

— with the toolkit's log (its layer table: which ops run on the NPU, cycle estimates, memory)
and the simulator's outputs on the proof inputs. ``compile.quantizer`` says which one is
deployed; both are compared with the float submodel on the verify data in the report.

Facts this module handles: ``.rknn`` bytes differ run to run (about 1 kB), the simulator's
outputs do not, so the artifact is keyed on its inputs and checked by its proof outputs; the
simulator refuses a loaded ``.rknn`` (``load_rknn`` then ``init_runtime()`` without a target),
so verify builds the same job again in the worker and first checks those proof outputs; a
build that fails in one of the toolkit's fusion rules is retried once with the rule the toolkit
itself suggests disabling.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np

from npubuild.backends import Backend, register, vendor
from npubuild.backends.vendor import STAGE, NpuGraph
from npubuild.errors import BuildError
from npubuild.toolchains.process import Worker, run_worker, vendor_line

WORKER = "rknn_worker.py"
#: The toolkit's error lines ("E build: ...", "E load_onnx: ...") and Python's last line.
ERROR_PATTERNS = (r"^E (?!build: Traceback)[a-z_]+: .*$", r"^E RKNN:.*$", r"^\w*Error: .*$")
DISABLE_RULES = re.compile(r"disable_rules\s*=\s*\[([^\]]*)\]")
OPTIMIZATION_LEVEL = re.compile(r"optimization_level to (\d)")
RULE_FAILED = re.compile(r"(?:rule|Rule)\s*[:=]?\s*['\"]?([a-z][a-z0-9_]+)['\"]?\s+(?:failed|error)")
LAYER_ROW = re.compile(r"^D RKNN:\s+(\d+)\s+(\S+)\s+(\S+)\s+(NPU|CPU)\s+.*?\s(\d+)/(\d+)/(\d+)\s+(\S+)\s+(\S+)\s*$")
MEMORY = re.compile(r"Total (Internal|Weight) Memory Size:\s*([\d.]+)\s*(KB|MB|B)")
#: A row of the toolkit's Feature Tensor Information Table: id, user op, tensor, data type.
FEATURE_ROW = re.compile(r"^D RKNN:\s+\d+\s+\S+\s+(\S+)\s+([A-Z]+\d*)\s+\S+\s+\(")
INTEGER_TYPES = ("INT8", "UINT8", "INT16")
#: Why the simulator, given npubuild's QDQ model, is not bit-exact with npubuild's integer
#: reference: measured on YOLOv8n (README, Real chips), layer by layer with the QDQ model cut
#: at intermediate tensors in the simulator (benchmarks/rknn_layers.py).
AGREEMENT_BOUND = (
    "the toolkit runs npubuild's quantization with its own fused kernels: a Conv+SiLU keeps the "
    "conv's output at 1/128 of npubuild's int8 step (the Q/DQ inside the fused op is not applied) "
    "and rounds once after an exact SiLU, where npubuild's integer model rounds the conv output "
    "to int8 before its SiLU table (YOLOv8n's first layer: 25 % of elements differ, at most 5 "
    "steps); the convolution itself differs by up to 2 steps; Sigmoid outputs come out at the "
    "toolkit's own 1/255. The one-step differences compound layer by layer (YOLOv8n: 41 % of "
    "the second layer's elements differ, 63 % at the head's Concat, 99th percentile 7 steps), "
    "so whole models are compared with the float model, and their integers only reported")


class Rknn(vendor.VendorBackend, Backend):
    name = "rknn"
    description = "Rockchip rknn-toolkit2: ONNX -> .rknn, proven in its PC simulator"
    toolchain = "rknn"
    runs_in = "rknn-toolkit2's PC simulator"

    def graph_compiler(self, ctx):
        return compile_graph

    @staticmethod
    def backend_entry(name: str, result: dict) -> dict:
        return {"jobs": {q: f"{result['context_dir']}/job.{q}.json" for q in result["quantizers"]}}

    def stage_report(self, ctx, env, results: dict) -> dict:
        return report(ctx, env, results)

    def npu_runner(self, compile_dir: Path):
        return RknnRunner(Path(compile_dir))


def compile_graph(ctx, env, graph: NpuGraph, calibration: list[dict], compare: list[dict],
                  quantizers: list[str]) -> dict:
    from npubuild import onnx_io

    folder = ctx.out / graph.context_dir
    onnx_path = vendor.write_vendor_model(graph, ctx.out)
    dataset = vendor.save_samples(folder / "calibration", calibration)
    proofs = vendor.save_samples(folder / "proof", compare)
    qdq = _npubuild_qdq(ctx, graph, folder) if "npubuild" in quantizers else None
    shapes = [list(np.shape(calibration[0][t])) for t in graph.inputs]
    floats = [_float_outputs(onnx_path, p, graph) for p in proofs]
    out = {"context_dir": graph.context_dir, "deployed": quantizers[0], "quantizers": {}}
    for q in quantizers:
        job = {"onnx": (qdq if q == "npubuild" else onnx_path).name, "platform": ctx.chip.platform,
               "inputs": graph.inputs, "outputs": graph.outputs, "input_shapes": shapes,
               "quantize": q == "vendor",
               "dataset": [f"calibration/{p.name}" for p in dataset] if q == "vendor" else [],
               "export": f"{graph.name}.{q}.rknn", "proof": [f"proof/{p.name}" for p in proofs],
               "proof_outputs": f"proof_outputs.{q}.npz"}
        figures = build_variant(env, graph, folder, job, floats, vendor.logs_dir(ctx))
        tensors = figures.pop("feature_tensors")
        if q == "npubuild":  # whose quantization each tensor the toolkit holds carries
            figures["quantization"] = qdq_coverage(onnx_io.load_model(qdq), tensors)
            if figures["quantization"]["fell_back"]:
                ctx.log.warning("compile: %s: %s", graph.name, figures["quantization"]["summary"])
            figures["integer_reference"] = {**vendor.reference_agreement(
                _qgraph(ctx, graph), graph.outputs, vendor.load_npz(folder / job["proof_outputs"]),
                [vendor.load_npz(p) for p in proofs]), "why": AGREEMENT_BOUND}
        out["quantizers"][q] = figures
    return out


def _npubuild_qdq(ctx, graph: NpuGraph, folder: Path) -> Path:
    """npubuild's quantization of ``graph`` as the toolkit reads it: the QDQ model of its
    integer graph without the tie-breaking Adds (a float op between a layer and its
    QuantizeLinear makes the toolkit take the layer for a float16 one, and then stop on its
    int8 weights: "Invalid w_par['dtype'] = float16"; it rounds in its own kernels anyway)."""
    from npubuild import onnx_io
    from npubuild.quant.qdq import export_qdq

    source = Path(ctx.upstream["quantize"]) / f"{graph.name}.qgraph.json"
    if not source.is_file():
        raise BuildError(f"{graph.name}: quantize wrote no {source.name} to hand to the toolkit",
                         stage=STAGE)
    path = folder / f"{graph.name}.qdq.onnx"
    onnx_io.save_model(vendor.vendor_model(export_qdq(_qgraph(ctx, graph), ties=False)), path)
    return path


def _qgraph(ctx, graph: NpuGraph):
    from npubuild.quant.qgraph import QGraph

    return QGraph.load(Path(ctx.upstream["quantize"]) / f"{graph.name}.qgraph.json")


def _float_outputs(onnx_path: Path, proof: Path, graph: NpuGraph) -> dict:
    from npubuild import onnx_io

    return onnx_io.run(onnx_io.load_model(onnx_path), vendor.load_npz(proof), graph.outputs)


def build_variant(env, graph: NpuGraph, folder: Path, job: dict, floats: list[dict],
                  logs: Path) -> dict:
    """One ``.rknn``; a failed build is retried with each config change the toolkit itself
    suggests (``disable_rules=[...]``, ``optimization_level``), once each (the failed
    attempt's log is kept in ``logs``)."""
    applied: dict = {}
    while True:
        try:
            result, log = _run(env, graph, folder, job, logs)
            break
        except BuildError as exc:
            fix = {k: v for k, v in suggested_config(exc).items() if k not in applied}
            if not fix:
                raise
            applied.update(fix)
            job = {**job, **fix}
    vendor.write_json(folder / f"job.{job['export'].split('.')[-2]}.json", job)
    figures = layer_figures(log)
    renamed = result.get("renamed", {})
    figures["feature_tensors"] = [original_name(t, renamed) for t in feature_tensors(log)]
    figures["artifact_bytes"] = (folder / job["export"]).stat().st_size
    got = vendor.load_npz(folder / job["proof_outputs"])
    figures["proof"] = _against_float(graph, got, floats)
    figures["seconds_per_run"] = round(result.get("seconds_per_run", 0.0), 3)  # report.json only
    if applied:
        figures["applied_vendor_suggestion"] = ", ".join(f"{k}={v}" for k, v in applied.items())
    return figures


def _run(env, graph: NpuGraph, folder: Path, job: dict, logs: Path) -> tuple[dict, str]:
    variant = job["export"].split(".")[-2]
    with vendor.workdir("rknn", logs, f"compile.{graph.name}.{variant}") as work:
        absolute = _absolute(job, folder)
        result = run_worker(env, WORKER, absolute, work, stage=STAGE, graph=graph.name,
                            patterns=ERROR_PATTERNS)
        shutil.copyfile(work / Path(absolute["export"]).name, folder / job["export"])
        log_path = work / "rknn_worker.log"
        vendor.keep_log(log_path, folder / f"{graph.name}.{variant}.log", work, folder)
        text = vendor.clean_log(log_path.read_text(encoding="utf-8", errors="replace"))
    return result, text


def _absolute(job: dict, folder: Path) -> dict:
    folder = folder.resolve()
    out = dict(job)
    for key in ("onnx", "proof_outputs"):
        out[key] = str(folder / job[key])
    out["export"] = Path(job["export"]).name  # written in the worker's folder, then copied
    out["dataset"] = [str(folder / p) for p in job["dataset"]]
    out["proof"] = [str(folder / p) for p in job["proof"]]
    return out


def suggested_config(exc: BuildError) -> dict:
    """The config changes the toolkit's own messages suggest for this failure (its log's
    "You can add disable_rules=[...]", "you can try changing config.optimization_level to N")."""
    text = f"{exc.message}\n{exc.hint or ''}"
    log = re.search(r"the whole log: (\S+)", exc.hint or "")
    if log and Path(log.group(1)).is_file():
        text += "\n" + Path(log.group(1)).read_text(errors="replace")
    fix: dict = {}
    found = DISABLE_RULES.search(text)
    if found:
        fix["disable_rules"] = [r.strip().strip("'\"") for r in found.group(1).split(",") if r.strip()]
    level = OPTIMIZATION_LEVEL.search(text)
    if level:
        fix["optimization_level"] = int(level.group(1))
    return fix


def layer_figures(log: str) -> dict:
    """The toolkit's own figures from its layer table: ops on the NPU and on the CPU (inputs and
    outputs are not ops), its cycle estimate and memory."""
    npu, cpu, cycles, rw_kb = 0, 0, 0, 0.0
    for line in log.splitlines():
        row = LAYER_ROW.match(line.strip())
        if not row or row.group(2) in ("InputOperator", "OutputOperator"):
            continue
        npu += row.group(4) == "NPU"
        cpu += row.group(4) == "CPU"
        cycles += int(row.group(7))
        try:
            rw_kb += float(row.group(8))
        except ValueError:
            pass
    figures = {"npu_ops": npu, "cpu_ops": cpu, "cycles": cycles,
               "rw_bytes": int(rw_kb * 1024)}
    for kind, value, unit in MEMORY.findall(log):
        scale = {"B": 1, "KB": 1024, "MB": 1024 ** 2}[unit]
        figures[f"{kind.lower()}_memory_bytes"] = int(float(value) * scale)
    return figures


def feature_tensors(log: str) -> list[str]:
    """The integer tensors the toolkit holds between its ops, in its Feature Tensor Information
    Table (a tensor its fused ops compute inside is not one of them)."""
    names, inside = [], False
    for line in log.splitlines():
        if "Information Table" in line:
            inside = "Feature Tensor" in line
            continue
        row = FEATURE_ROW.match(line.strip()) if inside else None
        if row and row.group(2) in INTEGER_TYPES and row.group(1) not in names:
            names.append(row.group(1))
    return names


def original_name(name: str, renamed: dict[str, str]) -> str:
    """``name`` from the toolkit's log in the model's own names: the worker cut the long ones
    for the toolkit (``renamed``: new name -> the model's), and the toolkit names the tensors of
    its own rewrites after one of them (a ``-``/``_`` suffix: `_rewritten`)."""
    if name in renamed:
        return renamed[name]
    base = _rewritten(name, renamed)
    return renamed[base] + name[len(base):] if base is not None else name


def qdq_sources(model) -> dict[str, str]:
    """Every name in a QDQ model under which npubuild's quantization of a tensor travels →
    that tensor: a QuantizeLinear's input and output and its DequantizeLinear's output (named
    after the scale, ``<tensor>::scale``), and what an Identity passes on."""
    sources: dict[str, str] = {}
    for node in model.graph.node:
        if node.op_type == "QuantizeLinear":
            scale = node.input[1]
            tensor = scale[:-len("::scale")] if scale.endswith("::scale") else node.input[0]
            sources.update({node.input[0]: tensor, node.output[0]: tensor})
        elif node.op_type in ("DequantizeLinear", "Identity") and node.input[0] in sources:
            sources[node.output[0]] = sources[node.input[0]]
    return sources


def qdq_coverage(model, tensors: list[str]) -> dict:
    """Whose quantization each of the toolkit's integer ``tensors`` carries: npubuild's (a Q/DQ
    pair of the QDQ model it was given), npubuild's carried over by the toolkit onto a tensor of
    its own rewrites (named after the one it rewrote: ``<tensor>-rs``, ``<tensor>_exSecondary``;
    the toolkit is given no calibration data with a QDQ model), or neither (named, never
    silent)."""
    sources = qdq_sources(model)
    derived = {t: sources[base] for t in tensors if t not in sources
               and (base := _rewritten(t, sources)) is not None}
    fell_back = [t for t in tensors if t not in sources and t not in derived]
    applied = len(tensors) - len(derived) - len(fell_back)
    line = f"npubuild's Q/DQ on {applied} of {len(tensors)} integer tensors the toolkit holds between its ops"
    if derived:
        line += (f"; {len(derived)} more are tensors of its own rewrites, quantized from npubuild's "
                 "(no calibration data is given to the toolkit): "
                 + ", ".join(f"{t} (named after {src})" for t, src in list(derived.items())[:4])
                 + (" ..." if len(derived) > 4 else ""))
    if fell_back:
        line += (f"; {len(fell_back)} with no npubuild quantization the toolkit chose itself: "
                 + ", ".join(fell_back[:8]) + (" ..." if len(fell_back) > 8 else ""))
    return {"entries": len(tensors), "applied": applied, "derived": derived,
            "fell_back": fell_back, "summary": line}


def _rewritten(name: str, sources: dict[str, str]) -> str | None:
    """The name among ``sources`` (a QDQ model's tensors) that ``name`` extends (``-``/``_``
    and a suffix), if any: the longest such."""
    for end in range(len(name) - 1, 0, -1):
        if name[end] in "-_" and name[:end] in sources:
            return name[:end]
    return None


def _against_float(graph: NpuGraph, got: dict, floats: list[dict]) -> dict:
    """The simulator's outputs on the proof samples against the float submodel, per output."""
    return vendor.against_float(graph.outputs, got, floats)


def report(ctx, env, results: dict) -> dict:
    graphs = {}
    for name, r in results.items():
        graphs[name] = {"deployed": r["deployed"], "artifact": f"{r['context_dir']}/{name}."
                        f"{r['deployed']}.rknn", "quantizers": r["quantizers"]}
    deployed = [r["quantizers"][r["deployed"]] for r in results.values()]
    figures = {"npu_ops": sum(d["npu_ops"] for d in deployed),
               "cpu_ops": sum(d["cpu_ops"] for d in deployed),
               "cycles": sum(d["cycles"] for d in deployed),
               "seconds_per_run": round(sum(d.get("seconds_per_run", 0) for d in deployed), 3),
               "artifact_bytes": sum(d["artifact_bytes"] for d in deployed),
               "internal_memory_bytes": max(d.get("internal_memory_bytes", 0) for d in deployed),
               "weight_memory_bytes": sum(d.get("weight_memory_bytes", 0) for d in deployed),
               "reproducible": False,
               "note": ".rknn bytes differ run to run (the simulator's outputs do not): keyed "
                       "on their inputs, checked by re-running the proof inputs"}
    return vendor.stage_report(ctx, env, "rknn", graphs, figures)


class RknnRunner(vendor.WorkerRunner):
    """Runs each NPU graph in the toolkit's simulator (one worker per graph, built once from
    the compile job, its proof outputs checked first)."""

    def __call__(self, graph, feeds) -> dict:
        got = self.run(graph.name, feeds)
        return {t: got[t] for t in graph.outputs}

    prefix = "rknn"

    def job(self, name: str) -> dict:
        entry = self.info["graphs"][name]
        job_path = self.dir / entry["jobs"][entry["deployed"]]
        return _absolute(vendor.json_load(job_path), job_path.parent)

    def start(self, name: str, folder: Path) -> Worker:
        from npubuild import toolchains
        from npubuild.toolchains.env import require

        return Worker(require(toolchains.get("rknn")), WORKER, self.job(name), folder,
                      stage="verify", graph=name, patterns=ERROR_PATTERNS)

    def check_proof(self, name: str, worker: Worker, folder: Path) -> None:
        """The rebuilt model must reproduce compile's proof outputs exactly."""
        job = self.job(name)
        want = vendor.load_npz(Path(job["proof_outputs"]))
        for k, proof in enumerate(job["proof"]):
            worker(Path(proof), folder / "proof_out.npz")
            got = vendor.load_npz(folder / "proof_out.npz")
            for t, value in got.items():
                if not np.array_equal(value, want[f"{k}:{t}"]):
                    raise BuildError(f"{name}: the simulator's outputs on proof sample {k} differ "
                                     f"from compile's ({t!r}: max difference "
                                     f"{np.max(np.abs(value - want[f'{k}:{t}'])):.6g}); the "
                                     "restored artifact does not match its build", stage="verify",
                                     hint="rebuild compile (npubuild clean R, or delete build/<name>/compile)")


__all__ = ["Rknn", "feature_tensors", "layer_figures", "qdq_coverage", "suggested_config",
           "vendor_line"]

register(Rknn())
