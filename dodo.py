"""Plain `doit` entry point: every recipe in recipes/ as tasks ``<recipe name>:<stage>``.

`doit list --all` shows them and `doit yolov8n:import` builds one; `npubuild run` uses the same
task builder (`npubuild.engine.tasks.stage_task_dicts`), so both see the same DAG and cache.
A recipe that cannot be loaded becomes one task that fails with npubuild's message.
"""

from pathlib import Path

from doit.exceptions import TaskFailed

from npubuild.engine.session import BuildSession
from npubuild.engine.tasks import stage_task_dicts
from npubuild.errors import NpubuildError
from npubuild.recipe import load_recipe
from npubuild.stages import PIPELINE

Path("build").mkdir(exist_ok=True)  # doit opens its state file before any task runs
DOIT_CONFIG = {"dep_file": "build/.doit-dodo.sqlite", "backend": "sqlite3", "verbosity": 2}


def group_doc(path: Path, session: BuildSession) -> str:
    """What `doit list` shows for a recipe: its file, model and chip."""
    recipe = session.loaded.recipe
    return f"{path}: {recipe.model.path} on {recipe.target}"


def task_recipes():
    """Every stage of every recipe in recipes/."""
    for path in sorted(Path("recipes").glob("*.yaml")):
        try:
            session = BuildSession(load_recipe(path, check_files=False))
            tasks = list(stage_task_dicts(session, PIPELINE))
        except NpubuildError as exc:
            yield {"basename": path.stem, "actions": [lambda exc=exc: TaskFailed(str(exc))],
                   "doc": f"{path}: cannot be loaded"}
            continue
        yield {"basename": session.loaded.recipe.name, "name": None,
               "doc": group_doc(path, session)}
        for task in tasks:
            basename, _, stage = task.pop("name").partition(":")
            yield {**task, "basename": basename, "name": stage}
