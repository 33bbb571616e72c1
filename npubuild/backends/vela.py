"""Arm Ethos-U (U55/U65/U85) through Vela: an integer TFLite → the Vela-compiled TFLite.

Per NPU graph, in ``compile/graph_ir_<i>/``: the ONNX submodel (fused ops inlined), one integer
TFLite per quantizer written by `npubuild.backends.tflite_writer` from an integer graph, and
what Vela made of each (``<graph>.<quantizer>_vela.tflite``, its summary CSV):

- ``npubuild``: npubuild's own integer graph (``quantize/graph_<i>.qgraph.json``: its
  calibration method, precision decisions, int8 weights and corrected biases), tensor for
  tensor; the report counts its tensors and what TFLite's kernels added, and compares
  npubuild's integer reference with TFLite's kernels on the same integer model
  (`npubuild.backends.tflite_check`);
- ``vendor``: the TFLite converter's full-integer defaults (`CONVERTER`: min/max of every
  tensor on the recipe's calibration data) on npubuild's lowering of the submodel; the
  converter itself needs a TensorFlow graph, which an ONNX source does not have.

No Ethos-U simulator exists on PyPI (tflite-micro refuses Vela's custom operator), so the
deployed graph runs as the int8 TFLite Vela consumed, in TensorFlow Lite's reference kernels
(``BUILTIN_REF``), which Ethos-U is specified to match on the operators it runs. Vela is
deterministic, and so is the writer: every byte here is reproducible. Vela's figures (cycles,
inferences/s, SRAM/DRAM/flash bytes, NPU/CPU operators) come from its summary CSV.
"""

from __future__ import annotations

import csv
import shutil
import time
from pathlib import Path

import numpy as np

from npubuild.backends import Backend, register, vendor
from npubuild.backends.vendor import STAGE, NpuGraph
from npubuild.errors import BuildError
from npubuild.toolchains.process import run_worker

WORKER = "vela_worker.py"
ERROR_PATTERNS = (r"^Error: .*$", r"^\w*Error: .*$")
#: The CSV columns reported, under npubuild's names.
CSV_FIGURES = {"cycles_total": "cycles", "inferences_per_second": "inferences_per_second",
               "sram_memory_used": "sram_kib", "dram_memory_used": "dram_kib",
               "off_chip_flash_memory_used": "off_chip_flash_kib",
               "on_chip_flash_memory_used": "on_chip_flash_kib", "nn_macs": "macs",
               "cycles_npu": "cycles_npu", "system_config": "system_config",
               "memory_mode": "memory_mode", "core_clock": "core_clock_hz"}


class Vela(vendor.VendorBackend, Backend):
    name = "vela"
    description = "Arm Vela: full-int8 TFLite -> Ethos-U command stream, proven on the int8 TFLite"
    toolchain = "vela"
    runs_in = ("TensorFlow Lite's reference kernels on the int8 TFLite Vela compiles (Ethos-U "
               "is specified to match them)")

    def graph_compiler(self, ctx):
        return compile_graph

    @staticmethod
    def backend_entry(name: str, result: dict) -> dict:
        return {"tflite": f"{result['context_dir']}/{name}.{result['deployed']}.tflite"}

    def stage_report(self, ctx, env, results: dict) -> dict:
        return report(ctx, env, results)

    def npu_runner(self, compile_dir: Path):
        return TfliteRunner(Path(compile_dir))


#: The TFLite converter's full-integer defaults: min/max of every tensor on the representative
#: data, asymmetric int8 activations, symmetric per-channel int8 weights, no bias correction.
CONVERTER = {"scheme": "asymmetric", "granularity": "per_channel", "method": "minmax",
             "bias_correction": False}


def converter_qgraph(model, feeds: list[dict], name: str):
    """The vendor quantizer for Vela: npubuild's lowering of ``model`` quantized as the TFLite
    converter does (`CONVERTER`) on ``feeds`` (the converter itself needs a TensorFlow graph,
    which an ONNX source does not have)."""
    from npubuild.quant import calibrate
    from npubuild.quant.lower import lower
    from npubuild.quant.quantizer import QuantConfig, quantize_graph

    fg, probe = lower(model)
    observer = calibrate.Observer(fg, probe, CONVERTER["method"])
    for feed in feeds:
        observer.update({t: feed[t] for t in fg.inputs})
    qgraph, _ = quantize_graph(fg, observer.stats, QuantConfig(**CONVERTER), name)
    return qgraph


def quantized_graph(ctx, graph: NpuGraph, quantizer: str, calibration: list[dict]):
    """The integer graph the TFLite is written from: quantize's own (``npubuild``) or the
    converter's min/max (``vendor``)."""
    from npubuild import onnx_io
    from npubuild.quant.qgraph import QGraph

    if quantizer == "npubuild":
        path = Path(ctx.upstream["quantize"]) / f"{graph.name}.qgraph.json"
        if not path.is_file():
            raise BuildError(f"{graph.name}: quantize wrote no {path.name}", stage=STAGE)
        return QGraph.load(path)
    return converter_qgraph(onnx_io.load_model(graph.model_path), calibration, graph.name)


def compile_graph(ctx, env, graph: NpuGraph, calibration: list[dict], compare: list[dict],
                  quantizers: list[str]) -> dict:
    from npubuild import onnx_io
    from npubuild.atomic import write_bytes
    from npubuild.backends.tflite_writer import Unwritable, write_tflite

    folder = ctx.out / graph.context_dir
    onnx_path = vendor.write_vendor_model(graph, ctx.out)
    model = onnx_io.load_model(onnx_path)
    floats = [onnx_io.run(model, f, graph.outputs) for f in compare]
    out = {"context_dir": graph.context_dir, "deployed": quantizers[0], "quantizers": {}}
    for q in quantizers:
        qgraph = quantized_graph(ctx, graph, q, calibration)
        try:
            written = write_tflite(qgraph)
        except Unwritable as exc:
            raise BuildError(f"{graph.name}: cannot write the integer TFLite Vela takes: {exc}",
                             stage=STAGE, hint="keep that node on the CPU (split.force_cpu)") from None
        tflite = write_bytes(folder / f"{graph.name}.{q}.tflite", written.data)
        figures = run_vela(ctx, env, graph, tflite, folder)
        got, start = TfliteModel(tflite), time.perf_counter()
        outputs = {}
        for k, feed in enumerate(compare):
            outputs.update({f"{k}:{t}": v for t, v in got.run(feed, graph.outputs).items()})
        # the reference kernels per image (report.json only: a timing)
        figures["seconds_per_run"] = round((time.perf_counter() - start) / max(len(compare), 1), 3)
        figures["proof"] = vendor.against_float(graph.outputs, outputs, floats)
        figures["tflite_bytes"] = len(written.data)
        figures["quantization"] = quantization_summary(q, written)
        if q == "npubuild":  # the same integer model in npubuild's reference and in TFLite
            from npubuild.backends.tflite_check import integer_agreement

            figures["integer_reference"] = integer_agreement(qgraph, tflite, compare[:1])
        out["quantizers"][q] = figures
    return out


def quantization_summary(quantizer: str, written) -> dict:
    """Whose quantization the TFLite carries, and on how many of its tensors."""
    coverage = written.coverage()
    source = ("npubuild's integer graph (quantize/graph_<i>.qgraph.json)" if quantizer == "npubuild"
              else "min/max on the calibration data, the TFLite converter's defaults")
    extra = coverage["tflite_constraints"]
    line = (f"{source}: its parameters on {coverage['npubuild']} of {coverage['tensors']} "
            "activation tensors")
    if extra:
        line += (f"; {len(extra)} more at a quantization a TFLite kernel fixes, requantized by "
                 f"{coverage['requantizations']} QUANTIZE op(s): "
                 + ", ".join(f"{t} ({why})" for t, why in list(extra.items())[:5])
                 + (" ..." if len(extra) > 5 else ""))
    return {"summary": line, **coverage}


def run_vela(ctx, env, graph: NpuGraph, tflite: Path, folder: Path) -> dict:
    with vendor.workdir("vela", vendor.logs_dir(ctx), f"compile.{tflite.stem}") as work:
        job = {"tflite": str(tflite.resolve()), "accelerator": ctx.chip.platform,
               "output_dir": str(work / "out")}
        result = run_worker(env, WORKER, job, work, stage=STAGE, graph=graph.name,
                            patterns=ERROR_PATTERNS)
        compiled = folder / Path(result["compiled"]).name
        shutil.copyfile(result["compiled"], compiled)
        figures = {"npu_ops": result["npu_ops"], "cpu_ops": result["cpu_ops"],
                   "artifact": compiled.name, "artifact_bytes": compiled.stat().st_size}
        if result.get("summary"):
            summary = folder / Path(result["summary"]).name
            shutil.copyfile(result["summary"], summary)
            figures.update(summary_figures(summary))
        vendor.keep_log(work / "vela_worker.log", folder / f"{tflite.stem}.vela.log", work, folder)
    return figures


def summary_figures(path: Path) -> dict:
    """Vela's summary CSV row under npubuild's names (KiB figures as bytes too)."""
    with open(path, newline="", encoding="utf-8") as fh:
        row = next(csv.DictReader(fh))
    out = {}
    for column, name in CSV_FIGURES.items():
        value = row.get(column)
        if value is None:
            continue
        try:
            number = float(value)
        except ValueError:
            out[name] = value
            continue
        if name.endswith("_kib"):
            out[name.replace("_kib", "_bytes")] = int(round(number * 1024))
        else:
            out[name] = int(number) if number.is_integer() else round(number, 2)
    return out


def report(ctx, env, results: dict) -> dict:
    graphs = {name: {"deployed": r["deployed"], "quantizers": r["quantizers"]}
              for name, r in results.items()}
    deployed = [r["quantizers"][r["deployed"]] for r in results.values()]
    cycles = sum(d.get("cycles", 0) for d in deployed)
    clock = deployed[0].get("core_clock_hz", 0)
    figures = {"npu_ops": sum(d["npu_ops"] for d in deployed),
               "cpu_ops": sum(d["cpu_ops"] for d in deployed), "cycles": cycles,
               "seconds_per_run": round(sum(d.get("seconds_per_run", 0) for d in deployed), 3),
               "inferences_per_second": round(clock / cycles, 2) if cycles and clock else None,
               "artifact_bytes": sum(d["artifact_bytes"] for d in deployed),
               "sram_bytes": max(d.get("sram_bytes", 0) for d in deployed),
               "dram_bytes": max(d.get("dram_bytes", 0) for d in deployed),
               "off_chip_flash_bytes": sum(d.get("off_chip_flash_bytes", 0) for d in deployed),
               "system_config": deployed[0].get("system_config"), "reproducible": True}
    return vendor.stage_report(ctx, env, "vela", graphs, figures)


class TfliteModel:
    """One int8 TFLite in TensorFlow Lite's reference kernels, fed and read in ONNX's terms
    (float values, NCHW for 4-D tensors): the host's quantize and transpose at the boundary."""

    def __init__(self, path: Path):
        import warnings

        from npubuild.frontends.tensorflow import _tensorflow

        tf = _tensorflow()  # one way in: quiet logs, absl kept off doit's stderr, the tf extra's hint
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # tf.lite.Interpreter's move-to-LiteRT notice
            self.interpreter = tf.lite.Interpreter(
                model_path=str(path),
                experimental_op_resolver_type=tf.lite.experimental.OpResolverType.BUILTIN_REF)
        self.interpreter.allocate_tensors()
        self.inputs = {d["name"]: d for d in self.interpreter.get_input_details()}
        self.outputs = {d["name"]: d for d in self.interpreter.get_output_details()}

    def run(self, feeds: dict, names: list[str]) -> dict[str, np.ndarray]:
        for name, detail in self.inputs.items():
            value = np.asarray(feeds[name], np.float32)
            value = value.transpose(0, 2, 3, 1) if value.ndim == 4 else value
            scale, zero = detail["quantization"]
            info = np.iinfo(detail["dtype"])
            self.interpreter.set_tensor(detail["index"], np.clip(
                np.round(value / scale) + zero, info.min, info.max).astype(detail["dtype"]))
        self.interpreter.invoke()
        out = {}
        for name in names:
            detail = self.outputs[name]
            scale, zero = detail["quantization"]
            value = (self.interpreter.get_tensor(detail["index"]).astype(np.float32) - zero) * scale
            out[name] = value.transpose(0, 3, 1, 2) if value.ndim == 4 else value
        return out


class TfliteRunner:
    """`Runner` backend: each NPU graph's deployed int8 TFLite (`TfliteModel`)."""

    def __init__(self, compile_dir: Path):
        from npubuild.backends import BACKEND_FILE

        self.dir = compile_dir
        self.info = vendor.json_load(compile_dir / BACKEND_FILE)
        self.models: dict[str, TfliteModel] = {}

    def __call__(self, graph, feeds) -> dict:
        if graph.name not in self.models:
            self.models[graph.name] = TfliteModel(self.dir / self.info["graphs"][graph.name]["tflite"])
        return self.models[graph.name].run(feeds, list(graph.outputs))


register(Vela())
