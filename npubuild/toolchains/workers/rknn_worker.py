"""rknn-toolkit2 in its own environment: ONNX -> .rknn, and its PC simulator.

Job: onnx, platform, inputs (names), outputs (names), quantize (true/false), dataset (a list of
.npz files, one per calibration sample, arrays by input name), quantized_algorithm,
disable_rules, export (the .rknn path), proof (an .npz of inputs whose simulator outputs are
written to proof_outputs). The simulator runs only a model built in the same process
(``load_rknn`` + simulator is refused), so `--serve` builds again from the same job.
"""

import os
import time

import numpy as np
from _protocol import main

def _dataset(spec):
    """RKNN's dataset file: one line per sample, one .npy per input (paths relative to it)."""
    if not spec.get("dataset"):
        return None
    os.makedirs("dataset", exist_ok=True)
    lines = []
    for i, path in enumerate(spec["dataset"]):
        with np.load(path) as npz:
            names = []
            for j, name in enumerate(spec["inputs"]):
                np.save(f"dataset/s{i}_{j}.npy", npz[name])
                names.append(f"s{i}_{j}.npy")
        lines.append(" ".join(names))
    with open("dataset/list.txt", "w") as f:
        f.write("\n".join(lines) + "\n")
    return "dataset/list.txt"


def _build(spec):
    from rknn.api import RKNN

    rknn = RKNN(verbose=True)
    options = {"target_platform": spec["platform"],
               "quantized_algorithm": spec.get("quantized_algorithm", "normal"),
               "optimization_level": spec.get("optimization_level", 3)}
    if spec.get("disable_rules"):
        options["disable_rules"] = list(spec["disable_rules"])
    _check(rknn.config(**options), "config", rknn)
    _check(rknn.load_onnx(spec["onnx"], inputs=spec["inputs"],
                          input_size_list=spec["input_shapes"], outputs=spec["outputs"]),
           "load_onnx", rknn)
    _check(rknn.build(do_quantization=bool(spec["quantize"]), dataset=_dataset(spec)),
           "build", rknn)
    return rknn


def _check(code, step, rknn):
    if code != 0:
        raise RuntimeError(f"rknn.{step} returned {code}")


def _inference(rknn, spec, feeds):
    arrays = [np.ascontiguousarray(feeds[name]) for name in spec["inputs"]]
    # one layout string per input: the toolkit applies it to 4-D inputs only, and stops on a
    # None ("'NoneType' object has no attribute 'lower'") for an input of another rank
    formats = ["nchw"] * len(arrays)
    outputs = rknn.inference(inputs=arrays, data_format=formats)
    if outputs is None:
        raise RuntimeError("rknn.inference returned nothing")
    return {name: np.asarray(v, np.float32) for name, v in zip(spec["outputs"], outputs)}


def build(spec):
    rknn = _build(spec)
    _check(rknn.export_rknn(spec["export"]), "export_rknn", rknn)
    result = {"export": spec["export"]}
    if spec.get("proof"):
        _check(rknn.init_runtime(), "init_runtime", rknn)
        outputs, seconds = {}, 0.0
        for k, path in enumerate(spec["proof"]):
            with np.load(path) as npz:
                feeds = {name: npz[name] for name in npz.files}
            start = time.perf_counter()
            for name, value in _inference(rknn, spec, feeds).items():
                outputs[f"{k}:{name}"] = value
            seconds += time.perf_counter() - start
        np.savez(spec["proof_outputs"], **outputs)
        result["seconds_per_run"] = seconds / len(spec["proof"])  # the simulator, per image
    rknn.release()
    return result


def serve(spec):
    rknn = _build(spec)
    _check(rknn.init_runtime(), "init_runtime", rknn)

    def run(inputs, outputs):
        with np.load(inputs) as npz:
            feeds = {k: npz[k] for k in npz.files}
        np.savez(outputs, **_inference(rknn, spec, feeds))

    return run


if __name__ == "__main__":
    main(build, serve)
