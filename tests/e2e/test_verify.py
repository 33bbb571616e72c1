"""Stage `verify` on the real YOLOv8n: the full recipe passes with sane figures, and two
deliberately bad recipes fail verify with the bisection naming the stage that broke them."""

import json
import re

import numpy as np
import pytest
from PIL import Image

from tests.conftest import REPO, run_cli

pytestmark = pytest.mark.slow


def test_full_yolov8_run_passes_verify_with_sane_report_figures(yolov8_build):
    build_dir, _ = yolov8_build
    report = json.loads((build_dir / "report.json").read_text())
    assert all(s["status"] in ("built", "current", "restored") for s in report["stages"].values())
    assert report["verify"]["passed"] is True
    output0 = report["accuracy"]["outputs"]["output0"]
    assert 0.99 <= output0["cosine"] <= 1.0 and output0["sqnr_db"] > 15
    assert report["simulator"]["bit_exact"] is True
    estimate = report["estimate"]
    assert estimate["cycles"] > 0 and estimate["fps"] > 0
    assert 0 < estimate["gmem_bytes"] <= 0.5 * estimate["gmem_bytes_no_grouping"]
    assert 0 < estimate["lmem_peak_bytes"] <= 64 * 256 * 1024
    # the whole network runs on the NPU, the DFL Softmax included (an integer softmax)
    assert report["split"]["cpu_nodes"] == 0 and report["split"]["npu_segments"] == 1
    scores = report["accuracy"]["slices"]["class_scores"]
    assert scores["cosine"] >= 0.92 and not scores.get("dead_channel_count")
    detections = report["verify"]["detections"]
    assert detections["float_boxes"] >= 1 and detections["box_recall"] >= 0.5
    images = detections["per_image"]
    assert len(images) == detections["images"] == 7
    named = [b["name"] for i in images for b in i["float"] + i["deployed"]]
    assert named and all(n.isupper() for n in named)  # nudenet's labels, not class ids
    picture = Image.open(build_dir / "verify" / "detections.png")  # every image, 4 per row
    assert picture.size == (1200, 2 * (300 + 26)) and np.asarray(picture.convert("L")).std() > 10
    assert (build_dir / "report.html").stat().st_size > 10_000


def bad_recipe(tmp_path, replace: dict[str, str], name: str):
    text = (REPO / "recipes" / "yolov8.yaml").read_text().replace("name: yolov8n", f"name: {name}")
    for pattern, new in replace.items():
        text, count = re.subn(pattern, new, text, flags=re.S)
        assert count == 1, pattern
    recipe = tmp_path / f"{name}.yaml"  # the recipe's paths are all pkg: paths
    recipe.write_text(text)
    return recipe


def run_failing(recipe, tmp_path, shared_cache):
    result = run_cli("run", str(recipe), "--build-dir", str(tmp_path / "build"), "--cache", str(shared_cache))
    report = json.loads((tmp_path / "build" / recipe.stem / "report.json").read_text())
    return result, report


def test_calibration_on_one_black_image_fails_verify_and_bisection_names_quantize(tmp_path, shared_cache):
    black = tmp_path / "black.png"
    Image.new("RGB", (320, 320)).save(black)
    recipe = bad_recipe(tmp_path, {r"  calibration:\n    data: \[.*?\]\n    samples: 7":
                                   f"  auto: false\n  calibration:\n    data: [{black}]\n    samples: 1"},
                        "black-calibration")  # int8 as calibrated (the precision search rescues it)
    result, report = run_failing(recipe, tmp_path, shared_cache)
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr
    # the class-score slice (or output0 itself) shows the collapse
    assert ("verify: slice 'class_scores': cosine" in result.stderr
            or "output 'output0': cosine" in result.stderr)
    finding = report["verify"]["bisection"]["finding"]
    assert finding["stage"] == "quantize"
    assert finding["input_cosine"] - finding["cosine"] > 0.5  # the collapse, not a bystander
    # the hint is measured: each change tried on the collapsed tensor, with its figure
    assert finding["suggestion"].startswith("measured on the verify samples")
    assert f"quantization.overrides: [{{tensors: ['{finding['tensor']}']" in finding["suggestion"]
    assert all(m["after"] - m["before"] == pytest.approx(m["gain"]) for m in finding["measured"])
    assert "per_channel" not in finding["suggestion"]  # the recipe has it already
    assert "the drop starts in stage `quantize`" in result.stderr


def test_surgery_step_with_a_relaxed_check_fails_verify_and_bisection_names_the_step(tmp_path, shared_cache):
    step = ("  - fold_constants: {}\n  - insert_op: {tensor: /model.22/dfl/Transpose_output_0, "
            "op_type: Mul, inputs: [{value: 0.1}], tolerance: 100}\n")
    recipe = bad_recipe(tmp_path, {r"  - fold_constants: \{\}[^\n]*\n": step}, "relaxed-surgery")
    result, report = run_failing(recipe, tmp_path, shared_cache)
    assert result.returncode == 1, result.stderr
    finding = report["verify"]["bisection"]["finding"]
    assert finding["stage"] == "surgery"
    assert finding["introduced_by"].startswith("step 1 (insert_op)")
