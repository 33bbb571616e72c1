"""The public Python API (`npubuild.load`, `Recipe.with_`, `build`, `plan`, `infer`, `Result`):
a variant is validated as the recipe file is (the reason it exists: a pydantic model_copy took
``method: "percentil"``), builds apart, and a failed verify is a Result, not an exception."""

import subprocess
import sys

import numpy as np
import pytest

import npubuild
from npubuild.errors import UserError
from tests.conftest import REPO, TINY_RECIPE, write_recipe


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("facade")
    recipe = npubuild.load(write_recipe(root, TINY_RECIPE))
    options = {"build_dir": root / "build", "cache": root / "cache"}
    return recipe, options, recipe.build(**options)


def test_the_package_root_stays_light_and_exports_the_facade():
    code = "import sys, npubuild; print(sorted(m for m in ('pydantic', 'numpy', 'onnx') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True)
    assert out.stdout.strip() == "[]"
    assert npubuild.load is npubuild.facade.load and npubuild.Result is npubuild.facade.Result


def test_with_validates_like_the_recipe_file(built):
    recipe, _, _ = built
    with pytest.raises(UserError) as err:
        recipe.with_(**{"quantization.calibration.method": "percentil"})
    assert err.value.location.file == str(recipe.path) and err.value.location.line == 11
    assert "'percentil' is not one of minmax, percentile, kl, mse" in err.value.message
    with pytest.raises(UserError, match="did you mean 'scheme'"):
        recipe.with_(quantization__shceme="symmetric")


def test_a_build_returns_its_result(built):
    recipe, _, result = built
    assert result.passed and result.error is None and result.failures == []
    assert result.fps == result.npu_fps == 1e8  # no CPU part: the deployment is the NPU
    assert 0.99 < result.cosine < 1 and result.gmem_bytes == 396
    assert result.report_html == result.build_dir / "report.html" and result.report_html.is_file()
    assert result.report["stages"]["verify"]["status"] == "built"
    assert repr(result).startswith("<Result tiny: passed, worst cosine 0.99")


def test_a_variant_builds_apart_and_a_failed_verify_is_a_result(built):
    recipe, options, _ = built
    strict = recipe.with_(verify__min_cosine=0.9999, quantization__auto=False)  # int8 alone
    assert strict.name.startswith("tiny@exp-") and strict.get("verify.min_cosine") == 0.9999
    assert recipe.get("verify.min_cosine") == 0.99
    assert [(s.stage, s.status) for s in strict.plan(**options)][-1] == ("verify", "will run")
    result = strict.build(**options)
    assert not result.passed and result.build_dir.name == strict.name
    assert result.failures == ["output 'y': cosine 0.999210 < min_cosine 0.9999 over all samples"]
    again = npubuild.plan(recipe, **options)
    assert {s.status for s in again} == {"current"}


def test_infer_runs_the_deployed_pipeline(built):
    recipe, options, _ = built
    x = np.random.default_rng(0).random((1, 3, 8, 8), dtype=np.float32)
    deployed = recipe.infer({"x": x}, **options)
    floating = npubuild.infer(recipe, {"x": x}, deployed=False, **options)
    assert deployed["y"].shape == floating["y"].shape == (1, 4, 4, 4)
    cosine = float(np.sum(deployed["y"] * floating["y"]) /
                   np.linalg.norm(deployed["y"]) / np.linalg.norm(floating["y"]))
    assert cosine > 0.99
