"""What `validate` learns of an ONNX model is remembered in the content cache under the model's
content hash, the recipe's ``model:`` section and npubuild's code: a second validate of the
same model does not load ONNX or numpy, and any change to what the check read checks again."""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys

import onnx
import pytest

from npubuild.errors import UserError
from npubuild.model_facts import model_facts
from npubuild.recipe import load_recipe
from npubuild.stages import importer
from tests.conftest import EXECUTED, REPO, TINY_MODEL, TINY_RECIPE, write_recipe


@pytest.fixture
def checks(monkeypatch, tmp_path):
    """The cache in ``tmp_path/cache``; counts the real checks (`importer.check_signature`)."""
    monkeypatch.setenv("NPUBUILD_CACHE", str(tmp_path / "cache"))
    calls = []
    real = importer.check_signature

    def counted(loaded):
        calls.append(loaded.path)
        return real(loaded)

    monkeypatch.setattr(importer, "check_signature", counted)
    return calls


def recipe_for(tmp_path, model, shape="[1, 3, 8, 8]", name="recipe.yaml"):
    text = TINY_RECIPE.replace(str(TINY_MODEL), str(model)).replace("[1, 3, 8, 8]", shape)
    return load_recipe(write_recipe(tmp_path, text, name))


def test_a_second_check_of_the_same_model_and_section_is_remembered(tmp_path, checks):
    first = model_facts(recipe_for(tmp_path, TINY_MODEL))
    again = model_facts(recipe_for(tmp_path, TINY_MODEL, name="other.yaml"))
    assert len(checks) == 1
    assert again == first
    assert first.as_dict() == {"inputs": ["x"], "outputs": ["y"]}
    assert ["x", [1, 3, 8, 8], "float32"] in again.graph_inputs


def test_another_model_content_or_input_shape_is_checked_again(tmp_path, checks):
    model = tmp_path / "model.onnx"
    shutil.copyfile(TINY_MODEL, model)
    model_facts(recipe_for(tmp_path, model))
    model_facts(recipe_for(tmp_path, model, shape="[2, 3, 8, 8]"))
    assert len(checks) == 2
    proto = onnx.load(str(model))
    proto.graph.node[0].name = "renamed_node"
    onnx.save(proto, str(model))
    facts = model_facts(recipe_for(tmp_path, model))
    assert len(checks) == 3
    assert "renamed_node" in [name for name, _, _ in facts.nodes]


def test_a_failing_check_is_not_remembered(tmp_path, checks):
    recipe = write_recipe(tmp_path, TINY_RECIPE.replace("- name: x", "- name: nope"))
    for _ in range(2):
        with pytest.raises(UserError, match="the model has no input 'nope'"):
            model_facts(load_recipe(recipe))
    assert len(checks) == 2


def test_a_model_with_external_data_is_checked_every_time(tmp_path, checks, monkeypatch):
    """Its data files are not part of the key, so what the check says of them is never kept."""
    counted = importer.check_signature
    monkeypatch.setattr(importer, "check_signature",
                        lambda loaded: dataclasses.replace(counted(loaded), external_data=True))
    model_facts(recipe_for(tmp_path, TINY_MODEL))
    model_facts(recipe_for(tmp_path, TINY_MODEL))
    assert len(checks) == 2


def test_a_remembered_validate_loads_neither_onnx_nor_numpy(tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    code = EXECUTED + ("from npubuild.cli import main; code = main(['validate', sys.argv[1]]); "
                       "print(code, executed('numpy'), executed('onnx'))")
    env = {"NPUBUILD_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(REPO)}
    runs = [subprocess.run([sys.executable, "-c", code, str(recipe)], capture_output=True, text=True,
                           cwd=tmp_path, env={**os.environ, **env}, check=True) for _ in range(2)]
    assert runs[0].stdout.splitlines()[-1] == "0 True True"  # the first one checks the model
    assert runs[1].stdout.splitlines()[-1] == "0 False False"
    assert runs[0].stdout.splitlines()[0] == runs[1].stdout.splitlines()[0]
