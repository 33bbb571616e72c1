"""The precision search judges as verify judges: on a small detector-like model whose score
map goes through a Sigmoid (almost every score tiny), int8 misses verify's bar, the search
keeps a few tensors out of int8, and verify — the simulator on every verify sample — reaches the
very figures the search confirmed on the integer reference, failures and all; with the bar out
of reach, both fail with the same lines, and the bisection's hint is measured. recipe.lock
records what was chosen."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from tests.conftest import run_cli, write_recipe
from tests.unit.split.split_models import Net

RECIPE = """\
version: 1
name: scores{suffix}
model:
  path: m.onnx
  inputs: [{{name: x, shape: [1, 3, 16, 16], preprocess: {{resize: [16, 16], scale: 0.00392156862745098}}}}]
target: npu-16m
quantization:
  calibration: {{data: "pkg:skimage/data/[a-c]*.png", samples: 3}}
{extra}verify:
  data: "pkg:skimage/data/[d-h]*.png"
  samples: 3
  min_cosine: {min_cosine}
"""


def score_map_model(rare_prior: float = -9.0) -> onnx.ModelProto:
    """conv → Relu → conv → Sigmoid: two score channels, one of a class seen everywhere
    (scores near 0.9) and one of a class seen nowhere (scores near 1e-4; ``rare_prior``: its
    logit's offset): on the tensor's one int8 scale, the second rounds to a constant."""
    net = Net(seed=5)
    x = net.input("x", [1, 3, 16, 16])
    h = net.op("Relu", [net.conv(x, 3, 8, name="features")])
    logits = net.conv(h, 8, 2, name="head")
    prior = np.array([2.0, rare_prior], np.float32).reshape(1, 2, 1, 1)
    shifted = net.op("Add", [logits, net.init("prior", prior)])
    return net.model([net.op("Sigmoid", [shifted], name="scores")])


def build(root, min_cosine: float, suffix: str, extra: str = "") -> tuple[int, dict, dict]:
    recipe = write_recipe(root, RECIPE.format(min_cosine=min_cosine, suffix=suffix, extra=extra),
                          name=f"r{suffix}.yaml")
    result = run_cli("run", str(recipe), "--build-dir", str(root / "build"),
                     "--cache", str(root / "cache"))
    build_dir = root / "build" / f"scores{suffix}"
    report = json.loads((build_dir / "report.json").read_text())
    search_file = build_dir / "quantize" / "search.json"
    search = json.loads(search_file.read_text()) if search_file.is_file() else {}
    return result.returncode, report, search


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    root = tmp_path_factory.mktemp("scores")
    onnx.save(score_map_model(), root / "m.onnx")
    return root


def test_the_search_passes_exactly_when_verify_passes_with_the_same_figures(root):
    # the bar needs both convs in float: this small model on the CPU, accepted here
    code, report, search = build(root, 0.9999, "", "  auto: {max_slowdown: 100000}\n")
    assert not report["quantization"]["int8_verdict"]["passed"]
    assert search["passed"] and report["verify"]["passed"] and code == 0
    assert search["chosen"] and search["evaluations"] > 1
    outputs = report["accuracy"]["outputs"]
    for name, figures in search["after"]["outputs"].items():
        assert figures["cosine"] == outputs[name]["cosine"]
        assert figures["min_sample_cosine"] == outputs[name]["min_sample_cosine"]
    lock = json.loads((root / "build" / "scores" / "recipe.lock").read_text())
    chosen = lock["resolved"]["quantization"]["chosen"]
    assert chosen["scheme"] == "asymmetric" and chosen["granularity"] == "per_channel"
    assert chosen["search"]["overrides"] == [{"tensors": [c["tensor"]], "precision": c["precision"]}
                                            for c in search["chosen"]]


def test_out_of_reach_both_fail_with_the_same_lines_and_the_hint_is_measured(root):
    code, report, search = build(root, 0.9999, "-off", extra="  auto: false\n")
    assert code == 1 and not search
    finding = report["verify"]["bisection"]["finding"]
    assert finding["stage"] == "quantize"
    assert finding["suggestion"].startswith("measured on the verify samples (fake quantization puts")
    best = finding["measured"][0]
    assert best["passes"] and best["after"] > best["before"]
    assert f"{best['before']:.4f} → {best['after']:.4f}" in finding["suggestion"]
    useless = [m["change"] for m in finding["measured"] if m["gain"] <= 1e-4]
    assert useless and not any(change + ":" in finding["suggestion"] for change in useless)
    # verify quantized the graphs again as the stage did: its trials start from the deployment
    assert "differ from the deployed" not in finding["suggestion"]
    # and each line holds what the stage measured where the recipe leaves it unset
    assert best["recipe"].endswith("; quantization.cross_layer_equalization: false; "
                                   "quantization.weight_rounding: nearest")
    code, report, search = build(root, 1.0, "-unreachable")
    assert code == 1 and not search["passed"] and not report["verify"]["passed"]
    assert search["after"]["failures"] == report["verify"]["failures"]
    finding = report["verify"]["bisection"]["finding"]
    assert "differ from the deployed" not in finding.get("suggestion", "")


def test_a_channel_fake_quantization_sees_dead_too_is_demanded_alive_not_half_its_span(
        tmp_path):
    # int8 loses the rare class's channel (its scores near 1e-3, enough to count as a channel)
    # on the reference and in fake quantization alike: the search sees that loss itself, so it
    # demands verify's bar (no dead channel), not half of every channel's span, which put
    # nearly every tensor in int16 (chars2vec: 371 of 389)
    onnx.save(score_map_model(rare_prior=-7.0), tmp_path / "m.onnx")
    code, report, search = build(tmp_path, 0.9, "-dead")
    assert any("dead channel" in line
               for line in report["quantization"]["int8_verdict"]["failures"])
    assert search["demanded"]["channel_span"] == 0.0
    assert search["passed"] and report["verify"]["passed"] and code == 0
