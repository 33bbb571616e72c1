"""The compile stage: artifacts, the in-stage proof, no-fit handling, and YOLOv8n end to end."""

from __future__ import annotations

import json
import os

import jsonschema
import numpy as np
import pytest
from onnx import helper

from npubuild import schemas
from npubuild.errors import BuildError
from npubuild.recipe import load_recipe
from npubuild.stages import StageContext
from npubuild.stages import compile as compile_stage
from npubuild.targets import load_chip
from npubuild.targets.model import Chip
from tests.conftest import REPO, run_cli, shared_root
from tests.unit.npu.qstacks import Stack, quantize

RECIPE = """\
version: 1
name: t
model: {{path: m.onnx, inputs: [{{name: x, shape: [1, 16, 96, 128]}}]}}
target: npu-tiny
compile: {{layer_group: {group}, on_no_fit: {no_fit}, proof_samples: 2}}
"""


def _quantized_dir(tmp_path, sample: bool = False):
    s = Stack((1, 16, 96, 128))
    a = s.conv("x", 16, 3)
    b = s.pool(s.conv(a, 16, 3, 2), "max", 3, 1, 1)
    qgraph = quantize(s.model([s.conv(s.binary(b, s.conv(b, 16, 1)), 8, 3)]))
    qdir = tmp_path / "quantize"
    qgraph.save(qdir / "graph_0.qgraph.json")
    (qdir / "calibration.json").write_text(json.dumps(
        {"graphs": {"graph_0": {"tensors": {"x": {"range": [-1.0, 1.5]}}}}}))
    if sample:
        np.savez(qdir / "graph_0.sample.npz",
                 x=np.random.default_rng(9).uniform(-1, 1.5, (1, 16, 96, 128)).astype(np.float32))
    return qdir, qgraph


def _context(tmp_path, qdir, chip=None, group="true", no_fit="error") -> StageContext:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(group=group, no_fit=no_fit))
    loaded = load_recipe(recipe, check_files=False)
    out = tmp_path / "build" / "compile"
    out.mkdir(parents=True)
    return StageContext(loaded, chip or loaded.chip(), {"quantize": qdir}, out)


def test_stage_writes_plan_program_timelines_and_ir_and_proves_bit_exactness(tmp_path):
    qdir, qgraph = _quantized_dir(tmp_path, sample=True)
    ctx = _context(tmp_path, qdir)
    report = compile_stage.run(ctx)
    proof = report["simulator"]["graphs"]["graph_0"]
    assert report["simulator"]["bit_exact"] and proof["tensors_compared"] >= 1
    assert proof["samples"][-1] == "real sample (graph_0.sample.npz)" and len(proof["samples"]) == 3
    summary = report["compile"]["graphs"]["graph_0"]
    assert summary["h_sliced_groups"] >= 1 and summary["tiled_layers"] == len(qgraph.layers)
    est = report["estimate"]
    for key in ("cycles", "gmem_bytes", "gmem_bytes_no_grouping", "lmem_peak_bytes", "fps"):
        assert est[key] > 0 and est["graphs"]["graph_0"][key] == est[key]
    assert est["gmem_bytes_lower_bound"] <= est["gmem_bytes"] <= est["gmem_bytes_no_grouping"]
    graph_dir = ctx.out / "graph_0"
    plan = json.loads((graph_dir / "plan.json").read_text())
    assert plan["format"] == "npubuild.program/1" and plan["estimate"]["cycles"] > 0
    assert {g["index"] for g in plan["groups"]} == {
        int(p.stem.rsplit("_", 1)[1]) for p in graph_dir.glob("lmem_group_*.svg")}
    assert (graph_dir / "program.npz").is_file()
    ir = json.loads((ctx.out / "graph_ir_0" / "graph_0.json").read_text())
    jsonschema.validate(ir, schemas.load("npu_ir"))
    assert ir["sample"] == "real sample (graph_0.sample.npz)"


def test_without_layer_groups_the_baseline_is_the_program(tmp_path):
    qdir, _ = _quantized_dir(tmp_path)
    report = compile_stage.run(_context(tmp_path, qdir, group="false"))
    est = report["estimate"]
    assert est["gmem_bytes"] == est["gmem_bytes_no_grouping"]
    assert est["groups"] == report["compile"]["graphs"]["graph_0"]["tiled_layers"]


def test_a_simulator_difference_fails_the_build_naming_group_slice_and_tensor(tmp_path,
                                                                              monkeypatch):
    from npubuild.runtime import simulator

    qdir, _ = _quantized_dir(tmp_path)
    real = simulator._run_kernel

    def off_by_one_in_slice_1(layer, xs, step):
        outs = real(layer, xs, step)
        if layer.kind == "conv" and step["outputs"][0]["rows"][0] > 0:
            outs[0] = outs[0].copy()
            outs[0].flat[0] ^= 1
        return outs

    monkeypatch.setattr(simulator, "_run_kernel", off_by_one_in_slice_1)
    with pytest.raises(BuildError) as failure:
        compile_stage.run(_context(tmp_path, qdir))
    message = str(failure.value)
    assert message.startswith("compile: graph_0 group ") and " slice " in message
    assert "differs from the integer reference" in message and "tensor '" in message


def _small_lmem(bytes_per_lane: int) -> Chip:
    data = load_chip("npu-tiny").model_dump(exclude_unset=True)
    return Chip(**{**data, "lmem_bytes_per_lane": bytes_per_lane, "lmem_banks": 1})


def test_a_layer_that_fits_nowhere_is_an_error_naming_it_or_moves_to_the_cpu(tmp_path):
    qdir, qgraph = _quantized_dir(tmp_path)
    with pytest.raises(BuildError, match=r"does not fit in LMEM even alone: it needs \d+ bytes "
                                         r"per lane.*LMEM has 1024 bytes per lane"):
        compile_stage.run(_context(tmp_path, qdir, _small_lmem(1024)))
    (tmp_path / "build").rename(tmp_path / "failed")
    report = compile_stage.run(_context(tmp_path, qdir, _small_lmem(1024), no_fit="cpu"))
    moved = report["compile"]["graphs"]["graph_0"]["cpu_no_fit"]
    assert moved and set(moved) <= {layer.name for layer in qgraph.layers}
    assert report["simulator"]["bit_exact"]


# -- YOLOv8n (shared builds) ------------------------------------------------------------------

@pytest.fixture(scope="session")
def yolov8_tiny_build(tmp_path_factory, shared_cache):
    """recipes/yolov8.yaml as a matrix cell on npu-tiny, once per run (the cache gives it the
    chip-independent stages), without the precision search: on this chip (no int16) it would
    move a few layers to the CPU to reach the recipe's 0.999, and these tests are about how
    the compiler slices the whole network."""
    import yaml

    root = shared_root(tmp_path_factory) / "build"
    recipe = yaml.safe_load((REPO / "recipes" / "yolov8.yaml").read_text())
    recipe["quantization"]["auto"] = False
    path = shared_root(tmp_path_factory) / "yolov8-no-search.yaml"
    scratch = path.with_suffix(f".{os.getpid()}")  # xdist workers write it at once
    scratch.write_text(yaml.safe_dump(recipe, sort_keys=False))
    os.replace(scratch, path)
    result = run_cli("run", str(path), "compile", "--target",
                     "npu-tiny", "--build-dir", str(root), "--cache", str(shared_cache))
    assert result.returncode == 0, result.stderr
    return root / "yolov8n@npu-tiny"


def _yolo_report(build_dir) -> dict:
    return json.loads((build_dir / "report.json").read_text())


@pytest.mark.slow
def test_yolov8n_on_npu_16m_is_bit_exact_and_grouping_cuts_gmem_traffic(yolov8_build):
    build_dir, _ = yolov8_build
    report = _yolo_report(build_dir)
    assert report["stages"]["compile"]["status"] in ("built", "current", "restored")
    assert report["simulator"]["bit_exact"] is True
    est = report["estimate"]
    assert est["gmem_bytes_lower_bound"] <= est["gmem_bytes"] <= 0.5 * est["gmem_bytes_no_grouping"]
    assert est["cycles"] < est["cycles_no_grouping"] and est["lmem_peak_bytes"] > 0


@pytest.mark.slow
def test_yolov8n_on_npu_tiny_slices_h_and_is_bit_exact(yolov8_tiny_build):
    report = _yolo_report(yolov8_tiny_build)
    assert report["simulator"]["bit_exact"] is True
    graphs = report["compile"]["graphs"]
    assert sum(g["h_sliced_groups"] for g in graphs.values()) >= 3
    est = report["estimate"]
    assert est["gmem_bytes"] <= 0.5 * est["gmem_bytes_no_grouping"]
    assert est["lmem_peak_bytes"] <= load_chip("npu-tiny").lmem_bytes


@pytest.mark.slow
def test_yolov8n_through_the_runner_with_the_simulator_equals_the_integer_reference(yolov8_build):
    from npubuild.quant.pipeline import SplitPipeline
    from npubuild.quant.qgraph import QGraph
    from npubuild.runtime import Runner
    from npubuild.runtime.simulator import simulator_backend

    build_dir, _ = yolov8_build
    pipeline = SplitPipeline(build_dir / "split")
    qgraphs = {g.index: QGraph.load(build_dir / "quantize" / f"graph_{g.index}.qgraph.json")
               for g in pipeline.npu_graphs}
    feeds = {"images": np.random.default_rng(4).random((1, 3, 320, 320), dtype=np.float32)}
    simulated = Runner(build_dir / "split",
                       backends={"npu": simulator_backend(build_dir)}).run(feeds)
    reference = pipeline.quantized_outputs(feeds, qgraphs)
    np.testing.assert_array_equal(simulated["output0"], reference["output0"])


def test_a_zero_element_initializer_builds_through_verify(tmp_path):
    """An empty constant (legal ONNX: a Concat input of shape [1, 0, 8, 8]) once reached the
    compiler and divided by its zero elements; its node now runs on the CPU, saying why."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    weight = np.random.default_rng(0).standard_normal((4, 3, 3, 3)).astype(np.float32)
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
         helper.make_node("Concat", ["c", "empty"], ["y"], axis=1, name="join")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(weight, "w"),
         numpy_helper.from_array(np.zeros((1, 0, 8, 8), np.float32), "empty")])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                                ir_version=8), tmp_path / "m.onnx")
    (tmp_path / "r.yaml").write_text(
        "version: 1\nname: empty\nmodel: {path: m.onnx, inputs: [{name: x, shape: [1, 3, 8, 8], "
        "preprocess: {resize: [8, 8], scale: 0.00392156862745098}}]}\nquantization:\n"
        "  calibration: {data: 'pkg:skimage/data/[a-c]*.png', samples: 2}\n")
    result = run_cli("run", "r.yaml", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    support = json.loads((tmp_path / "build/empty/split/support.json").read_text())
    join = next(n for n in support["nodes"] if n["name"].startswith("join"))
    assert join["device"] == "cpu"
    assert join["reasons"] == ["Constant input has no elements: 'empty' has shape [1, 0, 8, 8]"]


def test_a_float_step_giving_nan_on_both_sides_is_bit_exact(tmp_path):
    """A float step inside an NPU program (a Log or Sqrt the chip has no table for) gives NaN
    for negative values in the simulator and in the integer reference alike; compile's proof
    compared with `!=`, so basic-pitch's constant-Q Sqrt stopped its build ("simulator nan,
    reference nan")."""
    from npubuild.stages.compile import prove
    from tests.unit.npu.qstacks import compile_qgraph
    from tests.unit.quant import helpers as qhelpers

    model = qhelpers.model([helper.make_node("Conv", ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
                            helper.make_node("Log", ["c"], ["y"])],
                           {"x": [1, 4, 8, 8]}, {"y": None},
                           {"w": np.abs(np.random.default_rng(2).normal(0, 0.3, (4, 4, 3, 3)))})
    feeds = [{"x": np.abs(f["x"]) + 0.1} for f in qhelpers.feeds_for(model)]  # calibrated > 0
    qgraph, _, _ = qhelpers.quantize(model, feeds)
    assert [layer.kind for layer in qgraph.layers] == ["conv", "float"]
    assert qgraph.tensors["y"].is_float  # the program's output, as the step computes it
    _, _, program_file = compile_qgraph(qgraph, load_chip("npu-16m"))
    x = qgraph.tensors["x"]
    inputs = {"x": np.random.default_rng(3).integers(-128, 128, x.shape).astype(x.dtype)}
    assert prove(program_file, qgraph, [("random", inputs)])["bit_exact"]
