"""Generated JSON Schemas (recipe, chip) and the checked-in ones (graph_infos, IR dump)."""

from __future__ import annotations

import json
from functools import lru_cache
from pathlib import Path

SCHEMA_DIR = Path(__file__).resolve().parent.parent / "schemas"


def generated(which: str) -> dict:
    if which == "recipe":
        from npubuild.recipe.model import recipe_json_schema

        return recipe_json_schema()
    if which == "chip":
        from npubuild.targets.model import chip_json_schema

        return chip_json_schema()
    raise ValueError(f"no generated schema called {which!r}")


def schema_text(which: str) -> str:
    return json.dumps(generated(which), indent=2, sort_keys=False) + "\n"


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    """A checked-in schema from schemas/, e.g. ``load("graph_infos")`` (npubuild is installed
    from its source tree, `pip install -e`, so the directory is beside the package)."""
    return json.loads((SCHEMA_DIR / f"{name}.schema.json").read_text())


def validate(data: dict, name: str) -> None:
    """Validate ``data`` against schemas/<name>.schema.json (raises jsonschema's error)."""
    import jsonschema

    jsonschema.validate(data, load(name))
