"""Experiments: `run R -S FIELD=VALUE` builds a validated variant into its own directory, several
values make a matrix, `exp show R` tabulates what was built (golden), and a bad override is a
recipe error at the base recipe's line before anything is built."""

import json
import os
from pathlib import Path

import pytest

from tests.conftest import TINY_RECIPE, run_cli, write_recipe

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("NPUBUILD_UPDATE_GOLDEN") == "1"


def opts(root):
    return ["--build-dir", str(root / "build"), "--cache", str(root / "cache")]


@pytest.fixture(scope="module")
def experiments(tmp_path_factory):
    """The tiny recipe built as is, with one -S field, and as a matrix of two methods."""
    root = tmp_path_factory.mktemp("exp")
    recipe = write_recipe(root, TINY_RECIPE)
    runs = [run_cli("run", str(recipe), *opts(root)),
            run_cli("run", str(recipe), "-S", "quantization.scheme=asymmetric", *opts(root)),
            run_cli("run", str(recipe), "-S", "quantization.calibration.method=percentile",
                    "-S", "quantization.calibration.method=mse", *opts(root))]
    return root, recipe, runs


def test_one_set_builds_a_variant_like_a_run_into_its_own_directory(experiments):
    root, _, runs = experiments
    single = runs[1]
    assert single.returncode == 0, single.stderr
    name = next(p.name for p in (root / "build").iterdir()
                if (p / "experiment.json").is_file()
                and json.loads((p / "experiment.json").read_text())["overrides"]
                == {"quantization.scheme": "asymmetric"})
    assert name.startswith("tiny@exp-")
    assert single.stderr.startswith(f'experiment {name}: quantization.scheme="asymmetric"\n')
    assert "  import    restored" in single.stderr  # the recipe's own build filled the cache
    assert "  quantize  built" in single.stderr
    assert single.stdout.splitlines()[0] == "verify passed"
    lock = json.loads((root / "build" / name / "recipe.lock").read_text())
    assert lock["resolved"]["quantization"]["scheme"] == "asymmetric"


def test_a_field_given_twice_is_a_matrix_with_one_row_each(experiments):
    _, _, runs = experiments
    matrix = runs[2]
    assert matrix.returncode == 0, matrix.stderr
    lines = matrix.stdout.splitlines()
    assert lines[0].startswith("| variant | quantization.calibration.method | state | verdict |")
    assert [line.split(" | ")[1] for line in lines[2:]] == ["percentile", "mse"]


def test_exp_show_tabulates_every_variant_built(experiments):
    root, recipe, _ = experiments
    shown = run_cli("exp", "show", str(recipe), *opts(root))
    assert shown.returncode == 0, shown.stderr
    golden = GOLDEN / "exp_show_tiny.txt"
    if UPDATE:
        golden.write_text(shown.stdout)
    assert shown.stdout == golden.read_text()
    rows = json.loads(run_cli("exp", "show", str(recipe), "--json", *opts(root)).stdout)["variants"]
    assert [r["state"] for r in rows] == ["current"] * 4
    assert rows[0] == {**rows[0], "variant": "tiny", "quantization.scheme": "symmetric",
                       "quantization.calibration.method": None,  # unset: min/max, searched
                       "verdict": "pass"}


def test_exp_show_says_when_the_recipe_moved_on(experiments, tmp_path):
    root, recipe, _ = experiments
    edited = write_recipe(root, TINY_RECIPE.replace("samples: 2", "samples: 1"), "edited.yaml")
    rows = json.loads(run_cli("exp", "show", str(edited), "--json", *opts(root)).stdout)["variants"]
    assert all(r["state"].startswith("stale: quantize, compile, verify (recipe section "
                                     "`quantization` changed)") for r in rows)


def test_a_bad_override_is_a_recipe_error_before_anything_is_built(tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    result = run_cli("run", str(recipe), "-S", "quantization.calibration.method=percentil",
                     "-S", "quantization.calibration.method=kl", *opts(tmp_path))
    assert result.returncode == 2
    assert result.stderr.startswith(
        f"error: {recipe}:11:16: quantization.calibration.method: overridden with \"percentil\": "
        "'percentil' is not one of minmax, percentile, kl, mse")
    assert not (tmp_path / "build").exists()
