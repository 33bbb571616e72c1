"""Nothing stale: a stage folder holding an earlier build's artifacts (another target, a run
that crashed in the stage) is never shown as this recipe's, in report.json, report.html, the
CLI headline or `show`; each says why and what to run."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import TINY_RECIPE, run_cli, write_recipe

VERIFY = 'verify: {data: "pkg:skimage/data/[a-c]*.png", samples: 2%s}\n'


@pytest.fixture
def built(tmp_path):
    """The tiny recipe built through verify on npu-16m."""
    recipe = write_recipe(tmp_path, TINY_RECIPE + "target: npu-16m\n" + VERIFY % "")
    result = run_cli("run", str(recipe), cwd=tmp_path)
    assert result.returncode == 0 and "verify passed" in result.stdout, result.stderr
    return recipe


def test_a_new_target_built_to_split_shows_no_verdict_of_the_old_one(built, tmp_path):
    built.write_text(built.read_text().replace("npu-16m", "npu-tiny"))
    result = run_cli("run", str(built), "split", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    why = ("not built for this recipe: verify was built for target npu-16m; the recipe now "
           f"targets npu-tiny: run `npubuild run {built} verify`")
    assert "verify passed" not in result.stdout and f"verify: {why}" in result.stdout
    report = json.loads((tmp_path / "build/tiny/report.json").read_text())
    assert report["stages"]["verify"]["current"] is False
    assert report["stages"]["verify"]["reason"] == why
    assert report["stages"]["split"]["current"] is True
    assert not {"verify", "accuracy", "estimate", "simulator"} & set(report)
    html = (tmp_path / "build/tiny/report.html").read_text()
    assert "PASS" not in html and "no verdict: verify not built for this recipe" in html
    assert why.replace("`", "&#x60;") in html or why in html
    shown = run_cli("show", str(built), cwd=tmp_path).stdout
    assert re.search(r"verify +will run .*\n +" + re.escape(why), shown)


def test_a_build_stopped_at_a_bad_slice_after_a_fail_shows_neither_the_old_verdict_nor_its_advice(built, tmp_path):
    built.write_text(built.read_text().replace("quantization:\n", "quantization:\n  auto: false\n")
                     .replace(VERIFY % "", VERIFY % ", min_cosine: 0.9999999"))  # int8 FAILs
    failed = run_cli("run", str(built), cwd=tmp_path)
    assert failed.returncode == 1 and "verify failed" in failed.stdout
    built.write_text(built.read_text().replace(
        ", min_cosine: 0.9999999", ", slices: [{tensor: y, axis: 7, name: s}]"))  # crashes
    crashed = run_cli("run", str(built), cwd=tmp_path)
    # quantize judges as verify does: the bad slice stops the build there, at its recipe field
    assert crashed.returncode == 2 and "verify failed" not in crashed.stdout
    assert "verify.slices: tensor 'y' has 4 axes, no axis 7" in crashed.stderr
    report = json.loads((tmp_path / "build/tiny/report.json").read_text())
    assert "verify" not in report and report["stages"]["verify"]["current"] is False
    html = (tmp_path / "build/tiny/report.html").read_text()
    assert "FAIL" not in html and "Stage bisection" not in html
    assert "not built for this recipe: " in html


def test_two_recipe_files_with_one_name_never_share_a_build_directory(built, tmp_path):
    matrix = ["split", "--target", "npu-strict", "--target", "npu-tiny"]
    assert run_cli("run", str(built), *matrix, cwd=tmp_path).returncode == 0
    other = write_recipe(tmp_path, built.read_text(), "other.yaml")  # the same `name: tiny`
    refused = f"{other}:2:7: name: build/tiny"
    for command in (["run", str(other), "split"], ["targets", "check", str(other)],
                    ["clean", str(other)]):
        result = run_cli(*command, cwd=tmp_path)
        assert result.returncode == 2, (command, result.stderr)
        assert f"{refused}/ belongs to {built.name}, which has the same name" in result.stderr
    cells = run_cli("run", str(other), *matrix, cwd=tmp_path)
    assert cells.returncode == 2
    assert f"{refused}@npu-strict/ belongs to {built.name}" in cells.stderr
    report = json.loads((tmp_path / "build/tiny/report.json").read_text())
    assert report["recipe"] == str(built) and report["stages"]["verify"]["current"] is True
    built.rename(tmp_path / "renamed.yaml")  # the owner moved away: the folder is handed over
    assert run_cli("run", str(other), "split", cwd=tmp_path).returncode == 0
