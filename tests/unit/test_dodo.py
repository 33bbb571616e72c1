"""dodo.py exposes every recipe's stages to plain doit, through the same task builder; on a
fresh clone (a recipe's model not generated yet) neither `doit list` nor `doit` crashes."""

import os
import shutil
import subprocess
import sys

from tests.conftest import REPO, TINY_RECIPE, write_recipe


def doit(*args, cwd=REPO):
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "doit", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


def test_doit_list_shows_every_recipe_stage():
    result = doit("list", "--all")
    assert result.returncode == 0, result.stderr
    names = {line.split()[0] for line in result.stdout.splitlines() if line.strip()}
    for recipe in ("yolov8n", "yolov8n-strict", "resnet50", "mobilenetv2-tf"):
        assert {f"{recipe}:import", f"{recipe}:split", f"{recipe}:verify"} <= names


def test_each_recipe_group_describes_its_own_recipe():
    result = doit("list")
    docs = dict(line.split(None, 1) for line in result.stdout.splitlines() if line.strip())
    assert docs["yolov8n"] == "recipes/yolov8.yaml: pkg:nudenet/320n.onnx on npu-16m"
    assert docs["yolov8n-strict"].startswith("recipes/yolov8-strict.yaml: ")
    assert len(set(docs.values())) == len(docs)


def test_a_recipe_whose_model_is_missing_is_one_failing_task_with_npubuilds_message(tmp_path):
    shutil.copy(REPO / "dodo.py", tmp_path)
    recipes = tmp_path / "recipes"
    recipes.mkdir()
    write_recipe(recipes, TINY_RECIPE.replace("name: tiny", "name: fresh").replace(
        str(REPO / "tests" / "data" / "tiny.onnx"), "../models/generated.onnx"), "fresh.yaml")
    listed = doit("list", cwd=tmp_path)
    assert listed.returncode == 0 and "Traceback" not in listed.stderr, listed.stderr
    built = doit(cwd=tmp_path)
    out = built.stdout + built.stderr
    assert built.returncode == 1, out
    assert "Traceback" not in out
    assert out.count("TaskFailed") == 1 and "fresh:import" in out
    assert "recipes/fresh.yaml:4:9: model.path: model file not found" in out
