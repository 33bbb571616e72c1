"""The real YOLOv8n (nudenet 3.4.2, input fixed to 1×3×320×320, not constant-folded)."""

from __future__ import annotations

import re

import onnx
import pytest

from npubuild.recipe.paths import resolve
from npubuild.onnx_io import fix_input_shapes
from npubuild.split import split_model
from npubuild.split.plan import plan_split
from npubuild.targets import load_chip
from tests.conftest import REPO

pytestmark = pytest.mark.slow

BACKBONE_NECK = re.compile(r"^/model\.(\d|1\d|2[01])/")  # model.0 … model.21; the head is 22


@pytest.fixture(scope="module")
def yolov8n() -> onnx.ModelProto:
    model = onnx.load(str(resolve("pkg:nudenet/320n.onnx", REPO)))
    return fix_input_shapes(model, {"images": [1, 3, 320, 320]})


def test_backbone_and_neck_are_one_npu_segment_on_npu_16m(yolov8n, tmp_path):
    report = split_model(yolov8n, load_chip("npu-16m"), None, tmp_path)
    plan = plan_split(yolov8n, load_chip("npu-16m"))
    graph_of = {p.name: p.graph for p in plan.placements}
    trunk = {graph_of[n.name] for n in yolov8n.graph.node
             if BACKBONE_NECK.match(n.name) and n.op_type != "Constant"}
    assert trunk == {0} and report["graphs"][0]["device"] == "npu"
    assert report["graphs"][0]["nodes"] >= 200
    # without fold_constants the head's anchor arithmetic (Shape/Gather/Range… on int64)
    # and the Reshapes fed by it stay on the CPU
    assert report["cpu_ops"].get("Shape") == 10 and report["cpu_ops"].get("Range") == 6
    assert report["proof"]["outputs_equal"]


def test_npu_strict_gives_several_segments_each_fallback_with_its_reason(yolov8n, tmp_path):
    report = split_model(yolov8n, load_chip("npu-strict"), None, tmp_path)
    assert report["npu_segments"] >= 2 and report["cpu_segments"] >= 2
    reasons = {p.name: p.reasons for p in plan_split(yolov8n, load_chip("npu-strict")).placements
               if p.device == "cpu"}
    assert all(reasons.values())
    assert reasons["/model.22/Reshape"] == ["op Reshape is not supported by chip npu-strict"]
    assert reasons["/model.22/dfl/Softmax"] == ["op Softmax is not supported by chip npu-strict"]
    assert reasons["/model.22/Split_1"][0] == (
        "Input is not 4D tensor: '/model.22/Concat_6_output_0' has shape [1, 82, 2100]")
    assert report["proof"]["outputs_equal"]


def test_fused_yolov8n_keeps_its_fused_convs_on_the_strict_npu(yolov8n, tmp_path):
    from npubuild.fusions import load_builtins

    rules = load_builtins()
    if "conv_silu" not in rules:
        pytest.skip("the conv_silu fusion rule is not available")
    fused, _ = rules["conv_silu"].apply(yolov8n)
    plan = plan_split(fused, load_chip("npu-strict"))
    placed = [p for p in plan.placements if p.op == "fused op ConvSilu"]
    assert len(placed) == 57 and {p.device for p in placed} == {"npu"}
    report = split_model(fused, load_chip("npu-strict"), None, tmp_path)
    assert report["proof"]["outputs_equal"]
