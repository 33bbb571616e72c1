"""`plan` predicts exactly what `run` then does, stage by stage (current / restored / built),
through a fresh build, a no-op, an edit, its revert, and a lost build directory."""

from __future__ import annotations

import json
import shutil

import pytest

from npubuild import api
from npubuild.engine.session import PLANNED
from tests.conftest import TINY_RECIPE, write_recipe


def plan_and_run(recipe, tmp_path) -> tuple[dict, dict]:
    opts = {"build_root": tmp_path / "build", "cache": tmp_path / "cache"}
    planned = {r.stage: r.status for r in api.plan(api.session_for(recipe, **opts))}
    session = api.session_for(recipe, **opts)
    api.build(session)
    ran = {name: PLANNED.get(r.status, r.status) for name, r in session.results.items()}
    return planned, ran


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """(planned, ran) for each step of a recipe's life."""
    tmp_path = tmp_path_factory.mktemp("plan")
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    report = tmp_path / "build" / "tiny" / "report.json"
    steps = {"fresh": plan_and_run(recipe, tmp_path), "no-op": plan_and_run(recipe, tmp_path)}
    steps["no-op report"] = json.loads(report.read_text())
    recipe.write_text(TINY_RECIPE.replace("scheme: symmetric", "scheme: asymmetric"))
    steps["edit"] = plan_and_run(recipe, tmp_path)
    recipe.write_text(TINY_RECIPE)
    steps["revert"] = plan_and_run(recipe, tmp_path)
    shutil.rmtree(tmp_path / "build")
    steps["lost build dir"] = plan_and_run(recipe, tmp_path)
    steps["report"] = json.loads(report.read_text())
    return steps


@pytest.mark.parametrize("step", ["fresh", "no-op", "edit", "revert", "lost build dir"])
def test_plan_says_what_run_does(history, step):
    planned, ran = history[step]
    assert planned == ran


def test_the_steps_exercise_every_outcome(history):
    assert set(history["fresh"][0].values()) == {"will run"}
    assert set(history["no-op"][0].values()) == {"current"}
    assert history["edit"][0]["split"] == "current" and history["edit"][0]["quantize"] == "will run"
    assert history["revert"][0]["quantize"] == "will restore"
    assert set(history["lost build dir"][0].values()) == {"will restore"}


def test_current_stages_keep_the_seconds_of_the_run_that_built_them(history):
    stages = history["no-op report"]["stages"]
    assert all(s["status"] == "current" for s in stages.values())
    assert all(s["built_seconds"] > 0 for s in stages.values())


def test_stages_restored_with_no_record_of_their_build_have_no_seconds(history):
    # the build directory (and its report.json) is gone: no run on record timed these artifacts
    stages = history["report"]["stages"]
    assert all(s["status"] == "restored" for s in stages.values())
    assert all(s["built_seconds"] is None for s in stages.values())
