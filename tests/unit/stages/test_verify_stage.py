"""Stage `verify` end to end on a small inline model that the split cuts in three (an op the
quantizer cannot lower sits in the middle): one truth about placement in support.json, quantize
and the estimate; slices, hand-over thresholds and the classifier task in verify.json."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from tests.conftest import run_cli, write_recipe
from tests.unit.split.split_models import Net

RECIPE = """\
version: 1
name: mixed
model:
  path: m.onnx
  inputs: [{{name: x, shape: [1, 3, 16, 16], preprocess: {{resize: [16, 16], scale: 0.00392156862745098}}}}]
target: npu-16m
quantization:
  scheme: symmetric
  granularity: per_channel
  calibration: {{data: "pkg:skimage/data/[a-c]*.png", samples: 3}}
verify:
  data: "pkg:skimage/data/[d-h]*.png"
  samples: 3
  min_cosine: 0.9
  slices: [{{tensor: fc_out, axis: 1, start: 5, name: last_five, min_cosine: {slice_min}}}]
  handover: {{min_cosine: 0.9}}
  task: classifier
"""


def mixed_model() -> onnx.ModelProto:
    """conv, conv → Min (no integer kernel: CPU) → conv → pool → Gemm → fc_out [1, 10]."""
    net = Net(seed=3)
    x = net.input("x", [1, 3, 16, 16])
    a = net.op("Relu", [net.conv(x, 3, 8, name="conv_a")])
    b = net.op("Relu", [net.conv(x, 3, 8, name="conv_b")])
    m = net.op("Min", [a, b], name="min")
    c = net.op("GlobalAveragePool", [net.op("Relu", [net.conv(m, 8, 16, name="conv_c")])])
    flat = net.op("Flatten", [c], name="flat")
    w = net.init("fc.w", net.rng.standard_normal((10, 16)).astype(np.float32))
    return net.model([net.op("Gemm", [flat, w], name="fc", transB=1)])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("mixed")
    onnx.save(mixed_model(), root / "m.onnx")
    recipe = write_recipe(root, RECIPE.format(slice_min=0.9))
    result = run_cli("run", str(recipe), "--build-dir", str(root / "build"),
                     "--cache", str(root / "cache"))
    assert result.returncode == 0, result.stderr
    return root, json.loads((root / "build" / "mixed" / "report.json").read_text())


def test_what_quantize_cannot_lower_is_a_cpu_segment_everywhere(built):
    root, report = built
    support = json.loads((root / "build" / "mixed" / "split" / "support.json").read_text())
    text = json.dumps(support)
    assert "The quantizer has no integer kernel for it" in text
    assert report["split"]["cpu_ops"] == {"Min": 1} and report["split"]["npu_segments"] == 2
    graphs = report["quantization"]["graphs"]
    assert all(g["cpu_layers"] == [] for g in graphs.values())


def test_the_estimate_counts_the_measured_cpu_segment(built):
    _, report = built
    estimate = report["estimate"]
    parts = estimate["cpu"]["parts"]
    assert list(parts) == ["graph_1"] and parts["graph_1"]["nodes"] == 1
    assert estimate["cpu_seconds"] == parts["graph_1"]["seconds"] > 0
    assert estimate["fps"] == pytest.approx(1 / (estimate["npu_seconds"] + estimate["cpu_seconds"]),
                                            rel=1e-3)
    assert estimate["fps"] < estimate["npu_fps"]


def test_verify_reports_slices_hand_overs_and_the_task(built):
    _, report = built
    verify = report["verify"]
    assert verify["passed"] is True
    assert verify["slices"]["last_five"]["shape"] == [1, 5]
    assert len(verify["npu_outputs"]) == 2  # the two ReLU outputs the NPU hands to Min
    task = verify["task"]
    assert task["task"] == "classifier" and task["classes"] == 10
    assert 0 <= task["top5_agreement"] <= 1 and task["agreement"] == task["top1_agreement"]


def test_a_slice_below_its_threshold_fails_the_run_and_is_bisected(built):
    root, _ = built
    recipe = write_recipe(root, RECIPE.format(slice_min=1.0), name="strict.yaml")
    # another recipe file with the same name: its own build folder, the shared cache
    result = run_cli("run", str(recipe), "--build-dir", str(root / "build-strict"),
                     "--cache", str(root / "cache"))
    assert result.returncode == 1
    assert "error: verify: slice 'last_five': cosine" in result.stderr
    assert "< min_cosine 1.0 over all samples" in result.stderr
    verify = json.loads((root / "build-strict" / "mixed" / "verify" / "verify.json").read_text())
    assert verify["bisection"]["finding"]["stage"] == "quantize"
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(("edit", "field", "message"), [
    ("axis: 1, start: 5", "axis", "verify.slices: tensor 'fc_out' has 2 axes, no axis 7"),
    ("axis: 1, start: 5", "start", "verify.slices: 50:None along axis 1 of 'fc_out' (shape [1, 10]) is empty"),
])
def test_a_slice_that_does_not_fit_its_tensor_stops_quantize_at_its_field(built, edit, field, message):
    """quantize judges as verify does, so it checks the slices first: bad input (exit 2 at
    verify.slices[0].<field>), never an internal error of the precision search."""
    root, _ = built
    bad = "axis: 7, start: 5" if field == "axis" else "axis: 1, start: 50"
    recipe = write_recipe(root, RECIPE.format(slice_min=0.9).replace(edit, bad), name=f"bad_{field}.yaml")
    result = run_cli("run", str(recipe), "quantize", "--build-dir", str(root / f"build-{field}"),
                     "--cache", str(root / "cache"))
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
    line = RECIPE.splitlines().index(next(x for x in RECIPE.splitlines() if "slices:" in x)) + 1
    assert f"{recipe}:{line}:" in result.stderr


def test_a_failing_verify_on_one_stacked_npy_names_the_sample_not_a_file(built):
    """A .npy holding four samples: the verdict, the data list and the bisection count
    samples, never files (indexing the files by the worst sample's number was an IndexError)."""
    root, _ = built
    stack = np.random.default_rng(0).uniform(0, 1, (4, 3, 16, 16)).astype(np.float32)
    np.save(root / "stack.npy", stack)
    body = RECIPE.format(slice_min=1.0).replace('"pkg:skimage/data/[d-h]*.png"', "stack.npy")
    recipe = write_recipe(root, body.replace("samples: 3\n  min_cosine", "samples: 4\n  min_cosine"),
                          name="stacked.yaml")
    # another recipe file with the same name: its own build folder, the shared cache
    result = run_cli("run", str(recipe), "--build-dir", str(root / "build-stacked"),
                     "--cache", str(root / "cache"))
    assert result.returncode == 1, result.stderr
    assert "Traceback" not in result.stderr and "likely a bug" not in result.stderr
    assert "error: verify: slice 'last_five'" in result.stderr
    verify = json.loads((root / "build-stacked" / "mixed" / "verify" / "verify.json").read_text())
    assert verify["samples"] == 4
    assert verify["data"] == [f"stack.npy[{i}]" for i in range(4)]
    assert verify["bisection"]["sample"] in verify["data"]
    assert verify["bisection"]["finding"]["stage"] == "quantize"


def test_verify_lets_go_of_a_samples_hand_over_tensors_before_the_next(built, monkeypatch,
                                                                       tmp_path):
    """A verify over N samples holds one sample's hand-over tensors at a time: each sample's
    deployed and float hand-over arrays are freed before the next sample runs (a 3-D U-Net
    hands over 252 MB a sample; verify held every sample's, and their float64 copies)."""
    import gc
    import weakref

    from npubuild import cli
    from npubuild.verify import judge, samples

    root, _ = built
    monkeypatch.setattr(judge, "HELD_BYTES", -1, raising=False)  # none held for exceptions
    alive, live_when_called = [], []
    run_sample = samples.SampleRun.__call__

    def watched(self, feeds):
        gc.collect()
        live_when_called.append(sum(a() is not None for a in alive))
        ref, got, flt = run_sample(self, feeds)
        handed = [t for t in self.kept if t not in self.pipeline.outputs]
        alive.extend(weakref.ref(values[t]) for values in (got, flt) for t in handed)
        return ref, got, flt

    monkeypatch.setattr(samples.SampleRun, "__call__", watched)
    recipe = write_recipe(root, RECIPE.format(slice_min=0.9), name="watched.yaml")
    code = cli.main(["run", str(recipe), "--build-dir", str(tmp_path / "build"), "--cache",
                     str(root / "cache"), "--force", "verify", "-q"])
    assert code == 0
    assert len(alive) == 3 * 2 * 2  # three samples, two hand-over tensors, deployed and float
    assert live_when_called == [0, 0, 0]
    verify = json.loads((tmp_path / "build" / "mixed" / "verify" / "verify.json").read_text())
    assert verify["passed"] is True and len(verify["npu_outputs"]) == 2


def test_a_failing_verifys_hints_hold_no_hand_over_tensor_no_threshold_reads(built, monkeypatch,
                                                                           tmp_path):
    """The hints of a failing verify judge every sample again for each change they try: of
    the hand-over tensors, they hold those a threshold, a selection or a slice reads (none
    here: no verify.handover), not every one of every sample."""
    from npubuild import cli
    from npubuild.verify import fixes

    root, _ = built
    held = []
    bench = fixes.FixBench.__init__

    def watched(self, workflow, deployed, samples, judge, kept):
        held.append(list(kept))
        bench(self, workflow, deployed, samples, judge, kept)
        values = self.values()
        held.append(sorted({name for sample in values for name in sample}))

    monkeypatch.setattr(fixes.FixBench, "__init__", watched)
    body = RECIPE.format(slice_min=1.0).replace("  handover: {min_cosine: 0.9}\n", "")
    recipe = write_recipe(root, body, name="hinted.yaml")
    code = cli.main(["run", str(recipe), "--build-dir", str(tmp_path / "build"), "--cache",
                     str(root / "cache"), "-q"])
    assert code == 1
    verify = json.loads((tmp_path / "build" / "mixed" / "verify" / "verify.json").read_text())
    assert verify["bisection"]["finding"]["stage"] == "quantize"
    handed_over = set(verify["npu_outputs"])
    assert len(handed_over) == 2 and held  # the hints ran, on the two ReLUs' hand-over
    assert all(not handed_over & set(names) for names in held), held
