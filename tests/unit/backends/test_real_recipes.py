"""recipes/real/: every recipe validates against the recipe schema and the pydantic models,
names a real chip (or, in the matrix, real and simulated ones), and YOLOv8n has two outputs
with its class scores judged as a slice."""

from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
import yaml

from npubuild import backends
from npubuild.recipe.model import Recipe, VerifySpec
from npubuild.targets import load_chip

REPO = Path(__file__).resolve().parents[3]
REAL = sorted((REPO / "recipes" / "real").glob("*.yaml"))


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.stem)
def test_each_real_recipe_validates_and_targets_a_real_chip(path):
    data = yaml.safe_load(path.read_text())
    jsonschema.validate(data, json.loads((REPO / "schemas" / "recipe.schema.json").read_text()))
    recipe = Recipe.model_validate(data)
    chips = recipe.targets or [recipe.target]
    kinds = {backends.of(load_chip(c)).toolchain is not None for c in chips}
    assert True in kinds  # a real chip in every recipe here
    assert path.read_text().startswith("# yaml-language-server: $schema=../../schemas/recipe.schema.json")


def test_there_is_a_yolov8n_and_a_classifier_for_each_real_family_and_one_matrix():
    names = {p.stem for p in REAL}
    for chip in ("rk3588", "ethos-u55-256", "bm1684x"):
        assert f"mobilenetv2-{chip}" in names
    assert {"yolov8n-rk3588", "yolov8n-ethos-u55-256", "yolov8n-bm1684x", "matrix"} <= names
    matrix = Recipe.model_validate(yaml.safe_load((REPO / "recipes/real/matrix.yaml").read_text()))
    kinds = {backends.of(load_chip(c)).name for c in matrix.targets}
    assert {"simulated", "rknn", "vela", "tpu-mlir"} <= kinds


@pytest.mark.parametrize("path", [p for p in REAL if p.stem.startswith("yolov8n")], ids=lambda p: p.stem)
def test_yolov8n_has_boxes_and_scores_apart_and_judges_the_scores(path):
    recipe = Recipe.model_validate(yaml.safe_load(path.read_text()))
    assert len(recipe.model.outputs) == 2
    assert any(s.tensor == "/model.22/Sigmoid_output_0" for s in recipe.verify.slices)


@pytest.mark.parametrize("path", REAL, ids=lambda p: p.stem)
def test_no_real_recipe_lowers_a_cosine_threshold_below_verifys_default(path):
    """A real recipe that cannot reach 0.99 fails at it and says why in a comment; thresholds
    lowered to what a model reached are not allowed."""
    verify = Recipe.model_validate(yaml.safe_load(path.read_text())).verify
    default = VerifySpec.model_fields["min_cosine"].default
    limits = [verify.min_cosine, verify.min_sample_cosine, verify.min_channel_cosine,
              *(x for s in verify.slices for x in (s.min_cosine, s.min_sample_cosine))]
    assert all(x is None or x >= default for x in limits), limits
