"""rknn-toolkit2 in its own environment: ONNX -> .rknn, and its PC simulator.

Job: onnx, platform, inputs (names), outputs (names), quantize (true/false), dataset (a list of
.npz files, one per calibration sample, arrays by input name), quantized_algorithm,
disable_rules, export (the .rknn path), proof (an .npz of inputs whose simulator outputs are
written to proof_outputs). The simulator runs only a model built in the same process
(``load_rknn`` + simulator is refused), so `--serve` builds again from the same job.
"""

import hashlib
import os
import time

import numpy as np
from _protocol import main

# The toolkit cuts a tensor name longer than 128 ("limit model tensor name to 128!") and then
# looks the tensor's range up by its full name: a TFLite export's fused names ("model_1/
# activation_6/Relu;model_1/batch_normalization_6/FusedBatchNormV3;...") stopped its build with
# a KeyError. It also names tensors it makes after their source plus a suffix ("...__0"), and a
# name cut to exactly 128 failed the same way: names stay well under.
NAME_LIMIT = 96

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


def _short_names(spec):
    """``spec`` on a copy of its model whose tensor names longer than `NAME_LIMIT` are cut
    (with a digest of the whole name, so they stay distinct), and the names given, by new name
    (empty when none is that long). Inputs and outputs are matched by position, so only the
    toolkit sees the new names."""
    import onnx

    model = onnx.load(spec["onnx"])
    graph = model.graph
    values = [*graph.input, *graph.output, *graph.value_info]
    names = {v.name for v in values} | {t.name for t in graph.initializer}
    names |= {n for node in graph.node for n in [*node.input, *node.output]}
    renamed = {}
    for name in sorted(n for n in names if len(n) > NAME_LIMIT):
        digest = hashlib.sha256(name.encode("utf-8")).hexdigest()[:16]
        renamed[name] = f"{name[:NAME_LIMIT - len(digest) - 1]}_{digest}"
    if not renamed:
        return spec, {}
    for value in [*values, *graph.initializer]:
        value.name = renamed.get(value.name, value.name)
    for node in graph.node:
        node.input[:] = [renamed.get(n, n) for n in node.input]
        node.output[:] = [renamed.get(n, n) for n in node.output]
    path = os.path.abspath("short_names.onnx")
    onnx.save(model, path)
    short = {**spec, "onnx": path, "inputs": [renamed.get(n, n) for n in spec["inputs"]],
             "outputs": [renamed.get(n, n) for n in spec["outputs"]]}
    return short, {new: old for old, new in renamed.items()}


def _build(spec):
    """The toolkit's model of ``spec``'s ONNX (built, not exported) and the tensor names it
    was given in place of the model's own (`_short_names`)."""
    from rknn.api import RKNN

    short, renamed = _short_names(spec)
    rknn = RKNN(verbose=True)
    options = {"target_platform": spec["platform"],
               "quantized_algorithm": spec.get("quantized_algorithm", "normal"),
               "optimization_level": spec.get("optimization_level", 3)}
    if spec.get("disable_rules"):
        options["disable_rules"] = list(spec["disable_rules"])
    _check(rknn.config(**options), "config", rknn)
    _check(rknn.load_onnx(short["onnx"], inputs=short["inputs"],
                          input_size_list=spec["input_shapes"], outputs=short["outputs"]),
           "load_onnx", rknn)
    _check(rknn.build(do_quantization=bool(spec["quantize"]), dataset=_dataset(spec)),
           "build", rknn)
    return rknn, renamed


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
    rknn, renamed = _build(spec)
    _check(rknn.export_rknn(spec["export"]), "export_rknn", rknn)
    result = {"export": spec["export"], "renamed": renamed}
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
    rknn, _ = _build(spec)
    _check(rknn.init_runtime(), "init_runtime", rknn)

    def run(inputs, outputs):
        with np.load(inputs) as npz:
            feeds = {k: npz[k] for k in npz.files}
        np.savez(outputs, **_inference(rknn, spec, feeds))

    return run


if __name__ == "__main__":
    main(build, serve)
