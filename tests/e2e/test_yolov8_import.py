"""The real YOLOv8n (nudenet 3.4.2, 320×320) through `npubuild run recipes/yolov8.yaml`."""

import json

import numpy as np
import onnx
import pytest

from npubuild import onnx_io
from npubuild.recipe.paths import resolve
from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slow


def test_yolov8n_import_fixes_the_input_shape(yolov8_build):
    build_dir, _ = yolov8_build
    model = onnx.load(str(build_dir / "import" / "model.onnx"))
    (images,) = onnx_io.graph_inputs(model)
    assert images.name == "images" and onnx_io.value_shape(images) == [1, 3, 320, 320]
    assert onnx_io.value_shape(model.graph.output[0]) == [1, 22, 2100]


def test_yolov8n_import_equals_the_original_in_onnx_runtime(yolov8_build):
    build_dir, _ = yolov8_build
    imported = onnx.load(str(build_dir / "import" / "model.onnx"))
    original = onnx.load(str(resolve("pkg:nudenet/320n.onnx", REPO)))
    image = np.random.default_rng(3).random((1, 3, 320, 320), dtype=np.float32)
    got = onnx_io.run(imported, {"images": image})["output0"]
    expected = onnx_io.run(original, {"images": image})["output0"]
    np.testing.assert_array_equal(got, expected)


def test_second_yolov8_run_rebuilds_nothing_and_says_so(yolov8_build, shared_cache):
    build_dir, _ = yolov8_build
    again = run_cli("run", "recipes/yolov8.yaml", "--build-dir", str(build_dir.parent),
                    "--cache", str(shared_cache))
    assert again.returncode == 0
    assert "nothing to rebuild" in again.stderr
    report = json.loads((build_dir / "report.json").read_text())
    assert report["stages"]["import"]["status"] == "current"
