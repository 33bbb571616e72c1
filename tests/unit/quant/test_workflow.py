"""The quantize workflow runs the integer reference over the verify samples once per
quantization: the stage judges verify's tensors, then compares the outputs among them, and a
cache keyed on the list's spelling ran the reference twice (on DNSMOS, a full pass of 19 GMAC
per sample)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from npubuild.quant.workflow import Workflow
from tests.unit.quant.test_search import _conv_middle_conv_search


def _conv_workflow(tmp_path) -> Workflow:
    """Conv → Relu → Conv, calibrated and quantized (the search tests' toy)."""
    return _conv_middle_conv_search(
        tmp_path, helper.make_node("Relu", ["c"], ["p"], name="relu")).workflow


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
