"""recipes/yolov8-strict.yaml: one NPU segment on npu-strict, and the documented CPU decode of
its three 4-D outputs rebuilds the original model's output0."""

import json

import numpy as np
import onnx
import pytest

from npubuild import onnx_io
from npubuild.postprocess.yolov8 import decode
from npubuild.recipe.paths import resolve
from tests.conftest import REPO, run_cli, shared_root

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def strict_build(tmp_path_factory, shared_cache):
    root = shared_root(tmp_path_factory) / "build"
    result = run_cli("run", "recipes/yolov8-strict.yaml", "split", "--build-dir", str(root),
                     "--cache", str(shared_cache))
    assert result.returncode == 0, result.stderr
    return root / "yolov8n-strict"


def test_strict_recipe_maps_the_whole_model_to_one_npu_segment(strict_build):
    report = json.loads((strict_build / "report.json").read_text())
    assert report["split"]["npu_segments"] == 1
    assert report["split"]["cpu_segments"] == 0
    infos = json.loads((strict_build / "split" / "graph_infos.json").read_text())
    assert [g["device"] for g in infos["graphs"]] == ["npu"]


def test_every_npu_tensor_of_the_strict_model_is_4d(strict_build):
    model = onnx.shape_inference.infer_shapes(onnx.load(str(strict_build / "split" / "graph_0.onnx")))
    values = list(model.graph.value_info) + list(model.graph.output) + list(model.graph.input)
    assert values and all(len(onnx_io.value_shape(v)) == 4 for v in values)


def test_cpu_decode_of_the_three_outputs_rebuilds_output0(strict_build):
    image = np.random.default_rng(5).random((1, 3, 320, 320), dtype=np.float32)
    scales = onnx_io.run(onnx.load(str(strict_build / "fusion" / "model.onnx")), {"images": image})
    original = onnx_io.run(onnx_io.load_model(resolve("pkg:nudenet/320n.onnx", REPO)), {"images": image})
    rebuilt = decode(scales["p3"], scales["p4"], scales["p5"])
    np.testing.assert_allclose(rebuilt, original["output0"], rtol=1e-5, atol=1e-4)


def test_without_the_surgery_the_strict_chip_needs_several_segments_with_reasons(tmp_path, shared_cache):
    text = (REPO / "recipes" / "yolov8-strict.yaml").read_text()
    start, end = text.index("surgery:"), text.index("fusion:")
    plain = text[:start] + "surgery: [fold_constants: {}]\n" + text[end:]
    recipe = tmp_path / "plain.yaml"
    recipe.write_text(plain.replace("name: yolov8n-strict", "name: yolov8n-strict-plain"))
    result = run_cli("targets", "--check", str(recipe), "--json", "--build-dir", str(tmp_path),
                     "--cache", str(shared_cache))
    assert result.returncode == 0, result.stderr
    cpu = [n for n in json.loads(result.stdout)["nodes"] if n["device"] == "cpu"]
    assert cpu and all(n["reasons"] for n in cpu)
    assert any("not supported by chip npu-strict" in r for n in cpu for r in n["reasons"])
    split = run_cli("run", str(recipe), "split", "--json", "--build-dir", str(tmp_path),
                    "--cache", str(shared_cache))
    assert json.loads(split.stdout)["split"]["npu_segments"] > 1
