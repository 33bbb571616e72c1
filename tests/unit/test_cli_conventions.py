"""Command-line conventions, on the real command: results on stdout and progress on stderr,
plain unwrapped text off a terminal, one JSON document with --json (an `error` object on
failure), -q, quiet SIGPIPE, `targets check R`, a run's headline, and reports that a partial
command (infer) or a no-op run does not clobber."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tests.conftest import REPO, TINY_RECIPE, run_cli, write_recipe

STAGE_LINE = "  verify    "


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """A deep directory (long paths), the tiny recipe built once, and that first run's output."""
    tmp = tmp_path_factory.mktemp("cli") / ("a-rather-long-directory-name-" * 3) / "project"
    tmp.mkdir(parents=True)
    recipe = write_recipe(tmp, TINY_RECIPE)
    first = run_cli("run", str(recipe), *opts(tmp), env={"COLUMNS": "40"})
    assert first.returncode == 0, first.stderr
    return tmp, recipe, first


def opts(tmp):
    return ["--build-dir", str(tmp / "build"), "--cache", str(tmp / "cache")]


def test_a_run_logs_stages_on_stderr_and_ends_with_its_headline_on_stdout(built):
    tmp, _, first = built
    assert "  import    started    (not in this build directory yet)" in first.stderr
    assert "  verify    built " in first.stderr
    lines = first.stdout.splitlines()
    assert lines[0] == "verify passed"
    assert lines[1].startswith("cosine closest to its threshold: 0.99") and "NPU coverage 4/4 nodes (100%)" in lines
    assert any(line.startswith("GMEM ") and " of layer by layer " in line for line in lines)
    assert lines[-1] == f"report: {tmp / 'build' / 'tiny' / 'report.html'}"


def test_off_a_terminal_nothing_is_wrapped_or_styled(built):
    tmp, recipe, first = built
    for text in (first.stdout, first.stderr):
        assert "\x1b" not in text
    assert str(tmp / "build" / "tiny" / "report.html") in first.stdout  # whole, at COLUMNS=40
    shown = run_cli("show", str(recipe), *opts(tmp), env={"COLUMNS": "40", "NO_COLOR": "1"})
    assert str(recipe) in shown.stdout and "\x1b" not in shown.stdout


def test_plan_and_show_print_results_on_stdout(built):
    tmp, recipe, _ = built
    plan = run_cli("plan", str(recipe), *opts(tmp))
    assert plan.stdout.splitlines()[0] == "  import    current" and plan.stderr == ""


def test_a_no_op_run_keeps_the_build_seconds(built):
    tmp, recipe, _ = built
    again = run_cli("run", str(recipe), "-q", *opts(tmp))
    assert again.returncode == 0 and again.stderr == ""
    stages = json.loads((tmp / "build" / "tiny" / "report.json").read_text())["stages"]
    assert stages["verify"]["status"] == "current"
    assert stages["verify"]["built_seconds"] > 0 and stages["verify"]["seconds"] == 0


def test_infer_writes_its_own_report_and_keeps_the_builds(built):
    tmp, recipe, _ = built
    np.save(tmp / "x.npy", np.random.default_rng(0).random((1, 3, 8, 8), dtype=np.float32))
    result = run_cli("infer", str(recipe), "--input", str(tmp / "x.npy"), *opts(tmp))
    assert result.returncode == 0, result.stderr
    report = json.loads((tmp / "build" / "tiny" / "report.json").read_text())
    assert report["verify"]["passed"] is True and report["stages"]["verify"]["status"] == "current"
    infer = json.loads((tmp / "build" / "tiny" / "infer.json").read_text())
    assert infer["outputs"]["y"]["shape"] == [1, 4, 4, 4]


def test_targets_check_is_a_subcommand_and_the_old_spelling_works(built):
    tmp, recipe, _ = built
    new = run_cli("targets", "check", str(recipe), "--json", *opts(tmp))
    old = run_cli("targets", "--check", str(recipe), "--json", *opts(tmp))
    assert new.returncode == old.returncode == 0, new.stderr
    assert json.loads(new.stdout) == json.loads(old.stdout)


def test_a_failing_verify_is_never_shown_built_and_json_carries_the_error(tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE + "verify: {min_cosine: 1.0}\n")
    result = run_cli("run", str(recipe), "--json", *opts(tmp_path))
    assert result.returncode == 1
    assert "  verify    failed" in result.stderr and "  verify    built" not in result.stderr
    doc = json.loads(result.stdout)
    assert doc["error"]["kind"] == "build" and doc["error"]["stage"] == "verify"
    assert doc["verify"]["passed"] is False and doc["stages"]["verify"]["status"] == "built"


@pytest.mark.parametrize("args", [["validate", "missing.yaml"], ["run", "r.yaml", "--bogus"],
                                  ["targets", "check"]])
def test_json_answers_every_failure_with_one_document(tmp_path, args):
    result = run_cli(*args, "--json", cwd=tmp_path)
    assert result.returncode == 2
    error = json.loads(result.stdout)["error"]
    assert error["kind"] == "user" and error["exit_code"] == 2 and error["message"]
    assert result.stderr.startswith("error: ")


def test_a_closed_pipe_ends_the_command_quietly():
    proc = subprocess.Popen([sys.executable, "-m", "npubuild", "schema", "recipe"], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    proc.stdout.close()  # the reader is gone before the command writes (like `| head -0`)
    stderr = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 141 and stderr == ""


def test_verbose_logs_what_each_stage_decided_and_its_time(built, tmp_path):
    tmp, recipe, _ = built
    result = run_cli("run", str(recipe), "-v", "--build-dir", str(tmp_path / "b"), "--cache",
                     str(tmp / "cache"))
    assert result.returncode == 0, result.stderr
    logged = [line for line in result.stderr.splitlines() if line.startswith("INFO npubuild: ")]
    split = next(line for line in logged if line.startswith("INFO npubuild: split: restored in "))
    assert split.endswith(": 1 NPU + 0 CPU segments, 4 of 4 nodes on the NPU")
    assert any(line.startswith("INFO npubuild: quantize: restored in ") and
               "symmetric per_tensor, minmax on 2 samples" in line for line in logged)
    quiet = run_cli("run", str(recipe), "--build-dir", str(tmp_path / "b"), "--cache", str(tmp / "cache"))
    assert "INFO" not in quiet.stderr


def test_a_restored_stage_says_it_came_from_the_cache(built, tmp_path):
    tmp, recipe, _ = built
    plan = run_cli("plan", str(recipe), "--build-dir", str(tmp_path / "b"), "--cache", str(tmp / "cache"))
    assert plan.stdout.splitlines()[0] == ("  import    will restore — from the cache; not in this "
                                           "build directory yet")
    run = run_cli("run", str(recipe), "--build-dir", str(tmp_path / "b"), "--cache", str(tmp / "cache"))
    assert "(from the cache; not in this build directory yet)" in run.stderr
    assert "never built" not in run.stderr


@pytest.mark.parametrize("args, suggestion", [
    (["rnu", "r.yaml"], "did you mean 'run'?"),
    (["run", "r.yaml", "quantise"], "did you mean 'quantize'?"),
    (["schema", "chipp"], "did you mean 'chip'?"),
])
def test_a_misspelt_command_line_word_gets_did_you_mean(tmp_path, args, suggestion):
    result = run_cli(*args, cwd=tmp_path)
    assert result.returncode == 2 and suggestion in result.stderr.splitlines()[0]
