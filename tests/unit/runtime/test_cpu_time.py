"""The CPU part of the estimate is measured on the values the deployment computes, and never
fails a build: a part that cannot run is reported as not measured, with the reason."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from npubuild.npu.estimate import with_cpu
from npubuild.quant.qgraph import QGraph
from npubuild.recipe.model import SplitSpec
from npubuild.runtime import cpu_time
from npubuild.split import split_model
from npubuild.stages import quantize as quantize_stage
from npubuild.targets import load_chip
from tests.unit.quant.test_quantize_stage import context
from tests.unit.split.split_models import Net


def shape_from_another_segment() -> onnx.ModelProto:
    """conv (NPU) → on the CPU: Shape/Slice/Concat make [1, 8, -1] and a Mul scales → conv
    (NPU) → Reshape on the CPU: the last CPU segment's int64 shape input is computed by another
    segment (random values there break the Reshape)."""
    net = Net(seed=1)
    x = net.input("x", [1, 4, 8, 8])
    a = net.op("Relu", [net.conv(x, 4, 8, name="conv_a")], name="relu_a")
    dims = net.op("Shape", [a], name="shape")
    head = net.op("Slice", [dims, net.init("s0", np.array([0])), net.init("s1", np.array([2]))],
                  name="head")
    target = net.op("Concat", [head, net.init("rest", np.array([-1]))], name="target", axis=0)
    scaled = net.op("Mul", [a, net.init("half", np.float32(0.5))], name="scale")
    b = net.op("Relu", [net.conv(scaled, 8, 8, name="conv_b")], name="relu_b")
    return net.model([net.op("Reshape", [b, target], name="flatten")])


def test_a_cpu_segment_is_timed_on_the_shape_another_segment_computes(tmp_path):
    spec = SplitSpec(force_cpu=["shape", "head", "target", "scale", "flatten"])
    report = split_model(shape_from_another_segment(), load_chip("npu-16m"), spec, tmp_path)
    assert report["cpu_segments"] >= 2
    parts = cpu_time.deployment_parts(tmp_path, [])
    assert len(parts) == report["cpu_segments"]
    assert all(p["seconds"] is not None and p["seconds"] > 0 for p in parts.values()), parts


def test_a_part_onnx_runtime_cannot_run_is_not_measured_and_says_why():
    net = Net()
    x = net.input("x", [2, 3])
    broken = net.model([net.op("Reshape", [x, net.init("bad", np.array([7, 5]))])], infer=False)
    part = cpu_time.measured(broken, {"x": np.ones((2, 3), np.float32)})
    assert part["seconds"] is None and "running Reshape node" in part["not_measured"]
    assert cpu_time.measured(broken, {"x": None}, "no proof inputs")["not_measured"] == \
        "no value for 'x': no proof inputs"


def test_parts_not_measured_are_left_out_of_the_sum_and_listed():
    estimate = with_cpu(1000, 2000, 1e6, {"graph_1": {"seconds": 0.001},
                                          "graph_3": {"seconds": None, "not_measured": "why"}},
                        "method")
    assert estimate["cpu_seconds"] == 0.001 and estimate["cpu"]["not_measured"] == {"graph_3": "why"}
    assert estimate["fps"] == round(1 / (0.001 + 0.001), 2)


@pytest.mark.parametrize("kept", ["h", "p"])
def test_every_float_layer_of_an_npu_graph_is_timed(tmp_path, kept):
    """Float layers after a float override: 'h' splits the fused ConvSilu (its Mul reads the
    Conv's output, a value no float model computes: timed on zeros of its shape and marked);
    'p' keeps a chain in float (each layer reads the one before it)."""
    ctx = context(tmp_path, overrides=f'[{{tensors: ["{kept}"], precision: float}}]')
    quantize_stage.run(ctx)
    qgraph = QGraph.load(ctx.out / "graph_1.qgraph.json")
    qgraph.name = "graph_1"
    parts = cpu_time.deployment_parts(tmp_path / "split", [qgraph])
    inside = {name: part for name, part in parts.items() if name.startswith("graph_1/")}
    assert inside and all(p["seconds"] is not None for p in inside.values()), parts
    zeros = sorted(t for p in inside.values() for t in p.get("timed_on_zeros", []))
    assert zeros == (["conv:0__1"] if kept == "h" else [])
