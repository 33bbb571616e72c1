"""TPU-MLIR in its own environment (Python 3.10): ONNX -> bmodel, run on its cmodel simulator.

Job (build): onnx, name, chip, input_shapes, data_list (npz files, one per calibration sample),
cali_table (optional: use this table instead of running run_calibration), quantize_table
(optional: ops to run in another mode than INT8, model_deploy's --quantize_table), test_input (npz) and
the output folder. Steps are TPU-MLIR's own tools, found on PATH (the environment's bin leads
it: its scripts start with ``/usr/bin/env python3``): model_transform.py, run_calibration.py,
model_deploy.py --quantize INT8, then model_runner.py on the test input.
Job (run, --serve): bmodel; each request runs model_runner.py on one input npz.
"""

import glob
import os
import re
import shutil
import subprocess
import time

import numpy as np
from _protocol import main


def _tool(args, what):
    done = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    print(done.stdout, flush=True)
    if done.returncode != 0:
        lines = [l for l in done.stdout.splitlines() if l.strip()]
        raise RuntimeError(f"{what} failed: {lines[-1] if lines else done.returncode}")
    return done.stdout


def build(spec):
    out = spec["output_dir"]
    os.makedirs(out, exist_ok=True)
    name = spec["name"]
    mlir = os.path.join(out, f"{name}.mlir")
    shapes = "[" + ",".join("[" + ",".join(str(d) for d in s) + "]" for s in spec["input_shapes"]) + "]"
    _tool(["model_transform.py", "--model_name", name, "--model_def", spec["onnx"],
           "--input_shapes", shapes, "--mlir", mlir], "model_transform.py")
    table = spec.get("cali_table")
    if not table:
        table = os.path.join(out, f"{name}_cali_table")
        with open(os.path.join(out, "data_list.txt"), "w") as f:
            f.write("\n".join(spec["data_list"]) + "\n")
        _tool(["run_calibration.py", mlir, "--data_list", os.path.join(out, "data_list.txt"),
               "--input_num", str(len(spec["data_list"])), "-o", table], "run_calibration.py")
    bmodel = os.path.join(out, f"{name}.bmodel")
    qtable = ["--quantize_table", spec["quantize_table"]] if spec.get("quantize_table") else []
    _tool(["model_deploy.py", "--mlir", mlir, "--quantize", "INT8", "--calibration_table", table,
           *qtable, "--chip", spec["chip"], "--model", bmodel], "model_deploy.py")
    result = {"bmodel": bmodel, "cali_table": table, **_figures(bmodel, out, name)}
    if spec.get("test_inputs"):
        outputs, start = {}, time.perf_counter()
        for k, path in enumerate(spec["test_inputs"]):
            for key, value in _run(bmodel, path, os.path.join(out, f"run_{k}.npz")).items():
                outputs[f"{k}:{key}"] = value
        result["seconds_per_run"] = (time.perf_counter() - start) / len(spec["test_inputs"])
        np.savez(spec["proof_outputs"], **outputs)
    return result


def _figures(bmodel, out, name):
    """The bmodel's device memory (model_tool --info) and its TPU and CPU ops (the tpu dialect
    model_deploy lowered to: a GenericCpu op runs on the host CPU)."""
    info = _tool(["model_tool", "--info", bmodel], "model_tool --info")
    figures = {}
    found = re.search(r"device mem size: (\d+) \(weight: (\d+), instruct: (\d+), runtime: (\d+)\)", info)
    if found:
        for key, value in zip(("device_memory_bytes", "weight_memory_bytes",
                               "instruction_bytes", "runtime_memory_bytes"), found.groups()):
            figures[key] = int(value)
    tpu = glob.glob(os.path.join(os.getcwd(), f"{name}_*_tpu.mlir")) + glob.glob(
        os.path.join(out, f"{name}_*_tpu.mlir"))
    if tpu:
        ops = re.findall(r'"tpu\.(\w+)"', open(tpu[0]).read())
        figures["cpu_ops"] = sum(op == "GenericCpu" for op in ops)
        figures["npu_ops"] = len(ops) - figures["cpu_ops"]
    return figures


def _run(bmodel, inputs, output):
    _tool(["model_runner.py", "--input", inputs, "--model", bmodel, "--output", output],
          "model_runner.py")
    with np.load(output) as npz:
        return {k: np.asarray(npz[k], np.float32) for k in npz.files}


def serve(spec):
    # model_runner unpacks a bmodel into a folder beside it: run a copy in this worker's folder,
    # never the build's artifact in place
    bmodel = shutil.copy(spec["bmodel"], os.path.basename(spec["bmodel"]))

    def run(inputs, outputs):
        values = _run(bmodel, inputs, outputs + ".raw.npz")
        np.savez(outputs, **values)
        shutil.os.remove(outputs + ".raw.npz")

    return run


if __name__ == "__main__":
    main(build, serve)
