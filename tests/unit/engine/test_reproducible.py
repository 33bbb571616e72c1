"""The build's guarantee (README, ARCHITECTURE §9): two clean builds of a recipe in different
processes, directories and hash seeds write byte-identical artifacts, manifests, cache entries
and keys; timings live only in report.json. Plus: every failure is reported as one, with the
exit code that says what kind it was."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import npubuild

from tests.conftest import TINY_RECIPE, run_cli, write_recipe

RUN_STATE = {"report.json", "report.html", ".doit.sqlite", ".lock", ".hashes.json",
             ".recipe"}  # which recipe file owns the folder: where it was built from


def tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file() and p.name not in RUN_STATE}


def clean_build(workdir: Path, recipe: Path, seed: str, *stage: str, code: Path | None = None) -> dict:
    """Build ``recipe`` from a fresh copy in ``workdir`` (own cwd, build dir and cache), with
    the npubuild package found in ``code`` when given (another checkout of the same source)."""
    workdir.mkdir(parents=True)
    shutil.copy(recipe, workdir / recipe.name)
    env = {"PYTHONHASHSEED": seed, **({"PYTHONPATH": str(code)} if code else {})}
    result = run_cli("run", recipe.name, *stage, "--build-dir", "out", "--cache", "store",
                     cwd=workdir, env=env)
    assert result.returncode == 0, result.stderr
    report = json.loads(next((workdir / "out").glob("*/report.json")).read_text())
    return {"keys": {s: v["key"] for s, v in report["stages"].items()},
            "build": tree(next((workdir / "out").iterdir())), "cache": tree(workdir / "store")}


def assert_identical(a: dict, b: dict) -> None:
    assert a["keys"] == b["keys"] and all(a["keys"].values())
    assert sorted(a["build"]) == sorted(b["build"])
    differ = [name for name in a["build"] if a["build"][name] != b["build"][name]]
    assert differ == []
    assert a["cache"] == b["cache"]


def test_two_clean_builds_of_the_tiny_recipe_are_byte_identical(tmp_path):
    """The second build also runs npubuild from a copy of its source in another directory:
    stage keys cover the code (`npubuild.engine.code`), and the same code is the same key."""
    recipe = write_recipe(tmp_path, TINY_RECIPE, name="tiny.yaml")
    package = Path(npubuild.__file__).resolve().parent
    checkout = tmp_path / "other-checkout"
    shutil.copytree(package, checkout / "npubuild", ignore=shutil.ignore_patterns("__pycache__"))
    first = clean_build(tmp_path / "one", recipe, "1")
    second = clean_build(tmp_path / "elsewhere" / "two", recipe, "4242", code=checkout)
    assert "other-checkout" in subprocess.run(
        [sys.executable, "-c", "import npubuild; print(npubuild.__file__)"], text=True,
        capture_output=True, cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(checkout)}).stdout
    assert len(first["build"]) > 20  # every stage's artifacts, not just a few
    assert_identical(first, second)


def test_gptq_weight_rounding_builds_are_byte_identical_across_seeds_and_directories(tmp_path):
    """GPTQ rounds through Gram matrices, a Cholesky factor and its inverse (LAPACK, BLAS):
    the quantized weights must still be the same bytes in another process, directory and
    hash seed. Six calibration images give the conv enough patches for GPTQ to round it
    (its weights differ from nearest rounding's: checked, so the test cannot pass vacuously)."""
    recipe_text = TINY_RECIPE.replace("samples: 2}", "samples: 6}\n  weight_rounding: gptq")
    recipe = write_recipe(tmp_path, recipe_text, name="gptq.yaml")
    first = clean_build(tmp_path / "one", recipe, "3")
    second = clean_build(tmp_path / "elsewhere" / "two", recipe, "5150")
    assert_identical(first, second)
    nearest = write_recipe(tmp_path, recipe_text.replace("gptq", "nearest"), name="nearest.yaml")
    plain = clean_build(tmp_path / "three", nearest, "3", "quantize")
    weights = "quantize/graph_0.qgraph.npz"
    assert plain["build"][weights] != first["build"][weights]


@pytest.mark.slow
def test_a_clean_yolov8n_build_is_byte_identical_to_the_shared_one(tmp_path, yolov8_build):
    """The session's shared build (its own process, directory, cache and random hash seed)
    against one more clean build here: one extra YOLOv8n build, not two."""
    from tests.conftest import REPO

    work = tmp_path / "elsewhere"
    (work / "recipes").mkdir(parents=True)
    shutil.copy(REPO / "recipes" / "yolov8.yaml", work / "recipes" / "yolov8.yaml")
    result = run_cli("run", "recipes/yolov8.yaml", "--build-dir", "out", "--cache", "store",
                     cwd=work, env={"PYTHONHASHSEED": "9001"})
    assert result.returncode == 0, result.stderr
    mine, shared = work / "out" / "yolov8n", yolov8_build[0]
    keys = [{s: v["key"] for s, v in json.loads((d / "report.json").read_text())["stages"].items()}
            for d in (mine, shared)]
    assert keys[0] == keys[1] and all(keys[0].values())
    assert_identical({"keys": keys[0], "build": tree(mine), "cache": {}},
                     {"keys": keys[1], "build": tree(shared), "cache": {}})


@pytest.mark.parametrize("data", ['"pkg:skimage/data/nothing_here*.png"', "[]",
                                  '"pkg:no_such_pkg_npubuild/*.png"'])
def test_data_that_matches_nothing_fails_with_exit_2_and_no_success_line(tmp_path, data):
    recipe = write_recipe(tmp_path, TINY_RECIPE.replace('"pkg:skimage/data/[a-c]*.png"', data))
    result = run_cli("run", str(recipe), "--build-dir", str(tmp_path / "b"),
                     "--cache", str(tmp_path / "c"))
    assert result.returncode == 2, result.stderr
    assert "quantization.calibration" in result.stderr and f"{recipe}:11:" in result.stderr
    assert "Traceback" not in result.stderr and "artifacts in" not in result.stderr


def test_a_lock_timeout_prints_no_success_line(tmp_path):
    from npubuild.engine.lock import build_lock

    recipe = write_recipe(tmp_path, TINY_RECIPE)
    with build_lock(tmp_path / "b" / "tiny" / ".lock"):
        result = run_cli("run", str(recipe), "import", "--wait", "0", "--build-dir",
                         str(tmp_path / "b"), "--cache", str(tmp_path / "c"))
    assert result.returncode == 2 and "another npubuild run" in result.stderr
    assert "artifacts in" not in result.stderr


def test_a_missing_override_node_is_a_located_user_error(tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE + "  overrides: [{nodes: [no_such_node]}]\n")
    result = run_cli("run", str(recipe), "quantize", "--build-dir", str(tmp_path / "b"),
                     "--cache", str(tmp_path / "c"))
    assert result.returncode == 2
    assert "quantization.overrides[0].nodes[0]: no node is called 'no_such_node'" in result.stderr


def test_a_bad_data_file_is_reported_at_the_recipe_line_that_names_it(tmp_path):
    (tmp_path / "bad.npy").write_bytes(b"\x93NUMPY garbage")
    recipe = write_recipe(tmp_path, TINY_RECIPE.replace('"pkg:skimage/data/[a-c]*.png"', "bad.npy"))
    result = run_cli("run", str(recipe), "quantize", "--build-dir", str(tmp_path / "b"),
                     "--cache", str(tmp_path / "c"))
    assert result.returncode == 2
    assert f"{recipe}:11:23: quantization.calibration.data: bad.npy:" in result.stderr  # as written


def test_measured_cpu_time_stays_out_of_artifacts_and_a_no_op_run_keeps_it(tmp_path):
    """The CPU parts are timed with ONNX Runtime on the build machine: that time (and the fps
    that adds it) goes to report.json only, and a run that finds compile current keeps it."""
    recipe = write_recipe(tmp_path, TINY_RECIPE + "split: {policy: cpu_only}\n", name="cpu.yaml")
    first = clean_build(tmp_path / "one", recipe, "1")
    second = clean_build(tmp_path / "two", recipe, "77")
    assert_identical(first, second)
    manifest = json.loads(first["build"]["compile/manifest.json"])
    assert "cpu_seconds" not in manifest["report"]["estimate"]
    workdir = tmp_path / "one"
    report_path = next((workdir / "out").glob("*/report.json"))
    measured = json.loads(report_path.read_text())["estimate"]
    assert measured["cpu_seconds"] > 0 and measured["fps"] > 0
    again = run_cli("run", recipe.name, "--build-dir", "out", "--cache", "store", cwd=workdir)
    assert again.returncode == 0, again.stderr
    kept = json.loads(report_path.read_text())
    assert kept["stages"]["compile"]["status"] == "current"
    assert {k: kept["estimate"][k] for k in ("fps", "cpu_seconds")} == \
        {k: measured[k] for k in ("fps", "cpu_seconds")}
