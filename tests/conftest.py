"""Shared fixtures: the repo, a CLI runner, tiny recipes, and the shared YOLOv8n build.

Real-model builds go through one session-scoped build and cache directory, so every slow test
after the first reuses artifacts instead of rebuilding them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
import pytest

REPO = Path(__file__).resolve().parent.parent
TINY_MODEL = REPO / "tests" / "data" / "tiny.onnx"
#: Python source defining ``executed(name)`` for a child process: whether module ``name`` has run.
#: A module imported lazily (lazy_loader) is in sys.modules, unexecuted, until first used.
EXECUTED = ("import importlib.util, sys\n"
            "def executed(name):\n"
            "    module = sys.modules.get(name)\n"
            "    return module is not None and type(module) is not importlib.util._LazyModule\n")


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(*args: str, cwd: Path = REPO, env: dict | None = None, timeout: float = 600) -> CliResult:
    """Run the real `npubuild` command (as ``python -m npubuild``) and capture its output."""
    full_env = {**os.environ, "COLUMNS": "200", "TERM": "dumb", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "npubuild", *args], cwd=cwd, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
    return CliResult(proc.returncode, proc.stdout, proc.stderr)


@pytest.fixture
def cli():
    return run_cli


def json_shape(value, *, any_json=("old", "new")):
    """A JSON document's shape, for golden files: keys kept, leaves as their type name, a list
    as its items' distinct shapes; values under the keys ``any_json`` are just "json"."""
    if isinstance(value, dict):
        return {k: "json" if k in any_json else json_shape(v, any_json=any_json)
                for k, v in value.items()}
    if isinstance(value, list):
        import json

        shapes = [json_shape(v, any_json=any_json) for v in value]
        return list({json.dumps(s, sort_keys=True): s for s in shapes}.values())
    return type(value).__name__


def write_recipe(directory: Path, body: str, name: str = "recipe.yaml") -> Path:
    path = directory / name
    path.write_text(textwrap.dedent(body))
    return path


NPY_RECIPE = """\
version: 1
name: {name}
model:
  path: {model}
  inputs: [{{name: x, shape: {shape}}}]
target: {target}
quantization:
  calibration: {{data: "data/cal_*.npy", samples: {cal}}}
{quantization}verify:
  data: "data/ver_*.npy"
  samples: {ver}
  min_cosine: 0.99
"""


def build_on_npy_data(root: Path, name: str, model_file: str, model, data, *,
                      target: str = "npu-16m", quantization: str = "") -> tuple[CliResult, Path]:
    """Build recipe ``name``: the model ``model()`` (saved once as ``root/model_file``) on an
    input ``x`` calibrated and verified with ``data()``'s ``{"cal": [...], "ver": [...]}``
    arrays (written once as ``root/data/<kind>_<i>.npy``), ``quantization`` lines added under
    ``quantization:``; the CLI's result and the build folder."""
    if not (root / model_file).is_file():
        model_proto = model()
        onnx.save(model_proto, root / model_file)
        (root / "data").mkdir()
        for kind, samples in data().items():
            for i, x in enumerate(samples):
                np.save(root / "data" / f"{kind}_{i}.npy", np.asarray(x, np.float32))
    samples = {kind: len(list((root / "data").glob(f"{kind}_*.npy"))) for kind in ("cal", "ver")}
    shape = [d.dim_value for d in onnx.load(root / model_file).graph.input[0].type.tensor_type.shape.dim]
    recipe = write_recipe(root, NPY_RECIPE.format(
        name=name, model=model_file, shape=shape, target=target, quantization=quantization,
        cal=samples["cal"], ver=samples["ver"]), f"{name}.yaml")
    result = run_cli("run", str(recipe), "--build-dir", str(root / "build"),
                     "--cache", str(root / "cache"))
    return result, root / "build" / name


TINY_RECIPE = f"""\
version: 1
name: tiny
model:
  path: {TINY_MODEL}
  inputs:
    - name: x
      shape: [1, 3, 8, 8]
      preprocess: {{resize: [8, 8], scale: 0.00392156862745098}}
quantization:
  scheme: symmetric
  calibration: {{data: "pkg:skimage/data/[a-c]*.png", samples: 2}}
  granularity: per_tensor
"""


@pytest.fixture
def tiny_recipe(tmp_path) -> Path:
    return write_recipe(tmp_path, TINY_RECIPE)


def shared_root(tmp_path_factory) -> Path:
    """A directory all pytest-xdist workers share (npubuild's own lock keeps them apart)."""
    base = tmp_path_factory.getbasetemp()
    root = (base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base) / "npubuild-shared"
    root.mkdir(exist_ok=True)
    return root


@pytest.fixture(scope="session")
def shared_cache(tmp_path_factory) -> Path:
    """One content cache for the whole test run (what a CI cache would be)."""
    return shared_root(tmp_path_factory) / "cache"


@pytest.fixture(scope="session")
def yolov8_build(tmp_path_factory, shared_cache):
    """Build recipes/yolov8.yaml once per test run (all workers share it), as far as the
    pipeline goes today; later stages' tests read its artifacts."""
    build_root = shared_root(tmp_path_factory) / "build"
    result = run_cli("run", "recipes/yolov8.yaml", "--build-dir", str(build_root),
                     "--cache", str(shared_cache))
    assert result.returncode == 0, result.stderr
    return build_root / "yolov8n", result


PPOCR_CLS_RECIPE = """\
version: 1
name: {name}
model:
  path: pkg:rapidocr_onnxruntime/models/ch_ppocr_mobile_v2.0_cls_infer.onnx
  inputs:
    - name: x
      shape: [1, 3, 48, 192]
      layout: NCHW
      preprocess: {{resize: [48, 192], scale: 0.00784313725490196, mean: 1.0}}
fusion: [conv_bn, hard_swish]
split: {{policy: {policy}}}
quantization:
  calibration: {{data: "pkg:skimage/data/text.png", samples: 1}}
verify: {{data: "pkg:skimage/data/text.png", samples: 1, min_cosine: 0.9}}
"""


def ppocr_cls_build(tmp_path_factory, shared_cache, policy: str) -> tuple[Path, CliResult]:
    """PP-OCR's direction classifier (rapidocr-onnxruntime) built end to end once per run."""
    root = shared_root(tmp_path_factory)
    name = f"ppocr-cls-{policy.replace('_', '-')}"
    recipe = write_recipe(root, PPOCR_CLS_RECIPE.format(name=name, policy=policy), f"{name}.yaml")
    result = run_cli("run", str(recipe), "--build-dir", str(root / "build"),
                     "--cache", str(shared_cache))
    return root / "build" / name, result


@pytest.fixture(scope="session")
def ppocr_cls(tmp_path_factory, shared_cache):
    return ppocr_cls_build(tmp_path_factory, shared_cache, "npu_first")


def one_npu_graph_split(directory: Path, nodes: list, initializers: list, shape: list[int],
                        out_shape: list[int] | None = None, opset: int = 17) -> Path:
    """A split directory holding one NPU graph from ``x`` to ``y`` (float, ``shape`` both, or
    ``out_shape`` for ``y``) made of ``nodes`` (ONNX ``opset``): what the quantize stage reads,
    for tests of quantization on a tiny model."""
    import onnx
    from onnx import helper

    from npubuild.split import graph_infos

    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", 1, shape)],
                              [helper.make_tensor_value_info("y", 1, out_shape or shape)],
                              initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
    model.ir_version = 8 if opset <= 17 else 10
    split = directory / "split"
    split.mkdir()
    onnx.save(model, split / "graph_0.onnx")
    graph_infos.write(split / "graph_infos.json", graph_infos.build(
        [("npu", ["x"], ["y"])], {"x": shape, "y": out_shape or shape}, ["x"], ["y"]))
    return split
