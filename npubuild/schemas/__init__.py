"""JSON Schemas: generated ones (recipe, chip) and the ones shipped in this package
(graph_infos, npu_ir), read through `importlib.resources` so a wheel install finds them.

`schemas/` at the repository root holds a copy of all four for editors and reviewers
(``npubuild schema NAME > schemas/NAME.schema.json``); a test keeps it in sync.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources

GENERATED = ("recipe", "chip")
SHIPPED = ("graph_infos", "npu_ir")
NAMES = GENERATED + SHIPPED


def generated(which: str) -> dict:
    if which == "recipe":
        from npubuild.recipe.model import recipe_json_schema

        return recipe_json_schema()
    if which == "chip":
        from npubuild.targets.model import chip_json_schema

        return chip_json_schema()
    raise ValueError(f"no generated schema called {which!r}")


def schema_text(which: str) -> str:
    """The schema ``which`` (one of NAMES) as the text of its schemas/ file."""
    if which in SHIPPED:
        return shipped_text(which)
    return json.dumps(generated(which), indent=2, sort_keys=False) + "\n"


def shipped_text(name: str) -> str:
    return resources.files(__package__).joinpath(f"{name}.schema.json").read_text("utf-8")


@lru_cache(maxsize=None)
def load(name: str) -> dict:
    """A schema shipped in this package, e.g. ``load("graph_infos")``."""
    return json.loads(shipped_text(name))


def validate(data: dict, name: str) -> None:
    """Validate ``data`` against the shipped schema ``name`` (raises
    ``jsonschema_rs.ValidationError``). jsonschema-rs, not jsonschema: compile validates every
    IR document it writes, and jsonschema took 14 s of CPU on nakdimon's (7,677 layers, 41 MB),
    jsonschema-rs 0.03 s; the tests check the documents with jsonschema too."""
    _validator(name).validate(data)


@lru_cache(maxsize=None)
def _validator(name: str):
    import jsonschema_rs

    return jsonschema_rs.validator_for(load(name))
