"""What the vendor backends share: the NPU submodels as the vendor gets them, calibration and
proof inputs per NPU graph, npubuild's own estimate for the chip, and ``backend.json``.

Every vendor artifact goes into ``compile/graph_ir_<i>/`` (the graph's ``context_dir``), beside
the ONNX the vendor was given, the calibration inputs it used (``calibration/sample_<k>.npz``,
so verify can rebuild where the vendor's simulator needs that), the proof inputs and the
vendor's outputs on them (``proof.npz`` / ``proof_outputs.npz``). Vendor bytes that are not
reproducible are keyed on their inputs; a restored artifact is checked by running the proof
inputs again (verify), never by its bytes.
"""

from __future__ import annotations

import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx

from npubuild import onnx_io
from npubuild.atomic import atomic_path, write_json, write_text
from npubuild.backends import BACKEND_FILE
from npubuild.errors import BuildError
from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.stages import StageContext

STAGE = "compile"
#: Old vendor runtimes read at most this ONNX IR version (TPU-MLIR's onnxruntime 1.16.3: 9).
VENDOR_IR = 9
TIMESTAMP = re.compile(r"\[\d\d:\d\d:\d\d(\.\d+)?\]\s*|\d{4}-\d\d-\d\d[ T]\d\d:\d\d:\d\d[.,\d]*\s*")
ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


@dataclass
class NpuGraph:
    """One NPU submodel of the split, as a vendor compiles it."""

    index: int
    name: str
    inputs: list[str]
    outputs: list[str]
    model_path: Path

    @property
    def context_dir(self) -> str:
        return f"graph_ir_{self.index}"


def npu_graphs(ctx: StageContext) -> list[NpuGraph]:
    from npubuild.runtime import Runner

    runner = Runner(ctx.upstream["split"])
    return [NpuGraph(g.index, g.name, list(g.inputs), list(g.outputs), g.model_path)
            for g in runner.graphs if g.device == "npu"]


def vendor_model(model: onnx.ModelProto, ir_version: int = VENDOR_IR) -> onnx.ModelProto:
    """A submodel as a vendor reads it: npubuild's fused ops inlined into standard ONNX ops
    (no vendor knows domain ``npubuild.fused``), IR version at most ``ir_version``.

    Inlined first exactly as quantize's lowering inlines them (`npubuild.quant.lower.prepare`),
    so every tensor has the name it has in ``quantize/calibration.json`` (the inliner numbers
    the tensors of each call it inlines: inlining another selection renames them); then the
    element-wise functions the lowering keeps whole (one table each in npubuild's graph)."""
    import onnx.inliner

    from npubuild.quant.lower import prepare

    model = prepare(model) if model.functions else onnx_io.clone(model)
    model = onnx.inliner.inline_local_functions(without_overloads(model)) if model.functions \
        else model
    del model.functions[:]
    keep = [o for o in model.opset_import if o.domain in STANDARD_DOMAINS]
    del model.opset_import[:]
    model.opset_import.extend(keep)
    model.ir_version = min(model.ir_version, ir_version)
    return model


def without_overloads(model: onnx.ModelProto) -> onnx.ModelProto:
    """``model`` with every overloaded function renamed ``<name>__<overload>`` (and its calls),
    and every function's standard opset at the model's: ONNX's inliner leaves calls to an
    overload (quantize's ``HardSwish`` overload ``Relu6Div``) and to a function of another
    opset (quantize's opset-13 bodies in an opset-17 model) in place, which no vendor could
    load. The bodies are elementwise ops whose meaning no opset since 13 changed."""
    model = onnx_io.clone(model)
    version = next((o.version for o in model.opset_import if o.domain in STANDARD_DOMAINS), None)
    for f in model.functions:
        for o in f.opset_import:
            if o.domain in STANDARD_DOMAINS and version is not None:
                o.version = version
    renamed = {(f.domain, f.name, f.overload): f"{f.name}__{f.overload}"
               for f in model.functions if f.overload}
    if not renamed:
        return model
    nodes = [*model.graph.node, *(n for f in model.functions for n in f.node)]
    for node in nodes:
        key = (node.domain, node.op_type, node.overload)
        if key in renamed:
            node.op_type, node.overload = renamed[key], ""
    for f in model.functions:
        if (f.domain, f.name, f.overload) in renamed:
            f.name, f.overload = renamed[(f.domain, f.name, f.overload)], ""
    return model


def write_vendor_model(graph: NpuGraph, out: Path) -> Path:
    path = out / graph.context_dir / f"{graph.name}.onnx"
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx_io.save_model(vendor_model(onnx_io.load_model(graph.model_path)), path)
    return path


def graph_feeds(ctx: StageContext, files: list[Path], count: int) -> dict[int, list[dict]]:
    """Every NPU graph's float inputs on up to ``count`` samples of ``files`` (the recipe's
    preprocessing; the float pipeline before the graph), by graph index."""
    from npubuild.quant import data, onnx_inputs
    from npubuild.quant.pipeline import SplitPipeline

    pipeline = SplitPipeline(ctx.upstream["split"])
    inputs = onnx_inputs.input_infos(pipeline, ctx.recipe.model.inputs, ctx.upstream.get("import"))
    out: dict[int, list[dict]] = {g.index: [] for g in pipeline.npu_graphs}
    for sample in data.load_samples(files, inputs, count):
        values = pipeline.float_values(sample)
        for g in pipeline.npu_graphs:
            out[g.index].append({t: np.asarray(values[t]) for t in g.inputs})
    return out


def calibration_files(loaded) -> list[Path]:
    from npubuild.stages.files import calibration_files as files

    return files(loaded)


def calibration_feeds(ctx: StageContext) -> dict[int, list[dict]]:
    spec = ctx.recipe.quantization.calibration
    return graph_feeds(ctx, calibration_files(ctx.loaded), spec.samples)


def json_load(path: Path) -> dict:
    import json

    return json.loads(Path(path).read_text(encoding="utf-8"))


def save_npz(path: Path, arrays: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            np.savez(fh, **{k: np.asarray(arrays[k]) for k in sorted(arrays)})
    return path


def load_npz(path: Path) -> dict[str, np.ndarray]:
    with np.load(path, allow_pickle=False) as npz:
        return {k: npz[k] for k in npz.files}


def save_samples(folder: Path, samples: Iterable[dict]) -> list[Path]:
    return [save_npz(folder / f"sample_{k}.npz", s) for k, s in enumerate(samples)]


def clean_log(text: str, *paths: Path) -> str:
    """A vendor log as an artifact: no colour codes, times or machine paths."""
    text = TIMESTAMP.sub("", ANSI.sub("", text))
    for path in paths:
        text = text.replace(str(path), "<work>")
    return text


def keep_log(source: Path, target: Path, *paths: Path) -> Path:
    return write_text(target, clean_log(source.read_text(encoding="utf-8", errors="replace"), *paths))


def logs_dir(ctx: StageContext) -> Path:
    """Where a failing vendor's logs are kept: the build's ``logs/`` (a failed stage's own
    directory is discarded), or the stage's directory when it runs outside a build."""
    return ctx.logs if ctx.logs is not None else ctx.out / "logs"


@contextmanager
def workdir(prefix: str, logs: Path, label: str) -> Iterator[Path]:
    """A scratch folder for the vendor's own files (outside the stage's artifacts), removed
    however the vendor ends: when it fails, its logs are kept first (`keep_failure_logs`)."""
    path = Path(tempfile.mkdtemp(prefix=f"npubuild-{prefix}-"))
    try:
        yield path
    except BuildError as exc:
        keep_failure_logs(exc, path, logs, label)
        raise
    finally:
        shutil.rmtree(path, ignore_errors=True)


def keep_failure_logs(exc: BuildError, folder: Path, logs: Path, label: str) -> None:
    """Copy the ``*.log`` files of ``folder`` (about to be removed) to ``logs/<label>.<name>``
    and make ``exc`` name the copies instead."""
    for log in sorted(folder.glob("*.log")):
        logs.mkdir(parents=True, exist_ok=True)
        kept = logs / f"{label}.{log.name}"
        shutil.copyfile(log, kept)
        exc.message = exc.message.replace(str(log), str(kept))
        exc.hint = exc.hint.replace(str(log), str(kept)) if exc.hint else exc.hint
        exc.args = (exc.message,)


def write_backend_file(out: Path, backend: str, env, graphs: dict) -> Path:
    return write_json(out / BACKEND_FILE, {"backend": backend, "toolchain": env.identity(),
                                           "graphs": graphs})


def npubuild_estimate(ctx: StageContext) -> dict:
    """npubuild's own estimate of the NPU graphs on the chip's datasheet figures (the simulated
    compiler's plan, no simulator run), to set beside the vendor's figures."""
    return quantized_estimate(Path(ctx.upstream["quantize"]), ctx.chip)


def quantized_estimate(qdir: Path, chip) -> dict:
    """npubuild's estimate of the quantized NPU graphs in ``qdir`` (``graph_*.qgraph.json``)
    planned for ``chip``: cycles, the NPU part's frames per second (``npu_fps``: no CPU part is
    timed on a real-chip build, so there is no deployed fps), GMEM and off-chip bytes, LMEM
    peak."""
    from npubuild.npu import build_program, estimate
    from npubuild.npu.from_qgraph import layers_from_qgraph, plan_qgraph
    from npubuild.quant.qgraph import QGraph

    cycles, gmem, offchip, lmem = 0, 0, 0, 0
    for path in sorted(Path(qdir).glob("graph_*.qgraph.json")):
        try:
            program = build_program(plan_qgraph(layers_from_qgraph(QGraph.load(path)), chip,
                                                grouping=True, on_no_fit="cpu"))
        except Exception as exc:  # the estimate is a figure, never a reason to fail the build
            return {"note": f"npubuild's estimate failed on {path.name}: {exc}"}
        est = estimate(program)
        cycles, gmem, offchip = cycles + est.cycles, gmem + est.gmem_bytes, offchip + est.offchip_bytes
        lmem = max(lmem, est.lmem_peak_bytes)
    clock = chip.clock_mhz * 1e6
    return {"cycles": cycles, "npu_fps": round(clock / cycles, 2) if cycles else 0.0,
            "gmem_bytes": gmem, "offchip_bytes": offchip, "lmem_peak_bytes": lmem,
            "note": "npubuild's own model of the chip (datasheet figures in its chip file)"}


def stage_report(ctx: StageContext, env, backend: str, graphs: dict, figures: dict) -> dict:
    """The report fragment of a vendor compile: per graph and quantizer in ``compile``, the
    deployed artifacts' figures in ``vendor``, npubuild's own estimate in ``estimate``."""
    return {STAGE: {"chip": ctx.chip.name, "backend": backend, "platform": ctx.chip.platform,
                    "toolchain": env.identity(), "graphs": graphs},
            "vendor": {"backend": backend, "toolchain": env.identity(), **figures},
            "estimate": npubuild_estimate(ctx)}


@dataclass
class Ranges:
    """npubuild's calibrated ranges of one NPU graph (``quantize/calibration.json``): of the
    tensors it quantized, and of those it computes inside one integer layer and never
    quantizes (``inner``: a conv's output before its folded bias Add or Relu)."""

    quantized: dict[str, tuple[float, float]]
    inner: dict[str, tuple[float, float]]

    def get(self, name: str) -> tuple[str, tuple[float, float]] | None:
        """(``"quantized"`` | ``"inner"``, range) of tensor ``name``, or None."""
        if name in self.quantized:
            return "quantized", self.quantized[name]
        if name in self.inner:
            return "inner", self.inner[name]
        return None


def calibrated_ranges(qdir: Path) -> dict[str, Ranges]:
    """npubuild's calibrated ranges per NPU graph: what the ``npubuild`` quantizer hands to a
    vendor that takes ranges (TPU-MLIR's calibration table)."""
    path = Path(qdir) / "calibration.json"
    if not path.is_file():
        return {}
    graphs = json_load(path).get("graphs", {})
    return {g: Ranges(*({t: tuple(info["range"]) for t, info in data.get(key, {}).items()
                         if info.get("range")} for key in ("tensors", "inner_tensors")))
            for g, data in graphs.items()}


def float_values(model: onnx.ModelProto, qgraph) -> set[str]:
    """The values of ``model`` (a submodel as the vendor reads it, `vendor_model`) that
    npubuild's integer graph ``qgraph`` keeps in float — quantize's precision decisions: its
    float tensors, and a value computed inside a layer (no tensor of the qgraph) from float
    values only (the Sigmoid inside a SiLU npubuild keeps in float); a model input only float
    layers read is one too."""
    constants = {i.name for i in model.graph.initializer}
    out = {i.name for i in model.graph.input
           if i.name in qgraph.tensors and qgraph.tensors[i.name].is_float}
    for node in model.graph.node:
        inputs = [x for x in node.input if x and x not in constants]
        for t in node.output:
            tensor = qgraph.tensors.get(t)
            if tensor is not None and tensor.is_float or tensor is None and inputs and all(
                    x in out for x in inputs):
                out.add(t)
    return out


def coverage_line(applied: int, entries: int, inner: int, fell_back: list[str], what: str,
                  floats: int = 0) -> str:
    """The report's sentence on how much of npubuild's calibration reached the vendor."""
    line = f"npubuild's ranges applied to {applied} of {entries} {what}"
    if inner:
        line += (f" ({inner} of them tensors npubuild computes inside one integer layer and "
                 "never quantizes: their calibrated range)")
    if floats:
        line += f"; {floats} run in float16 as npubuild keeps them in float (its quantize table)"
    if fell_back:
        line += (f"; {len(fell_back)} kept the vendor's own: " + ", ".join(fell_back[:8])
                 + (" ..." if len(fell_back) > 8 else ""))
    return line


def no_npu(ctx: StageContext, backend: str) -> dict:
    note = "the split placed every node on the CPU: no NPU graph for the vendor to compile"
    write_json(ctx.out / "compile.json", {"graphs": {}, "note": note})
    return {STAGE: {"chip": ctx.chip.name, "backend": backend, "graphs": {}, "npu_graphs": 0,
                    "note": note}}


def require_env(ctx: StageContext, toolchain: str):
    from npubuild import toolchains
    from npubuild.toolchains.env import require

    return require(toolchains.get(toolchain))


def check_outputs(graph: NpuGraph, got: dict, where: str) -> None:
    missing = [t for t in graph.outputs if t not in got]
    if missing:
        raise BuildError(f"{graph.name}: {where} returned no {missing[0]!r}", stage=STAGE)


def against_float(outputs: list[str], got: dict, floats: list[dict]) -> dict:
    """A vendor's outputs on the proof samples (``"<k>:<tensor>"``) against the float submodel,
    per output over all samples: cosine, SQNR and the largest difference."""
    from npubuild.metrics import similarity

    out = {}
    for t in outputs:
        ref = np.concatenate([np.ravel(f[t]) for f in floats])
        val = np.concatenate([np.ravel(got[f"{k}:{t}"]) for k in range(len(floats))])
        s = similarity(ref, val)
        out[t] = {"cosine": round(s.cosine, 6), "sqnr_db": round(s.sqnr_db, 2)
                  if np.isfinite(s.sqnr_db) else None, "max_abs": round(s.max_abs, 6)}
    return out


def reference_agreement(qgraph, outputs: list[str], got: dict, feeds: list[dict]) -> dict:
    """npubuild's integer reference against a vendor runtime given npubuild's quantized model
    (its outputs at npubuild's scale and zero point), on the proof samples ``feeds`` (float;
    the vendor's outputs in ``got`` as ``"<k>:<tensor>"``, dequantized): per output, the
    vendor's values in integer steps of npubuild's quantization — whether they are whole steps
    (the vendor kept npubuild's output quantization), the largest difference from npubuild's
    integers, its 99th percentile and the fraction of elements that differ."""
    from npubuild.quant.reference import quantize_inputs, run_reference

    ours = [run_reference(qgraph, quantize_inputs(qgraph, feed)) for feed in feeds]
    rows = {}
    for t in outputs:
        q = qgraph.tensors[t]
        if q.is_float:
            continue
        theirs = np.concatenate([np.ravel(got[f"{k}:{t}"]) / q.scale + q.zero_point
                                 for k in range(len(feeds))]).astype(np.float64)
        mine = np.concatenate([np.ravel(o[t]) for o in ours]).astype(np.float64)
        steps = np.abs(np.round(theirs) - mine)
        rows[t] = {"whole_steps": bool(np.max(np.abs(theirs - np.round(theirs)), initial=0) < 1e-3),
                   "max_steps": int(steps.max(initial=0)),
                   "p99_steps": float(np.percentile(steps, 99)) if steps.size else 0.0,
                   "differing_fraction": round(float(np.count_nonzero(steps)) / max(steps.size, 1), 6)}
    exact = sum(r["max_steps"] == 0 for r in rows.values())
    worst = max(rows.items(), key=lambda kv: (kv[1]["max_steps"], kv[1]["differing_fraction"]),
                default=None)
    line = f"{exact} of {len(rows)} outputs bit-exact with npubuild's integer reference on {len(feeds)} proof samples"
    if worst and worst[1]["max_steps"]:
        line += (f"; the largest difference {worst[1]['max_steps']} step(s) on {worst[0]} "
                 f"({worst[1]['differing_fraction']:.2%} of its elements)")
    return {"outputs": rows, "bit_exact": exact, "summary": line}


QUANTIZERS = ("vendor", "npubuild")


class VendorBackend:
    """What every vendor backend shares: the recipe's data files in compile's key, the
    quantizers to build, and the inputs they are compared on. Mixed into a `Backend`."""

    proof_samples = 4

    def file_inputs(self, loaded) -> list[Path]:
        from npubuild.stages.files import quantize_files

        return quantize_files(loaded)  # the vendor's calibration, and the verify data compared on

    @staticmethod
    def quantizers(ctx: StageContext) -> list[str]:
        """The deployed quantizer first, then the other when the recipe compares them."""
        spec = ctx.recipe.compile
        return [spec.quantizer] + [q for q in QUANTIZERS if q != spec.quantizer
                                   and spec.compare_quantizers]

    def compare_feeds(self, ctx: StageContext) -> dict[int, list[dict]]:
        """Inputs the quantizers are compared on: the verify data (else the calibration data)."""
        files = (ctx.loaded.resolve_glob(ctx.recipe.verify.data, "verify", "data")
                 if ctx.recipe.verify.data else calibration_files(ctx.loaded))
        return graph_feeds(ctx, files, self.proof_samples)

    def compile(self, ctx: StageContext) -> dict:
        """Every NPU graph through the toolchain (`graph_compiler`), the backend file naming
        what each deploys (`backend_entry`), and the stage's report (`stage_report`)."""
        graphs = npu_graphs(ctx)
        if not graphs:
            return no_npu(ctx, self.name)
        env = require_env(ctx, self.toolchain)
        quantizers = self.quantizers(ctx)
        calibration = calibration_feeds(ctx)
        compare = self.compare_feeds(ctx)
        compile_graph = self.graph_compiler(ctx)
        results = {g.name: compile_graph(ctx, env, g, calibration[g.index], compare[g.index],
                                         quantizers) for g in graphs}
        write_backend_file(ctx.out, self.name, env, {
            name: {"deployed": r["deployed"], **self.backend_entry(name, r)}
            for name, r in results.items()})
        return self.stage_report(ctx, env, results)


class WorkerRunner:
    """A `Runner` backend keeping one toolchain worker per NPU graph (each in a scratch folder
    of its own), started on the graph's first sample and stopped with the runner."""

    def __init__(self, compile_dir: Path):
        from npubuild.backends import BACKEND_FILE

        self.dir = Path(compile_dir).resolve()  # the workers run in folders of their own
        self.info = json_load(self.dir / BACKEND_FILE)
        self.workers: dict[str, tuple] = {}

    #: The scratch folders' prefix (``npubuild-<prefix>-run-*``).
    prefix = "vendor"

    def start(self, name: str, folder: Path):
        """The started `Worker` for graph ``name``, working in ``folder``."""
        raise NotImplementedError

    def check_proof(self, name: str, worker, folder: Path) -> None:
        """Raise unless the started worker reproduces compile's proof outputs."""
        raise NotImplementedError

    def _started(self, name: str) -> tuple:
        """(worker, its folder): on any failure the worker is stopped, its folder removed and
        a vendor error's log kept in the build's ``logs/`` (as compile's are)."""
        folder = Path(tempfile.mkdtemp(prefix=f"npubuild-{self.prefix}-run-"))
        worker = None
        try:
            worker = self.start(name, folder)
            self.check_proof(name, worker, folder)
            return worker, folder
        except BaseException as exc:
            if worker is not None:
                worker.close()
            if isinstance(exc, BuildError):
                keep_failure_logs(exc, folder, self.dir.parent / "logs", f"verify.{name}")
            shutil.rmtree(folder, ignore_errors=True)
            raise

    def run(self, name: str, feeds: dict) -> dict[str, np.ndarray]:
        """The worker's outputs for ``feeds`` (files cross: an npz in, an npz back)."""
        if name not in self.workers:
            self.workers[name] = self._started(name)
        worker, folder = self.workers[name]
        worker(save_npz(folder / "in.npz", dict(feeds)), folder / "out.npz")
        return load_npz(folder / "out.npz")

    def close(self) -> None:
        for worker, folder in self.workers.values():
            worker.close()
            shutil.rmtree(folder, ignore_errors=True)
        self.workers.clear()

    def __del__(self):
        try:
            self.close()
        except Exception:  # interpreter shutdown: the workers end with their pipes
            pass
