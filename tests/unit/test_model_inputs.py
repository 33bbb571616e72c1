"""The recipe's input entries follow surgery's renames: one mapping (`npubuild.model_inputs`)
for preprocessing, layout, proof values, .npz keys and the float original's feeds."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np

from npubuild.model_inputs import RecipeInputs, same_input
from tests.conftest import TINY_RECIPE, run_cli, write_recipe


def spec(name: str):
    return SimpleNamespace(name=name)


def test_an_entry_is_found_under_its_source_name_its_tensorflow_name_or_a_rename():
    inputs = RecipeInputs([spec("images"), spec("mask:0")], {"input": "images"})
    assert inputs.index("input") == 0 and inputs.source_name("input") == "images"
    assert inputs.index("images") == 0  # not renamed in this graph
    assert inputs.index("mask") == 1 and same_input("x", "x:0")
    assert inputs.index("other") is None
    assert inputs.unmatched(["input"]) == [1]


def recipe_text(name: str, surgery: str) -> str:
    """The tiny recipe (input 'x', preprocessed) with verify and ``surgery``."""
    return (TINY_RECIPE.replace("name: tiny", f"name: {name}")
            + f'verify: {{data: "pkg:skimage/data/[a-c]*.png", samples: 2}}\nsurgery: {surgery}\n')


def build(tmp_path, name: str, surgery: str):
    recipe = write_recipe(tmp_path, recipe_text(name, surgery), f"{name}.yaml")
    result = run_cli("run", str(recipe), "--build-dir", str(tmp_path / "build"),
                     "--cache", str(tmp_path / "cache"))
    return result, tmp_path / "build" / name


def ranges(build_dir, rename: dict[str, str] | None = None) -> dict:
    tensors = json.loads((build_dir / "quantize" / "calibration.json").read_text())
    tensors = tensors["graphs"]["graph_0"]["tensors"]
    return {(rename or {}).get(k, k): (v["min"], v["max"]) for k, v in tensors.items()}


def test_a_renamed_input_keeps_its_preprocessing_and_builds_through_verify(tmp_path):
    """Before: quantize calibrated the renamed input on raw pixels (max 222 instead of 0.87)
    and verify fed the float original 'input' where it takes 'x' (a crash)."""
    plain, plain_dir = build(tmp_path, "plain", "[]")
    renamed, renamed_dir = build(tmp_path, "renamed", "[{rename_tensors: {names: {x: input}}}]")
    assert plain.returncode == 0, plain.stderr
    assert renamed.returncode == 0, renamed.stderr
    assert "verify passed" in renamed.stdout
    assert ranges(renamed_dir, {"input": "x"}) == ranges(plain_dir)
    assert ranges(plain_dir)["x"][1] < 1.0  # scaled to [0, 1], as the recipe's preprocess says


def test_npz_data_keyed_by_the_source_name_feeds_the_renamed_input(tmp_path):
    samples = np.random.default_rng(0).uniform(0, 1, (2, 3, 8, 8)).astype(np.float32)
    np.savez(tmp_path / "cal.npz", x=samples)  # two samples, under the source model's name
    text = recipe_text("npz", "[{rename_tensors: {names: {x: input}}}]")
    text = text.replace('"pkg:skimage/data/[a-c]*.png"', "cal.npz")
    recipe = write_recipe(tmp_path, text, "npz.yaml")
    result = run_cli("run", str(recipe), "--build-dir", str(tmp_path / "build"))
    assert result.returncode == 0, result.stderr


def test_an_input_cut_away_with_its_preprocess_is_refused_at_the_recipe_line(tmp_path):
    text = recipe_text("cut", "[{extract: {inputs: [relu]}}]")
    recipe = write_recipe(tmp_path, text, "cut.yaml")
    result = run_cli("run", str(recipe), "surgery", "--build-dir", str(tmp_path / "build"))
    assert result.returncode == 2, result.stderr
    assert (f"{recipe}:8:19: model.inputs[0].preprocess: input 'x' is no longer an input of the "
            "model after surgery (its inputs: 'relu')") in result.stderr
