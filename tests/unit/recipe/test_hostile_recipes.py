"""Hostile recipes: bounded loading, confined pkg: paths, strict values, located errors."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from npubuild.errors import UserError
from npubuild.recipe import load_recipe
from npubuild.recipe.load import MAX_DEPTH, read_yaml
from npubuild.recipe.paths import resolve, resolve_glob
from tests.conftest import TINY_RECIPE

LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))


def located(path: Path, exc: UserError) -> bool:
    """The error names the file, a line and a column."""
    loc = exc.location
    return loc is not None and loc.file == str(path) and loc.line and loc.column


@pytest.mark.parametrize("text, message", [
    (LAUGHS, "more than 10,000 values"),
    ("version: 1\na: &a [1, *a]\n", "recursive alias"),
    ("version: 1\nx: " + "[" * 1000 + "]" * 1000 + "\n", f"deeper than {MAX_DEPTH}"),
    ("x: " + "[" * 100_000 + "]" * 100_000 + "\n", f"deeper than {MAX_DEPTH}"),
    ("version: 1\n" + "".join(f"k{i}: 1\n" for i in range(40_000)), "more than 10,000 values"),
    ("a: &a {k: [1, 2]}\n" + "b: &b [" + ", ".join(["*a"] * 64) + "]\n" +
     "c: [" + ", ".join(["*b"] * 200) + "]\n", "more than 10,000 values"),
])
def test_unbounded_yaml_is_refused_before_it_is_walked(tmp_path, text, message):
    path = tmp_path / "r.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=message) as err:
        read_yaml(path)
    assert located(path, err.value)


def test_a_file_over_the_size_limit_is_refused_unread(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("# " + "x" * (1 << 20) + "\n")
    with pytest.raises(UserError, match="at most 1,048,576"):
        read_yaml(path)


def test_huge_values_never_reach_the_message(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(TINY_RECIPE.replace("version: 1", "version: 1\nnmae: &n " + "y" * 500_000)
                    + "extra: [" + ", ".join(["*n"] * 100) + "]\n")
    with pytest.raises(UserError) as err:
        load_recipe(path)
    assert len(str(err.value)) < 1000 and located(path, err.value)


def test_a_merge_key_is_legal_yaml_not_a_duplicate(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text(TINY_RECIPE.replace("quantization:\n  scheme: symmetric", "defaults: &d\n"
                    "  scheme: symmetric\n  granularity: per_channel\nquantization:\n  <<: *d\n"
                    "  scheme: asymmetric").replace("  granularity: per_tensor\n", ""))
    marked = read_yaml(path)
    assert marked.data["quantization"]["scheme"] == "asymmetric"  # the mapping's own key wins
    assert marked.data["quantization"]["granularity"] == "per_channel"
    assert marked.keys[("quantization", "scheme")][0] == 14  # the explicit key's line
    assert marked.keys[("quantization", "granularity")][0] == 11  # the merged key's line


def test_a_real_duplicate_key_is_still_reported(tmp_path):
    path = tmp_path / "r.yaml"
    path.write_text("version: 1\nname: a\nname: b\n")
    with pytest.raises(UserError, match="duplicate key 'name'"):
        read_yaml(path)


@pytest.mark.parametrize("value, line, message", [
    ("!!int abc", 3, "'abc' is not a valid !!int value"),
    ("!!bool maybe", 3, "'maybe' is not a valid !!bool value"),
    ("!!timestamp 2020-13-01", 3, "not a valid !!timestamp value"),
    ("[1, !!float x]", 3, "'x' is not a valid !!float value"),
])
def test_a_tag_that_does_not_fit_its_value_is_a_located_recipe_error(tmp_path, value, line,
                                                                      message):
    path = tmp_path / "r.yaml"
    path.write_text(f"version: 1\nname: a\nsamples: {value}\n")
    with pytest.raises(UserError, match=message) as err:
        read_yaml(path)
    assert err.value.location.line == line and err.value.hint.startswith("remove the tag")


@pytest.mark.parametrize("spec, message", [
    ("pkg:onnx//etc/passwd", "must stay inside it"),
    ("pkg:onnx/../nudenet/320n.onnx", "must stay inside it"),
    ("pkg:this.x/y", "not a top-level package name"),
    ("pkg:/onnx", "not of the form"),
    ("~nosuchuser_npubuild/m.onnx", "cannot expand"),
    ("x" * 5000, "at most 1024"),
])
def test_bad_paths_are_user_errors(spec, message):
    with pytest.raises(UserError, match=message):
        resolve(spec, Path("."))


def test_pkg_paths_never_import_the_package(tmp_path, monkeypatch):
    package = tmp_path / "evil_npubuild_pkg"
    package.mkdir()
    (package / "__init__.py").write_text(f"open({str(tmp_path / 'ran')!r}, 'w').write('x')\n")
    (package / "data.npy").write_bytes(b"")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert resolve("pkg:evil_npubuild_pkg/data.npy", Path(".")) == package / "data.npy"
    assert not (tmp_path / "ran").exists() and "evil_npubuild_pkg" not in sys.modules
    with pytest.raises(UserError, match="not a top-level package"):
        resolve("pkg:evil_npubuild_pkg.sub/x", Path("."))
    assert not (tmp_path / "ran").exists()


def test_a_pkg_symlink_out_of_the_package_is_refused(tmp_path, monkeypatch):
    package = tmp_path / "linky_npubuild_pkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "passwd.png").symlink_to("/etc/passwd")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(UserError, match="through a symlink"):
        resolve("pkg:linky_npubuild_pkg/passwd.png", Path("."))
    with pytest.raises(UserError, match="no file matches"):
        resolve_glob("pkg:linky_npubuild_pkg/*.png", Path("."))


def test_an_empty_data_list_is_a_user_error():
    with pytest.raises(UserError, match="no data files given"):
        resolve_glob([], Path("."))


def test_a_fifo_as_the_model_is_refused_without_reading_it(tmp_path):
    fifo = tmp_path / "model.onnx"
    os.mkfifo(fifo)
    path = tmp_path / "r.yaml"
    path.write_text(TINY_RECIPE.replace(TINY_RECIPE.split("path: ")[1].split("\n")[0], str(fifo)))
    with pytest.raises(UserError, match="not a regular file") as err:
        load_recipe(path)
    assert err.value.field == "model.path" and located(path, err.value)


@pytest.mark.parametrize("old, new, field", [
    ("version: 1", "version: true", "version"),
    ("samples: 2}", 'samples: "7"}', "quantization.calibration.samples"),
    ("[1, 3, 8, 8]", "[true, 3, 8, 8]", "model.inputs[0].shape[0]"),
    ("[1, 3, 8, 8]", "[1, 0, 8, 8]", "model.inputs[0].shape"),
    ("[1, 3, 8, 8]", "[1, 3, 9223372036854775808, 8]", "model.inputs[0].shape"),
    ("[1, 3, 8, 8]", "[1, 3, 1048576, 1048576]", "model.inputs[0].shape"),
    ("[1, 3, 8, 8]", "[1, 3, 40000, 40000]", "model.inputs[0].shape"),
    ("scale: 0.00392156862745098", "scale: .nan", "model.inputs[0].preprocess.scale"),
    ("scale: 0.00392156862745098", "scale: .inf", "model.inputs[0].preprocess.scale"),
    ("scale: 0.00392156862745098", "scale: 0.1, mean: [1, 2]", "model.inputs[0].preprocess"),
    ("resize: [8, 8]", "resize: [40000, 40000]", "model.inputs[0].preprocess.resize"),
    ("name: tiny", "name: " + "n" * 300, "name"),
    ("per_tensor\n", "per_tensor\nverify: {min_sqnr_db: .nan}\n", "verify.min_sqnr_db"),
])
def test_lax_or_unbounded_values_are_located_user_errors(tmp_path, old, new, field):
    path = tmp_path / "r.yaml"
    assert old in TINY_RECIPE
    path.write_text(TINY_RECIPE.replace(old, new, 1))
    with pytest.raises(UserError) as err:
        load_recipe(path)
    assert err.value.field == field and located(path, err.value)
