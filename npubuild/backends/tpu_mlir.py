"""Sophgo TPU-MLIR (BM1684X ...): ONNX → a real bmodel, run on TPU-MLIR's cmodel simulator.

Per NPU graph, in ``compile/graph_ir_<i>/``: the ONNX submodel (fused ops inlined, IR 9: the
toolchain's onnxruntime 1.16.3 reads no newer), the calibration inputs, and per quantizer a
calibration table and a bmodel —

- ``vendor``: ``run_calibration.py`` (its KL method) on the recipe's calibration data;
- ``npubuild``: the same table with npubuild's calibrated ranges (``quantize/calibration.json``)
  as the thresholds of every entry npubuild calibrated: the tensors it quantized and those it
  computes inside one integer layer (the ONNX TPU-MLIR reads names them as quantize does,
  `vendor.vendor_model`), and npubuild's precision decisions as TPU-MLIR's quantize table
  (``--quantize_table``): every op whose value quantize keeps in float runs in F16; any other
  entry without a range keeps TPU-MLIR's threshold and is named in the report
  (``quantization.fell_back``) and the log —

built by ``model_transform.py`` → ``model_deploy.py --quantize INT8 --chip <platform>``, with
``model_runner.py``'s outputs on the proof inputs. A bmodel embeds its creation time, so its bytes
are keyed on their inputs and a restored one is checked by re-running the proof inputs (verify).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np

from npubuild.backends import Backend, register, vendor
from npubuild.backends.vendor import STAGE, NpuGraph
from npubuild.errors import BuildError
from npubuild.toolchains.process import Worker, run_worker

WORKER = "tpu_mlir_worker.py"
ERROR_PATTERNS = (r"^.*\[ERROR\].*$", r"^\w*Error: .*$", r"^.*failed: .*$")


class TpuMlir(vendor.VendorBackend, Backend):
    name = "tpu-mlir"
    description = "Sophgo TPU-MLIR: ONNX -> bmodel, proven on its cmodel simulator"
    toolchain = "tpu-mlir"
    runs_in = "TPU-MLIR's cmodel simulator (model_runner.py)"
    proof_samples = 2  # the cmodel takes seconds per image

    def graph_compiler(self, ctx):
        """`compile_graph` with npubuild's calibrated ranges of the graph (its calibration
        table), read once for every graph."""
        npubuild_ranges = vendor.calibrated_ranges(Path(ctx.upstream["quantize"]))

        def compile_one(ctx, env, graph, calibration, compare, quantizers):
            return compile_graph(ctx, env, graph, calibration, compare, quantizers,
                                 npubuild_ranges.get(graph.name, vendor.Ranges({}, {})),
                                 _floats(ctx, graph) if "npubuild" in quantizers else set())
        return compile_one

    @staticmethod
    def backend_entry(name: str, result: dict) -> dict:
        return {"bmodel": f"{result['context_dir']}/{name}.{result['deployed']}.bmodel",
                "proof": result["proof"],
                "proof_outputs": f"{result['context_dir']}/proof_outputs.{result['deployed']}.npz"}

    def stage_report(self, ctx, env, results: dict) -> dict:
        return report(ctx, env, results)

    def npu_runner(self, compile_dir: Path):
        return BmodelRunner(Path(compile_dir))


def compile_graph(ctx, env, graph: NpuGraph, calibration: list[dict], compare: list[dict],
                  quantizers: list[str], calibrated: vendor.Ranges, kept_float: set[str]) -> dict:
    from npubuild import onnx_io

    folder = ctx.out / graph.context_dir
    onnx_path = vendor.write_vendor_model(graph, ctx.out)
    dataset = vendor.save_samples(folder / "calibration", calibration)
    proofs = vendor.save_samples(folder / "proof", compare)
    model = onnx_io.load_model(onnx_path)
    floats = [onnx_io.run(model, f, graph.outputs) for f in compare]
    shapes = [list(np.shape(calibration[0][t])) for t in graph.inputs]
    out = {"context_dir": graph.context_dir, "deployed": quantizers[0], "quantizers": {},
           "proof": [f"{graph.context_dir}/proof/{p.name}" for p in proofs]}
    vendor_table, coverage = None, None
    for q in ["vendor"] + [q for q in quantizers if q != "vendor"]:
        table, qtable = None, None
        if q == "npubuild":
            table, qtable, coverage = _npubuild_table(vendor_table, calibrated, kept_float, folder,
                                                      graph)
            if coverage["fell_back"]:
                ctx.log.warning("compile: %s: %s", graph.name, coverage["summary"])
        job = {"onnx": str(onnx_path.resolve()), "name": f"{graph.name}", "chip": ctx.chip.platform,
               "input_shapes": shapes, "data_list": [str(p.resolve()) for p in dataset],
               "cali_table": str(table.resolve()) if table else None,
               "quantize_table": str(qtable.resolve()) if qtable else None,
               "test_inputs": [str(p.resolve()) for p in proofs],
               "proof_outputs": str((folder / f"proof_outputs.{q}.npz").resolve())}
        figures, table_path = _build(env, graph, folder, job, q, vendor.logs_dir(ctx))
        if q == "vendor":
            vendor_table = table_path
        got = vendor.load_npz(folder / f"proof_outputs.{q}.npz")
        figures["proof"] = vendor.against_float(graph.outputs, _named(got, graph.outputs, len(compare)), floats)
        if q == "npubuild":
            figures["quantization"] = coverage
        if q in quantizers:
            out["quantizers"][q] = figures
    return out


def _build(env, graph: NpuGraph, folder: Path, job: dict, q: str,
           logs: Path) -> tuple[dict, Path]:
    with vendor.workdir("tpu-mlir", logs, f"compile.{graph.name}.{q}") as work:
        job = {**job, "output_dir": str(work / "out")}
        result = run_worker(env, WORKER, job, work, stage=STAGE, graph=graph.name,
                            patterns=ERROR_PATTERNS, timeout=7200)
        bmodel = folder / f"{graph.name}.{q}.bmodel"
        shutil.copyfile(result["bmodel"], bmodel)
        table = folder / f"{graph.name}.{q}.cali_table"
        shutil.copyfile(result["cali_table"], table)
        vendor.keep_log(work / "tpu_mlir_worker.log", folder / f"{graph.name}.{q}.log", work, folder)
    figures = {k: v for k, v in result.items() if k not in ("ok", "bmodel", "cali_table")}
    if "seconds_per_run" in figures:  # the cmodel per image (report.json only: a timing)
        figures["seconds_per_run"] = round(figures["seconds_per_run"], 3)
    return {"artifact": bmodel.name, "artifact_bytes": bmodel.stat().st_size, **figures}, table


def npubuild_table(vendor_table: str, ranges: vendor.Ranges,
                   floats: set[str] = frozenset()) -> tuple[str, str, dict]:
    """The vendor's table text with npubuild's ranges as the thresholds of every entry npubuild
    calibrated (TPU-MLIR's INT8 is symmetric: threshold = the larger magnitude of the range),
    TPU-MLIR's quantize table (``<op> F16`` for every entry whose value is in ``floats``, the
    values npubuild keeps in float), and how many: an entry npubuild has neither for keeps
    TPU-MLIR's own threshold, named in the coverage (never silently)."""
    lines, qtable, applied, inner, fell_back, entries = [], [], 0, 0, [], 0
    for line in vendor_table.splitlines():
        parts = line.split()
        if line.startswith("#") or len(parts) < 4:
            lines.append(line)
            continue
        entries += 1
        in_float = table_value(parts[0], floats) is not None
        if in_float:
            qtable.append(f"{parts[0]} F16")
        found = table_tensor(parts[0], ranges)
        if found is None:
            if not in_float:
                fell_back.append(parts[0])
            lines.append(line)
            continue
        kind, (lo, hi) = found
        threshold = max(abs(lo), abs(hi), 1e-8)
        lines.append(" ".join([parts[0], f"{threshold:.7f}", f"{lo:.7f}", f"{hi:.7f}", *parts[4:]]))
        applied += 1
        inner += kind == "inner"
    coverage = {"entries": entries, "applied": applied, "inner": inner, "float16": len(qtable),
                "fell_back": fell_back,
                "summary": vendor.coverage_line(applied, entries, inner, fell_back,
                                                "calibration table entries", len(qtable))}
    return "\n".join(lines) + "\n", "".join(f"{q}\n" for q in qtable), coverage


def _floats(ctx, graph: NpuGraph) -> set[str]:
    """The values of the graph's vendor model that quantize keeps in float."""
    from npubuild import onnx_io
    from npubuild.quant.qgraph import QGraph

    path = Path(ctx.upstream["quantize"]) / f"{graph.name}.qgraph.json"
    if not path.is_file():
        return set()
    model = vendor.vendor_model(onnx_io.load_model(graph.model_path))
    return vendor.float_values(model, QGraph.load(path))


def _npubuild_table(vendor_table: Path | None, ranges: vendor.Ranges, floats: set[str],
                    folder: Path, graph: NpuGraph) -> tuple[Path, Path | None, dict]:
    if vendor_table is None:
        raise BuildError(f"{graph.name}: no vendor calibration table to start from", stage=STAGE)
    text, qtable, coverage = npubuild_table(vendor_table.read_text(), ranges, floats)
    path = folder / f"{graph.name}.npubuild-input.cali_table"
    vendor.write_text(path, text)
    qpath = vendor.write_text(folder / f"{graph.name}.npubuild.qtable", qtable) if qtable else None
    return path, qpath, coverage


def table_tensor(op_name: str, ranges: vendor.Ranges) -> tuple[str, tuple[float, float]] | None:
    """npubuild's range for a TPU-MLIR table entry: TPU-MLIR calls a value by the ONNX output's
    name, suffixed with its op type when converting (``relu`` -> ``relu_Relu``)."""
    found = ranges.get(op_name)
    if found is None:
        head, _, _ = op_name.rpartition("_")
        found = ranges.get(head) if head else None
    return found


def table_value(op_name: str, values: set[str]) -> str | None:
    """The value of ``values`` a TPU-MLIR table entry names (itself, or without its op-type
    suffix), if any."""
    head = op_name.rpartition("_")[0]
    return op_name if op_name in values else head if head in values else None


def _named(got: dict, outputs: list[str], samples: int) -> dict:
    """model_runner's outputs by the submodel's output names ("<k>:<name>"); TPU-MLIR may
    suffix a name with its op type, so a name is matched exactly, then by prefix, then by order."""
    out = {}
    for k in range(samples):
        keys = [key.split(":", 1)[1] for key in got if key.startswith(f"{k}:")]
        for i, name in enumerate(outputs):
            match = (name if name in keys else next((key for key in keys if key.startswith(name)), None)
                     or (keys[i] if i < len(keys) else None))
            if match is None:
                raise BuildError(f"model_runner returned no output for {name!r} (got {keys})",
                                 stage=STAGE)
            out[f"{k}:{name}"] = got[f"{k}:{match}"]
    return out


def report(ctx, env, results: dict) -> dict:
    graphs = {name: {"deployed": r["deployed"], "quantizers": r["quantizers"]}
              for name, r in results.items()}
    deployed = [r["quantizers"][r["deployed"]] for r in results.values()]
    figures = {"artifact_bytes": sum(d["artifact_bytes"] for d in deployed), "reproducible": False,
               "seconds_per_run": round(sum(d.get("seconds_per_run", 0) for d in deployed), 3),
               **{key: sum(d.get(key, 0) for d in deployed)
                  for key in ("npu_ops", "cpu_ops", "device_memory_bytes", "weight_memory_bytes")},
               "note": "a bmodel embeds its creation time: keyed on its inputs, checked by "
                       "re-running the proof inputs"}
    return vendor.stage_report(ctx, env, "tpu-mlir", graphs, figures)


class BmodelRunner(vendor.WorkerRunner):
    """`Runner` backend: each NPU graph's deployed bmodel in model_runner (cmodel), after the
    proof inputs reproduced compile's outputs."""

    def __call__(self, graph, feeds) -> dict:
        got = {f"0:{k}": v for k, v in self.run(graph.name, feeds).items()}
        named = _named(got, list(graph.outputs), 1)
        return {t: named[f"0:{t}"] for t in graph.outputs}

    prefix = "tpu-mlir"

    def start(self, name: str, folder: Path) -> Worker:
        from npubuild import toolchains
        from npubuild.toolchains.env import require

        return Worker(require(toolchains.get("tpu-mlir")), WORKER,
                      {"bmodel": str(self.dir / self.info["graphs"][name]["bmodel"])}, folder,
                      stage="verify", graph=name, patterns=ERROR_PATTERNS)

    def check_proof(self, name: str, worker: Worker, folder: Path) -> None:
        """One proof sample (the cmodel takes seconds) must reproduce compile's outputs."""
        entry = self.info["graphs"][name]
        want = vendor.load_npz(self.dir / entry["proof_outputs"])
        worker(self.dir / entry["proof"][0], folder / "proof_out.npz")
        for key, value in vendor.load_npz(folder / "proof_out.npz").items():
            if f"0:{key}" in want and not np.array_equal(value, want[f"0:{key}"]):
                raise BuildError(f"{name}: the bmodel's outputs on proof sample 0 differ from "
                                 f"compile's ({key!r}); the restored artifact does not match its "
                                 "build", stage="verify")


register(TpuMlir())
