"""The quantize workflow runs the integer reference over the verify samples once per
quantization: the stage judges verify's tensors, then compares the outputs among them, and a
cache keyed on the list's spelling ran the reference twice (on DNSMOS, a full pass of 19 GMAC
per sample)."""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npubuild.quant.pipeline import SplitPipeline
from npubuild.quant.quantizer import QuantConfig
from npubuild.quant.workflow import Options, Workflow
from npubuild.split import graph_infos


def _conv_workflow(tmp_path) -> Workflow:
    rng = np.random.default_rng(0)
    shape = [1, 4, 8, 8]
    weight = numpy_helper.from_array(rng.normal(0, 0.5, (4, 4, 3, 3)).astype(np.float32), "w")
    graph = helper.make_graph(
        [helper.make_node("Conv", ["x", "w"], ["y"], name="conv", pads=[1, 1, 1, 1])], "g",
        [helper.make_tensor_value_info("x", 1, shape)], [helper.make_tensor_value_info("y", 1, shape)],
        [weight])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    split = tmp_path / "split"
    split.mkdir()
    onnx.save(model, split / "graph_0.onnx")
    graph_infos.write(split / "graph_infos.json", graph_infos.build(
        [("npu", ["x"], ["y"])], {"x": shape, "y": shape}, ["x"], ["y"]))
    workflow = Workflow(SplitPipeline(split), Options(QuantConfig(scheme="asymmetric")))
    workflow.calibrate([{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(3)])
    workflow.quantize()
    return workflow


def test_the_reference_runs_once_for_any_tensors_kept_by_the_first_run(tmp_path, monkeypatch):
    workflow = _conv_workflow(tmp_path)
    rng = np.random.default_rng(1)
    samples = [{"x": rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)} for _ in range(2)]
    runs = []
    original = Workflow._run_deployed

    def counted(self, *args):
        runs.append(args[-1])
        return original(self, *args)

    monkeypatch.setattr(Workflow, "_run_deployed", counted)
    first = workflow.deployed_values(samples, ["y"])
    again = workflow.deployed_values(samples, ["y", "y"])  # the outputs listed twice
    assert len(runs) == 1
    assert all(np.array_equal(a["y"], b["y"]) for a, b in zip(first, again))
    workflow.quantize()                                     # a new quantization: runs again
    fresh = workflow.deployed_values(samples, ["y"])
    assert len(runs) == 2
    assert all(np.array_equal(a["y"], b["y"]) for a, b in zip(first, fresh))
