"""The model format is told from model.path when the recipe does not set model.format."""

from __future__ import annotations

import pytest

from npubuild.errors import UserError
from npubuild.recipe import load_recipe
from tests.conftest import write_recipe


def recipe_for(tmp_path, model_name: str, fmt: str | None = None):
    model = tmp_path / model_name
    model.mkdir() if model_name.endswith("_saved_model") else model.write_bytes(b"x")
    body = f"version: 1\nname: m\nmodel:\n  path: {model_name}\n" + (
        f"  format: {fmt}\n" if fmt else "")
    return load_recipe(write_recipe(tmp_path, body), check_files=False)


@pytest.mark.parametrize("name, fmt", [
    ("m.onnx", "onnx"), ("m.pb", "tf_frozen"), ("m.keras", "keras"), ("m.h5", "keras"),
    ("emotion_model.hdf5", "keras"), ("m.HDF5", "keras"), ("m.tflite", "tflite"),
    ("m_saved_model", "saved_model"),
])
def test_the_format_is_told_from_the_file_name(tmp_path, name, fmt):
    assert recipe_for(tmp_path, name).model_format == fmt


def test_an_unknown_suffix_asks_for_model_format(tmp_path):
    with pytest.raises(UserError, match="cannot tell the model format") as err:
        recipe_for(tmp_path, "m.bin").model_format
    assert "model.format" in err.value.hint


def test_model_format_overrides_the_suffix(tmp_path):
    assert recipe_for(tmp_path, "weights.bin", "keras").model_format == "keras"
