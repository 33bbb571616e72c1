""".pre-commit-hooks.yaml: the hooks validate the changed recipes they are given, as pre-commit
runs them (its own `try-repo` when pre-commit is installed, else the hook's entry with the file
names appended, which is what pre-commit does)."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess

import pytest
import yaml

from tests.conftest import REPO, TINY_MODEL, TINY_RECIPE

HOOKS = yaml.safe_load((REPO / ".pre-commit-hooks.yaml").read_text())
ENV = {**os.environ, "PYTHONPATH": str(REPO), "NO_COLOR": "1"}


@pytest.fixture
def project(tmp_path):
    """A team's repository: one good recipe, one with a bad scheme, and a YAML that is no recipe."""
    (tmp_path / "recipes").mkdir()
    shutil.copy(TINY_MODEL, tmp_path / "recipes" / "tiny.onnx")
    good = TINY_RECIPE.replace(str(TINY_MODEL), "tiny.onnx")
    (tmp_path / "recipes" / "good.yaml").write_text(good)
    (tmp_path / "recipes" / "bad.yaml").write_text(good.replace("scheme: symmetric", "scheme: pow3"))
    (tmp_path / "ci.yaml").write_text("jobs: {}\n")
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    subprocess.run(["git", "-C", str(tmp_path), "add", "-A"], check=True)
    return tmp_path


def test_every_hook_runs_npubuild_validate_on_recipe_files_only():
    assert {h["id"] for h in HOOKS} == {"npubuild-validate", "npubuild-validate-system"}
    for hook in HOOKS:
        assert shlex.split(hook["entry"]) == ["npubuild", "validate"]
        assert re.search(hook["files"], "recipes/yolov8.yaml")
        assert re.search(hook["files"], "deploy/recipes/zoo/a.yaml")
        assert not re.search(hook["files"], "ci.yaml")


@pytest.mark.skipif(not shutil.which("npubuild"), reason="the npubuild command is not on PATH "
                    "(pip install -e . puts it there)")
def test_the_hook_entry_with_file_names_appended_fails_on_the_bad_recipe_only(project):
    entry = shlex.split(HOOKS[0]["entry"])
    proc = subprocess.run(entry + ["recipes/good.yaml", "recipes/bad.yaml"], cwd=project, env=ENV,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert proc.stdout.startswith("recipes/good.yaml: valid")
    assert proc.stderr.startswith("error: recipes/bad.yaml:10:11: quantization.scheme: 'pow3'")


@pytest.mark.skipif(not (shutil.which("pre-commit") and shutil.which("npubuild")),
                    reason="pre-commit (PyPI; in the test extra) or npubuild not on PATH")
def test_pre_commit_try_repo_runs_the_system_hook(project):
    proc = subprocess.run(["pre-commit", "try-repo", str(REPO), "npubuild-validate-system",
                           "--files", "recipes/good.yaml", "recipes/bad.yaml", "ci.yaml"],
                          cwd=project, env=ENV, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "recipes/good.yaml: valid" in proc.stdout
    assert "error: recipes/bad.yaml:10:11: quantization.scheme" in proc.stdout
    assert "ci.yaml:" not in proc.stdout.replace("recipes/", "")
