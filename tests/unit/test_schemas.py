"""schemas/*.json: the repository's copies never drift from the pydantic models or from the
schemas shipped in the package, and they accept what the models accept (the example recipes and
the preset chips)."""

import json

import jsonschema
import pytest
import yaml

from npubuild.schemas import NAMES, schema_text
from npubuild.targets import preset_file, preset_names
from tests.conftest import REPO

SCHEMA_DIR = REPO / "schemas"
PRESET_FILES = [preset_file(name) for name in preset_names()]


@pytest.mark.parametrize("which", NAMES)
def test_repository_schema_copy_matches_the_package(which):
    checked_in = (SCHEMA_DIR / f"{which}.schema.json").read_text()
    assert checked_in == schema_text(which), (
        f"schemas/{which}.schema.json is stale: run `npubuild schema {which} > "
        f"schemas/{which}.schema.json`")


def test_every_repository_schema_is_known_to_the_package():
    assert sorted(p.name.removesuffix(".schema.json") for p in SCHEMA_DIR.glob("*.json")) == \
        sorted(NAMES)


@pytest.mark.parametrize("recipe", sorted((REPO / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_example_recipes_validate_against_the_json_schema(recipe):
    schema = json.loads((SCHEMA_DIR / "recipe.schema.json").read_text())
    jsonschema.validate(yaml.safe_load(recipe.read_text()), schema)


@pytest.mark.parametrize("chip", PRESET_FILES, ids=lambda p: p.stem)
def test_preset_chips_validate_against_the_json_schema(chip):
    schema = json.loads((SCHEMA_DIR / "chip.schema.json").read_text())
    jsonschema.validate(yaml.safe_load(chip.read_text()), schema)


@pytest.mark.parametrize("recipe", sorted((REPO / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_recipes_name_their_schema_for_editors(recipe):
    assert recipe.read_text().startswith("# yaml-language-server: $schema=../schemas/recipe.schema.json")


def test_schema_command_prints_the_recipe_schema(cli):
    result = cli("schema", "recipe")
    assert result.returncode == 0
    assert json.loads(result.stdout)["title"] == "npubuild recipe"


def undescribed(node, path="") -> list[str]:
    """Every object's property (anywhere in the schema) that has no description."""
    found = []
    if isinstance(node, dict):
        for name, prop in (node.get("properties") or {}).items():
            if not prop.get("description"):
                found.append(f"{path}.{name}")
        for key, value in node.items():
            found += undescribed(value, f"{path}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            found += undescribed(value, f"{path}[{i}]")
    return found


@pytest.mark.parametrize("which", ["recipe", "chip"])
def test_every_section_and_field_is_described_in_user_words(which):
    schema = json.loads(schema_text(which))
    assert undescribed(schema) == []
    assert "seed 0" not in schema_text(which)


def test_chip_and_fusion_rule_names_are_enums_and_a_chip_file_is_allowed():
    schema = json.loads(schema_text("recipe"))
    target = schema["properties"]["target"]["anyOf"]
    assert target[0]["enum"] == preset_names() and target[1]["pattern"]
    items = schema["properties"]["fusion"]["items"]
    rules = (items.get("oneOf") or items["anyOf"])[0]
    assert "conv_silu" in rules["enum"]
    jsonschema.validate({"version": 1, "name": "x", "model": {"path": "m.onnx"},
                         "target": "chips/mine.yaml"}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate({"version": 1, "name": "x", "model": {"path": "m.onnx"},
                             "target": "npu-17m"}, schema)


@pytest.mark.parametrize("entry, valid", [
    ({"conv_bn": {"tolerance": 1e-4}}, True),
    ({"conv_bnn": {"tolerance": 1e-4}}, False),  # a misspelt rule with options
    ({"conv_bn": {}, "silu": {}}, False),        # one rule per entry
])
def test_a_fusion_entry_with_options_must_name_one_registered_rule(entry, valid):
    schema = json.loads((SCHEMA_DIR / "recipe.schema.json").read_text())
    recipe = {"version": 1, "name": "r", "model": {"path": "m.onnx"}, "fusion": [entry]}
    errors = list(jsonschema.Draft202012Validator(schema).iter_errors(recipe))
    assert not errors if valid else errors
