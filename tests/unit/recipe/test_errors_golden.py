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
def test_a_keras_input_without_a_name_takes_the_name_its_configuration_gives(tmp_path, suffix):
    """A recipe that lists the model's one input without ``name`` is named from the model
    (read without Keras: Keras 3's .keras zip; Keras 2's HDF5 ``model_config``, a Sequential's
    first layer), as TPU-MLIR and RKNN take inputs by position."""
    import json
    import zipfile

    from npubuild.recipe import load_recipe

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
    loaded = load_recipe(recipe, check_files=False)
    assert [i.name for i in loaded.recipe.model.inputs] == [
        "pixels" if suffix == ".keras" else "embedding_input"]


def test_unnamed_inputs_take_the_model_inputs_the_recipe_does_not_name_in_order(tmp_path):
    """khmersm's model has inputs x and mask: a recipe naming mask first and leaving the other
    unnamed gets x there; one listing both unnamed gets them in the model's order."""
    import onnx
    from onnx import TensorProto, helper

    from npubuild.recipe import load_recipe

    model = tmp_path / "two.onnx"
    graph = helper.make_graph([helper.make_node("Add", ["x", "mask"], ["y"])], "two",
                              [helper.make_tensor_value_info(n, TensorProto.FLOAT, [1, 4]) for n in ("x", "mask")],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), model)
    recipe = tmp_path / "r.yaml"
    for inputs, names in (("    - {name: mask, shape: [1, 4]}\n    - {shape: [1, 4]}\n", ["mask", "x"]),
                          ("    - {shape: [1, 4]}\n    - {shape: [1, 4]}\n", ["x", "mask"])):
        recipe.write_text(f"version: 1\nname: t\nmodel:\n  path: {model.name}\n  inputs:\n{inputs}")
        loaded = load_recipe(recipe, check_files=False)
        assert [i.name for i in loaded.recipe.model.inputs] == names
