"""A recipe is validated by the recipe model of the surgery steps it names (`recipe_model_for`):
it imports only those rewrites, and what it gives is what the full `Recipe` gives."""

from __future__ import annotations

import subprocess
import sys

from npubuild.recipe import load_recipe
from npubuild.recipe.model import Recipe, recipe_model_for
from tests.conftest import REPO


def test_loading_a_recipe_imports_only_the_rewrites_it_names():
    code = ("import sys; from npubuild.recipe import load_recipe; "
            "loaded = load_recipe('recipes/yolov8.yaml'); "
            "print(sorted(m for m in sys.modules if m.startswith('npubuild.surgery.') "
            "and m.rsplit('.', 1)[1] in ('folding', 'nodes', 'gemm', 'rank4', 'io')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=REPO, env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"})
    assert out.stdout.split() == ["['npubuild.surgery.folding']"]


def test_the_model_of_a_recipes_steps_gives_what_the_full_model_gives():
    loaded = load_recipe(REPO / "recipes/yolov8.yaml")
    data = loaded.marked.data
    assert type(loaded.recipe) is recipe_model_for(data) is not Recipe
    full = Recipe.model_validate(data)
    assert full == loaded.recipe and loaded.recipe == full
    assert full.model_dump(mode="json") == loaded.dumped
    assert loaded.recipe.model_copy(update={"name": "other"}) != full
    assert recipe_model_for({"surgery": [{"remove_nodes": {}}, {"frobnicate": {}}, 5]}) \
        is recipe_model_for({"surgery": [{"remove_nodes": {"nodes": ["a"]}}]})
