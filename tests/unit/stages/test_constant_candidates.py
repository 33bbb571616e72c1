"""A quantized constant operand (a BatchNorm's per-channel scale written as a Mul constant, a
window) is a precision-search candidate like an activation (issue 21's class): one int8 scale
for a scale vector that spans 0.15 … 100 rounds the small entries to 0 or 1 step, whatever
the activations' precision. On a chip with int16 the search may keep that constant in int16
(or in float, its reader on the CPU), scored with the quantizer's own values of it, and the
integer reference runs the int16 constant bit-exact against the simulator."""

from __future__ import annotations

import json

import numpy as np
import onnx
from onnx import helper, numpy_helper

from tests.conftest import run_cli, write_recipe

SHAPE = [1, 4, 6, 6]
SCALE = np.array([100.0, 0.15, 0.2, 0.25])  # one per channel, as a BatchNorm's
HEAD = np.array([0.0, 1.0, -1.0, 1.0])     # the output reads the small channels only

RECIPE = """\
version: 1
name: {name}
model:
  path: scaled.onnx
  inputs: [{{name: x, shape: [1, 4, 6, 6]}}]
target: npu-16m
quantization:
  calibration: {{data: "data/cal_*.npy", samples: 4}}
{extra}verify:
  data: "data/ver_*.npy"
  samples: 3
  min_cosine: 0.99
"""


def scaled_model() -> onnx.ModelProto:
    """x → Relu → Mul by a per-channel constant ``scale`` (4 values) → Conv 1×1 (4 → 1)."""
    inits = [numpy_helper.from_array(SCALE.reshape(1, 4, 1, 1).astype(np.float32), "scale"),
             numpy_helper.from_array(HEAD.reshape(1, 4, 1, 1).astype(np.float32), "head_w")]
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "scale"], ["m"], name="bn_scale"),
             helper.make_node("Conv", ["m", "head_w"], ["y"], name="head")]
    graph = helper.make_graph(nodes, "scaled", [helper.make_tensor_value_info("x", 1, SHAPE)],
                              [helper.make_tensor_value_info("y", 1, [1, 1, 6, 6])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _samples(n: int, seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    return [rng.uniform(-1.0, 2.0, SHAPE).astype(np.float32) for _ in range(n)]


def _run(root, name: str, extra: str = ""):
    if not (root / "scaled.onnx").is_file():
        onnx.save(scaled_model(), root / "scaled.onnx")
        (root / "data").mkdir()
        for kind, samples in (("cal", _samples(4, 0)), ("ver", _samples(3, 1))):
            for i, x in enumerate(samples):
                np.save(root / "data" / f"{kind}_{i}.npy", x)
    recipe = write_recipe(root, RECIPE.format(name=name, extra=extra), f"{name}.yaml")
    result = run_cli("run", str(recipe), "--build-dir", str(root / "build"),
                     "--cache", str(root / "cache"))
    return result, root / "build" / name


def test_the_search_keeps_a_constant_in_int16_where_int16_activations_are_not_enough(tmp_path):
    result, out = _run(tmp_path, "scaled", "  auto: {precision: int16}\n")
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    assert not report["quantization"]["int8_verdict"]["passed"]
    search = json.loads((out / "quantize" / "search.json").read_text())
    chosen = {c["tensor"]: c["precision"] for c in search["chosen"]}
    assert search["passed"] and chosen.get("scale") == "int16"
    qgraph = json.loads((out / "quantize" / "graph_0.qgraph.json").read_text())
    assert qgraph["tensors"]["scale"]["dtype"] == "int16"
    assert report["simulator"]["bit_exact"]
    assert report["accuracy"]["outputs"]["y"]["cosine"] >= 0.99
    assert "scale" in (out / "recipe.lock").read_text()
