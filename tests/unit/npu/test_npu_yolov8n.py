"""YOLOv8n-320 (nudenet's 320n.onnx) tiled on npu-16m and npu-tiny."""

from importlib.resources import files

import onnx
import pytest

from npubuild.npu import (build_program, conflicts, estimate, gmem_lower_bound, layers_from_onnx,
                          plan_dict, plan_groups)
from npubuild.onnx_io import fix_input_shapes
from npubuild.targets import load_chip
from tests.unit.npu.npu_executor import check_program

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def yolo_layers():
    model = onnx.load(str(files("nudenet") / "320n.onnx"))
    return layers_from_onnx(fix_input_shapes(model, {"images": [1, 3, 320, 320]}))


def test_backbone_and_neck_become_layers(yolo_layers):
    ops = [layer.op for layer in yolo_layers.layers]
    # 63 convs of backbone, neck and head, and the DFL's 1x1 conv (fed by the skipped Softmax)
    assert ops.count("conv") == 64 and ops.count("resize") == 2 and ops.count("pool") == 3
    assert yolo_layers.inputs == ("images", "/model.22/dfl/Softmax_output_0")
    assert {f"/model.22/Concat{s}_output_0" for s in ("", "_1", "_2")} < set(yolo_layers.outputs)


@pytest.mark.parametrize("chip_name", ["npu-16m", "npu-tiny"])
def test_every_group_fits_and_grouping_halves_gmem_traffic(yolo_layers, chip_name):
    chip = load_chip(chip_name)
    grouped = build_program(plan_groups(yolo_layers, chip))
    baseline = build_program(plan_groups(yolo_layers, chip, grouping=False))
    for program in (grouped, baseline):
        for group in program.npu_groups:
            plan = group.plan
            assert conflicts(plan.buffers, plan.placement, chip.lmem_bytes_per_lane) == []
            assert plan.placement.peak <= chip.lmem_bytes_per_lane
    ours, theirs = estimate(grouped), estimate(baseline)
    assert gmem_lower_bound(yolo_layers) <= ours.gmem_bytes <= 0.5 * theirs.gmem_bytes
    assert ours.cycles < theirs.cycles
    if chip_name == "npu-tiny":
        assert any(g.plan.slicing.h > 1 for g in grouped.npu_groups)
    plan_dict(grouped, ours)  # serialisable
    check_program(grouped)
