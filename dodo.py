"""Plain `doit` entry point: every recipe in recipes/ as tasks ``<recipe name>:<stage>``.

`doit list` shows them and `doit yolov8n:import` builds one; `npubuild run` uses the same
task builder (`npubuild.build.tasks.stage_task_dicts`), so both see the same DAG and cache.
"""

from pathlib import Path

from npubuild.build.engine import BuildSession
from npubuild.build.tasks import stage_task_dicts
from npubuild.recipe import load_recipe
from npubuild.stages import PIPELINE

DOIT_CONFIG = {"dep_file": "build/.doit-dodo.sqlite", "backend": "sqlite3", "verbosity": 2}


def task_recipes():
    """Every stage of every recipe in recipes/."""
    for path in sorted(Path("recipes").glob("*.yaml")):
        session = BuildSession(load_recipe(path))
        for task in stage_task_dicts(session, PIPELINE):
            basename, _, stage = task.pop("name").partition(":")
            yield {**task, "basename": basename, "name": stage}
