"""Small samples of the two trust benchmarks (benchmarks/hostile.py, benchmarks/kills.py): a few
generated hostile recipes and a few SIGKILLs, so a regression shows in the suite."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

from tests.conftest import REPO, TINY_RECIPE, write_recipe


def benchmark(name: str):
    spec = importlib.util.spec_from_file_location(f"bench_{name}", REPO / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


def test_generated_hostile_recipes_give_only_honest_exits(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tally = benchmark("hostile").run_all(25, seed=7, workdir=tmp_path, log=lambda _: None)
    assert tally["tracebacks"] == 0 and set(tally["codes"]) <= {0, 1, 2}
    assert tally["exit2"] and tally["exit2_located"] == tally["exit2"]
    behaviour = [(name, command, problem) for name, command, problems, _ in tally["failures"]
                 for problem in problems if not problem.endswith((" s", " MB"))]
    assert behaviour == []  # time and memory are the benchmark's to measure, in its own process


def test_damaged_and_checker_failing_models_exit_2_at_the_model_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    tally = benchmark("hostile").run_models(12, seed=3, workdir=tmp_path, log=lambda _: None)
    assert tally["models"] == 20 and tally["codes"] == {2: 40}
    assert tally["failures"] == []


def test_kills_in_a_cache_store_and_a_swap_resume_to_a_clean_build(tmp_path):
    """(A kill inside a stage is test_engine's; benchmarks/kills.py does 20 over all points.)"""
    kills = benchmark("kills")
    recipe = write_recipe(tmp_path, TINY_RECIPE, name="tiny.yaml")
    work = tmp_path / "work"
    work.mkdir()
    kills.plan = lambda n: [kills.Kill("store", "split", "entry+stage"),
                            kills.Kill("swap", "import", "flip")]
    tally = kills.run_kills(2, work, Path(recipe), log=lambda _: None)
    assert tally["kills"] == 2 and not tally["not_reached"]
    assert tally["failed_resumes"] == [] and tally["differing"] == []
    assert tally["cache_after_gc"] == 0
