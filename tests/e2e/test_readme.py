"""The README is tested: every YAML block in it is a valid recipe, or a valid section of one
(against the pydantic models and the generated JSON Schema), and the example recipe it shows
builds and passes verify."""

import json
import re
import textwrap

import jsonschema
import pytest
import yaml
from pydantic import BaseModel

from npubuild.recipe import load_recipe
from npubuild.recipe.model import Recipe
from tests.conftest import REPO, run_cli

README = REPO / "README.md"
YAML_BLOCK = re.compile(r"^```yaml\n(.*?)^```$", re.S | re.M)


def readme_yaml_blocks() -> list[str]:
    return YAML_BLOCK.findall(README.read_text())


def recipe_file(directory, text: str, index: int):
    """A README block as a recipe file one folder below the repo root, as recipes/ are, so
    its `$schema` comment and relative paths mean what they mean in the README."""
    path = directory / f"readme_{index}.yaml"
    path.write_text(text)
    return path


def test_the_readme_has_a_recipe_block():
    assert readme_yaml_blocks(), "README.md lost its ```yaml recipe"


def recipe_sections() -> dict[str, set[str]]:
    """Each recipe section that is a pydantic model (model, split, quantization, verify, ...)
    with the fields it takes."""
    return {name: set(field.annotation.model_fields)
            for name, field in Recipe.model_fields.items()
            if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)}


def as_recipe(text: str) -> dict:
    """A block as a whole recipe: a fragment (a section's fields, shown indented) is put into
    the README's example recipe at the section it belongs to."""
    data = yaml.safe_load(textwrap.dedent(text))
    if "version" in data:
        return data
    recipe = yaml.safe_load(readme_yaml_blocks()[0])
    if set(data) <= set(Recipe.model_fields):
        return {**recipe, **data}
    sections = [name for name, fields in recipe_sections().items() if set(data) <= fields]
    assert sections, f"README block fits no recipe section: {text}"
    section = sections[0]
    return {**recipe, section: {**(recipe.get(section) or {}), **data}}


@pytest.mark.parametrize("index", range(len(readme_yaml_blocks())))
def test_every_readme_yaml_block_is_a_valid_recipe(index, tmp_path):
    data = as_recipe(readme_yaml_blocks()[index])
    load_recipe(recipe_file(tmp_path, yaml.safe_dump(data), index))  # raises the user's error
    schema = json.loads((REPO / "schemas" / "recipe.schema.json").read_text())
    jsonschema.validate(data, schema)


@pytest.mark.slow
def test_the_readme_example_builds_and_passes_verify(tmp_path, yolov8_build, shared_cache):
    """Built in its own directory with the session's shared cache: when the example equals
    recipes/yolov8.yaml (as the README says) its stages are restored, else they are built."""
    recipe = recipe_file(tmp_path, readme_yaml_blocks()[0], 0)
    result = run_cli("run", str(recipe), "--build-dir", str(tmp_path / "build"),
                     "--cache", str(shared_cache))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp_path / "build" / "yolov8n" / "report.json").read_text())
    assert report["verify"]["passed"] is True
    assert set(report["stages"]) >= {"import", "split", "quantize", "compile", "verify"}
