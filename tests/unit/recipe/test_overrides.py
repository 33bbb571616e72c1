"""-S FIELD=VALUE and Recipe.with_: fields set by dotted path, validated exactly as the recipe
file is, errors at the base recipe's file and line naming the override; several values of one
field make a matrix; every variant names its own build directory."""

import pytest

from npubuild.errors import UserError
from npubuild.recipe import load_recipe
from npubuild.recipe.overrides import field_path, get, parse_set, variant_label, variants
from tests.conftest import TINY_RECIPE, write_recipe


@pytest.fixture
def loaded(tmp_path):
    return load_recipe(write_recipe(tmp_path, TINY_RECIPE))


@pytest.mark.parametrize("text, expected", [
    ("quantization.scheme=symmetric", ("quantization.scheme", "symmetric")),
    ("verify.min_cosine=0.995", ("verify.min_cosine", 0.995)),
    ("compile.layer_group=false", ("compile.layer_group", False)),
    ("model.inputs[0].shape=[1, 3, 16, 16]", ("model.inputs[0].shape", [1, 3, 16, 16])),
    ("quantization.calibration.samples=4", ("quantization.calibration.samples", 4)),
    ("verify.data=", ("verify.data", "")),
])
def test_a_value_is_read_as_yaml(text, expected):
    assert parse_set(text) == expected


@pytest.mark.parametrize("text, message", [
    ("quantization.scheme", "-S quantization.scheme: expected FIELD=VALUE"),
    ("=1", "-S =1: expected FIELD=VALUE"),
    ("a..b=1", "-S a..b: an empty field name"),
    ("a[x]=1", "-S a[x]: [x] is not a list index"),
    ("a=[1, 2", "-S a=[1, 2: the value is not YAML"),
])
def test_a_malformed_set_is_one_clear_error(text, message):
    with pytest.raises(UserError) as err:
        parse_set(text)
    assert err.value.message.startswith(message) and err.value.exit_code == 2


def test_one_field_twice_is_a_matrix_and_other_fields_combine():
    assert variants(["a=1", "a=2", "b=x", "a=1"]) == [{"a": 1, "b": "x"}, {"a": 2, "b": "x"}]
    assert variants([]) == []


def test_an_override_is_validated_like_the_recipe_with_the_base_file_line(loaded):
    with pytest.raises(UserError) as err:
        loaded.with_({"quantization.calibration.method": "percentil"})
    assert str(err.value).startswith(
        f"{loaded.path}:11:16: quantization.calibration.method: overridden with \"percentil\": "
        "'percentil' is not one of minmax, percentile, kl, mse")


def test_an_unknown_override_key_gets_did_you_mean_at_the_enclosing_line(loaded):
    with pytest.raises(UserError) as err:
        loaded.with_({"quantization.shceme": "symmetric"})
    assert err.value.location.line == 9 and err.value.field == "quantization.shceme"  # `quantization:`
    assert "unknown key 'shceme'; did you mean 'scheme'?" in err.value.message


def test_an_unknown_chip_in_an_override_is_a_recipe_error(loaded):
    with pytest.raises(UserError) as err:
        loaded.with_({"target": "npu-404"})
    assert "target overridden with" not in str(err.value)
    assert 'target: overridden with "npu-404": unknown target' in str(err.value)


def test_overrides_create_missing_sections_and_index_lists(loaded):
    changed = loaded.with_({"verify.handover.min_cosine": 0.9, "model.inputs[0].shape": [1, 3, 16, 16]})
    assert changed.recipe.verify.handover.min_cosine == 0.9
    assert changed.recipe.model.inputs[0].shape == [1, 3, 16, 16]
    assert loaded.recipe.model.inputs[0].shape == [1, 3, 8, 8]  # the base is untouched
    with pytest.raises(UserError, match="index 2 is past the end of a list of 1"):
        loaded.with_({"model.inputs[2].shape": [1]})


def test_every_variant_builds_into_its_own_directory(loaded):
    chip = loaded.variant({"target": "npu-tiny"})
    exp = loaded.variant({"quantization.scheme": "asymmetric"})
    assert chip.recipe.name == "tiny@npu-tiny" and chip.recipe.target == "npu-tiny"
    assert exp.recipe.name == f"tiny@{variant_label({'quantization.scheme': 'asymmetric'})}"
    assert exp.recipe.name.startswith("tiny@exp-") and len(exp.recipe.name) == len("tiny@exp-") + 8
    again = loaded.variant({"quantization.scheme": "asymmetric"})
    assert again.recipe.name == exp.recipe.name  # the same overrides, the same directory
    assert variant_label({"a": 1, "b": 2}) == variant_label({"b": 2, "a": 1})


def test_field_paths_and_get_read_the_same_notation():
    assert field_path("model.inputs[0].shape") == ("model", "inputs", 0, "shape")
    data = {"model": {"inputs": [{"shape": [1, 3]}]}}
    assert get(data, "model.inputs[0].shape") == [1, 3] and get(data, "model.outputs") is None
