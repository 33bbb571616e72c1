"""benchmarks/zoo.py's as-written copy of a zoo recipe: what a user writes from the README —
the model, its data, the chip, min_cosine 0.99 and the task check — with every per-model
quantization setting and lowered bar removed, reading the same files."""

from __future__ import annotations

import importlib.util

import yaml

from npubuild.recipe import load_recipe
from tests.conftest import REPO


def _zoo():
    spec = importlib.util.spec_from_file_location("bench_zoo", REPO / "benchmarks" / "zoo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_tuned_recipe_becomes_what_a_user_writes(tmp_path):
    tuned = REPO / "recipes" / "zoo" / "ppocr-v4-det.yaml"
    written = _zoo().as_written(tuned, tmp_path)
    data, original = yaml.safe_load(written.read_text()), yaml.safe_load(tuned.read_text())
    assert data["name"] == "ppocr-v4-det.written"
    calibration = original["quantization"]["calibration"]
    assert data["quantization"] == {"calibration": {"data": calibration["data"],
                                                    "samples": calibration["samples"]}}
    assert data["verify"]["min_cosine"] == 0.99 and "min_sample_cosine" not in data["verify"]
    assert data["verify"]["task"] == original["verify"]["task"]
    for section in ("surgery", "fusion", "split", "compile", "target"):
        assert data.get(section) == original.get(section)
    loaded = load_recipe(written)  # the files it names resolve from the copy's folder
    assert loaded.recipe.quantization.scheme is None and loaded.recipe.quantization.auto.enabled


def test_relative_paths_still_name_the_same_files(tmp_path):
    tuned = REPO / "recipes" / "zoo" / "speech-vad.yaml"
    written = _zoo().as_written(tuned, tmp_path)
    data = yaml.safe_load(written.read_text())
    assert data["model"]["path"] == str((tuned.parent / "../../models/zoo/speech_vad.onnx"))
    assert data["verify"]["data"].startswith(str(tuned.parent))
