"""Every kind of bad recipe gives one located message and exit code 2, never a traceback.

The expected messages are golden files (tests/recipes/bad_*.expected): the error text is a
contract with users. Regenerate them with NPUBUILD_UPDATE_GOLDEN=1 after a deliberate change.
"""

import os
from pathlib import Path

import pytest

from tests.conftest import REPO

BAD = sorted((REPO / "tests" / "recipes").glob("bad_*.yaml"))
UPDATE = os.environ.get("NPUBUILD_UPDATE_GOLDEN") == "1"


def check_golden(expected_path: Path, text: str) -> None:
    if UPDATE:
        expected_path.write_text(text)
    assert text == expected_path.read_text()


@pytest.mark.parametrize("recipe", BAD, ids=[p.stem for p in BAD])
def test_bad_recipe_reports_location_and_exits_2(cli, recipe):
    result = cli("validate", str(recipe.relative_to(REPO)))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: tests/recipes/{recipe.name}:")
    check_golden(recipe.with_suffix(".expected"), result.stderr)


def test_missing_recipe_file_is_a_clear_error(cli):
    result = cli("validate", "tests/recipes/no-such-recipe.yaml")
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    check_golden(REPO / "tests" / "recipes" / "missing_recipe_file.expected", result.stderr)


def test_corrupt_model_file_is_a_clear_error(cli, tmp_path):
    (tmp_path / "model.onnx").write_bytes(b"\x08\x07 this is not protobuf \xff\xff")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nname: corrupt\nmodel:\n  path: model.onnx\n")
    result = cli("run", str(recipe), "import", "--build-dir", str(tmp_path / "b"),
                 "--cache", str(tmp_path / "c"))
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "model.onnx: not a readable ONNX model" in result.stderr


def test_recipe_yaml_tags_never_execute_code(cli, tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nname: !!python/object/apply:os.system ['touch pwned']\n"
                      "model: {path: x.onnx}\n")
    result = cli("validate", str(recipe), )
    assert result.returncode == 2
    assert "could not determine a constructor" in result.stderr
    assert not (REPO / "pwned").exists() and not (tmp_path / "pwned").exists()


def test_a_bad_package_file_is_named_as_the_recipe_names_it(cli, tmp_path):
    """Never the absolute site-packages path: the recipe's own `pkg:` spelling."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nname: pkgfile\nmodel:\n  path: pkg:skimage/data/page.png\n"
                      "  format: onnx\n")
    result = cli("run", str(recipe), "import", "--build-dir", str(tmp_path / "b"),
                 "--cache", str(tmp_path / "c"))
    assert result.returncode == 2
    assert "model.path: pkg:skimage/data/page.png: not a readable ONNX model" in result.stderr
    assert "site-packages" not in result.stderr


@pytest.mark.parametrize("suffix", [".keras", ".h5"])
def test_a_keras_input_without_a_name_is_told_the_names_its_configuration_gives(cli, tmp_path, suffix):
    """The schema requires ``model.inputs[].name``; a Keras user who left it out was pointed
    at the schema, not at the model's names. The configuration names them without Keras
    (Keras 3's .keras zip; Keras 2's HDF5 ``model_config``, a Sequential's first layer)."""
    import json
    import zipfile

    functional = {"class_name": "Functional", "config": {"input_layers": [["pixels", 0, 0]]}}
    sequential = {"class_name": "Sequential", "config": {"layers": [
        {"class_name": "InputLayer", "config": {"name": "embedding_input"}}]}}
    model = tmp_path / f"m{suffix}"
    if suffix == ".keras":
        with zipfile.ZipFile(model, "w") as archive:
            archive.writestr("config.json", json.dumps(functional))
    else:
        h5py = pytest.importorskip("h5py")
        with h5py.File(model, "w") as handle:
            handle.attrs["model_config"] = json.dumps(sequential).encode()
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nname: k\nmodel:\n  path: {model.name}\n  inputs:\n"
                      "    - shape: [1, 8]\n")
    result = cli("validate", str(recipe))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    name = "pixels" if suffix == ".keras" else "embedding_input"
    assert (f"model.inputs[0].name: missing required key 'name': the model's inputs are "
            f"'{name}'") in result.stderr
