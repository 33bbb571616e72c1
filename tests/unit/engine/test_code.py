"""Stage keys cover npubuild's code, not only its version string: two commits with the same
version must never share cache entries (a shared remote would hand one commit's artifacts to
the other), and the same source must give the same keys wherever it is installed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

import npubuild
from npubuild import api
from npubuild.engine import session as engine
from npubuild.engine import code
from npubuild.engine.code import DATA_PATTERNS, code_digest, remembered_code_digest, tree_digest
from npubuild.engine.hashing import HashCache
from npubuild.stages import PIPELINE
from tests.conftest import REPO, TINY_RECIPE, write_recipe

PACKAGE = Path(npubuild.__file__).resolve().parent


def copy_package(into: Path) -> Path:
    shutil.copytree(PACKAGE, into / "npubuild", ignore=shutil.ignore_patterns("__pycache__"))
    return into / "npubuild"


def test_the_same_tree_in_another_directory_has_the_same_digest(tmp_path):
    copy = copy_package(tmp_path / "elsewhere")
    assert tree_digest(copy) == tree_digest(PACKAGE) == code_digest()


def test_byte_code_and_stray_files_do_not_count(tmp_path):
    copy = copy_package(tmp_path)
    before = tree_digest(copy)
    (copy / "engine" / "__pycache__").mkdir(exist_ok=True)
    (copy / "engine" / "__pycache__" / "keys.cpython-311.pyc").write_bytes(b"\x00byte code")
    (copy / "engine" / "keys.py.orig").write_text("an editor's backup, not shipped in a wheel")
    assert tree_digest(copy) == before


@pytest.mark.parametrize("changed", ["engine/keys.py", "targets/npu-16m.yaml",
                                     "schemas/npu_ir.schema.json"])
def test_changing_a_source_or_shipped_data_file_changes_the_digest(tmp_path, changed):
    copy = copy_package(tmp_path)
    before = tree_digest(copy)
    with (copy / changed).open("a") as fh:
        fh.write("\n")
    assert tree_digest(copy) != before


def test_renaming_a_module_changes_the_digest(tmp_path):
    copy = copy_package(tmp_path)
    before = tree_digest(copy)
    (copy / "timings.py").rename(copy / "timing.py")
    assert tree_digest(copy) != before


def test_the_shipped_data_is_what_pyproject_ships():
    config = tomllib.loads((REPO / "pyproject.toml").read_text())
    assert tuple(config["tool"]["setuptools"]["package-data"]["npubuild"]) == DATA_PATTERNS


def test_a_wheel_install_has_the_digest_of_the_source_it_was_built_from(tmp_path):
    source = tmp_path / "source"
    copy_package(source)
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-build-isolation", "--no-deps",
                    "-q", "-w", str(tmp_path / "dist"), str(source)], check=True,
                   capture_output=True)
    wheel = next((tmp_path / "dist").glob("npubuild-*.whl"))
    zipfile.ZipFile(wheel).extractall(tmp_path / "installed")
    assert tree_digest(tmp_path / "installed" / "npubuild") == code_digest()


def test_other_code_changes_every_stage_key(tmp_path, monkeypatch):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    session = api.session_for(recipe, build_root=tmp_path / "b", cache=tmp_path / "c")
    report = api.build(session)
    built = {s: v["key"] for s, v in report["stages"].items()}

    monkeypatch.setattr(engine, "remembered_code_digest", lambda hashes: "0" * 64)  # another commit
    fresh = api.session_for(recipe, build_root=tmp_path / "b", cache=tmp_path / "c")
    keys = {s.name: fresh.parts(s).key for s in PIPELINE}
    assert all(keys[s] != built[s] for s in built) and len(built) == len(PIPELINE)
    plan = fresh.plan(PIPELINE)
    assert plan[0].status == "will run" and plan[0].reason.startswith("npubuild's code changed")


def test_a_build_reads_the_code_again_only_when_a_code_file_changed(tmp_path, monkeypatch):
    files = [tmp_path / "a.py", tmp_path / "b.py"]
    for path in files:
        path.write_text(f"# {path.name}\n")
    reads = []
    monkeypatch.setattr(code, "running_package", lambda: tmp_path)
    monkeypatch.setattr(code, "running_code_files", lambda: tuple(files))
    monkeypatch.setattr(code, "code_digest",
                        lambda: reads.append(1) or tree_digest(tmp_path, files))
    first = HashCache(tmp_path / "hashes.json")
    digest = remembered_code_digest(first)
    first.save()
    assert remembered_code_digest(HashCache(tmp_path / "hashes.json")) == digest
    assert len(reads) == 1  # remembered by the files' stat keys
    files[1].write_text("# b.py, edited\n")
    assert remembered_code_digest(HashCache(tmp_path / "hashes.json")) != digest
    assert len(reads) == 2
