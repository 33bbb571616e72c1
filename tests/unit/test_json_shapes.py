"""Every command's --json is one JSON object of one shape (a failure adds an ``error`` member,
so a list could not carry it):
the shapes are pinned by tests/unit/golden/json_shapes.json (NPUBUILD_UPDATE_GOLDEN=1 rewrites
it after a deliberate change). report.json (`run --json`) is pinned to its top-level keys: its
sections belong to the stages."""

import json
import os
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import TINY_RECIPE, json_shape, run_cli, write_recipe

GOLDEN = Path(__file__).parent / "golden" / "json_shapes.json"
UPDATE = os.environ.get("NPUBUILD_UPDATE_GOLDEN") == "1"


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    root = tmp_path_factory.mktemp("shapes")
    recipe = str(write_recipe(root, TINY_RECIPE))
    opts = ["--build-dir", str(root / "build"), "--cache", str(root / "cache")]
    np.save(root / "x.npy", np.zeros((1, 3, 8, 8), np.float32))
    commands = {
        "run": ["run", recipe, *opts],
        "validate": ["validate", recipe],
        "validate (a bad recipe)": ["validate", recipe, str(root / "missing.yaml")],
        "plan": ["plan", recipe, *opts],
        "show": ["show", recipe, *opts],
        "targets": ["targets"],
        "targets check": ["targets", "check", recipe, *opts],
        "infer": ["infer", recipe, "--input", str(root / "x.npy"), *opts],
        "exp show": ["exp", "show", recipe, *opts],
        "a usage error": ["run", recipe, "--bogus"],
    }
    found = {}
    for name, args in commands.items():
        result = run_cli(*args, "--json", cwd=root)
        doc = json.loads(result.stdout)
        if name == "run":
            doc = {k: "…" for k in doc}
        if name == "targets":  # what every chip has (install hints depend on this machine)
            common = set.intersection(*(set(c) for c in doc["chips"]))
            doc = {"chips": [{k: v for k, v in c.items() if k in common} for c in doc["chips"]]}
        found[name] = json_shape(doc, any_json=("…", "files", "report"))
    return found


def test_every_json_document_has_its_golden_shape(shapes):
    if UPDATE:
        GOLDEN.write_text(json.dumps(shapes, indent=2) + "\n")
    assert shapes == json.loads(GOLDEN.read_text())


def test_every_document_is_an_object(shapes):
    assert all(isinstance(shape, dict) for shape in shapes.values())


def test_validate_answers_one_object_for_one_recipe_or_many(shapes):
    one, many = shapes["validate"], shapes["validate (a bad recipe)"]
    assert set(one) == {"valid", "recipes"} and set(many) == {"valid", "recipes", "error"}
    assert one["recipes"][0] in many["recipes"]
