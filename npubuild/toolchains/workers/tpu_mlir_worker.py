"""TPU-MLIR in its own environment (Python 3.10): ONNX -> bmodel, run on its cmodel simulator.

Job (build): onnx, name, chip, input_shapes, data_list (npz files, one per calibration sample),
cali_table (optional: use this table instead of running run_calibration), test_input (npz) and
the output folder. Steps are TPU-MLIR's own tools, found on PATH (the environment's bin leads
it: its scripts start with ``/usr/bin/env python3``): model_transform.py, run_calibration.py,
model_deploy.py --quantize INT8, then model_runner.py on the test input.
Job (run, --serve): bmodel; each request runs model_runner.py on one input npz.
"""

import os
import shutil
import subprocess

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
    _tool(["model_deploy.py", "--mlir", mlir, "--quantize", "INT8", "--calibration_table", table,
           "--chip", spec["chip"], "--model", bmodel], "model_deploy.py")
    result = {"bmodel": bmodel, "cali_table": table}
    if spec.get("test_inputs"):
        outputs = {}
        for k, path in enumerate(spec["test_inputs"]):
            for key, value in _run(bmodel, path, os.path.join(out, f"run_{k}.npz")).items():
                outputs[f"{k}:{key}"] = value
        np.savez(spec["proof_outputs"], **outputs)
    return result


def _run(bmodel, inputs, output):
    _tool(["model_runner.py", "--input", inputs, "--model", bmodel, "--output", output],
          "model_runner.py")
    with np.load(output) as npz:
        return {k: np.asarray(npz[k], np.float32) for k in npz.files}


def serve(spec):
    def run(inputs, outputs):
        values = _run(spec["bmodel"], inputs, outputs + ".raw.npz")
        np.savez(outputs, **values)
        shutil.os.remove(outputs + ".raw.npz")

    return run


if __name__ == "__main__":
    main(build, serve)
