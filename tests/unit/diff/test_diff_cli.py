"""`npubuild diff`: which fields and stages two recipe versions differ in, and how the figures
moved per chip pair; text and Markdown output and the --json shape pinned by golden files
(regenerate with NPUBUILD_UPDATE_GOLDEN=1 after a deliberate change); --fail-on gates CI."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import TINY_RECIPE, json_shape, run_cli, write_recipe

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("NPUBUILD_UPDATE_GOLDEN") == "1"
B_RECIPE = (TINY_RECIPE.replace("scheme: symmetric", "scheme: asymmetric")
            .replace("quantization:", "surgery:\n  - fold_constants: {}\nquantization:"))


def stages(result):
    return {s["stage"]: s for s in json.loads(result.stdout)["stages"]}


@pytest.fixture(scope="module")
def built_pair(tmp_path_factory):
    """a.yaml and b.yaml (scheme changed, a surgery step added), both built into one cache
    (each in its own build directory: two files with one `name:` may not share one)."""
    root = tmp_path_factory.mktemp("diff")
    for name, body in (("a.yaml", TINY_RECIPE), ("b.yaml", B_RECIPE)):
        write_recipe(root, body, name)
        result = run_cli("run", name, "--build-dir", f"build-{name[0]}", "--cache", "cache",
                         cwd=root)
        assert result.returncode == 0, result.stderr
    return root


def diff(root, *args, code=0):
    result = run_cli("diff", *args, "--build-dir", "build-b", "--base-build-dir", "build-a",
                     "--cache", "cache", cwd=root)
    assert result.returncode == code, result.stderr
    return result.stdout


@pytest.mark.parametrize("fmt, flag", [("txt", None), ("md", "--markdown")])
def test_diff_output_matches_its_golden_file(built_pair, fmt, flag):
    out = diff(built_pair, "a.yaml", "b.yaml", *([flag] if flag else []))
    golden = GOLDEN / f"tiny_a_b.{fmt}"
    if UPDATE:
        golden.write_text(out)
    assert out == golden.read_text()


def test_diff_json_shape_matches_its_golden_file(built_pair):
    found = json_shape(json.loads(diff(built_pair, "a.yaml", "b.yaml", "--json")))
    golden = GOLDEN / "tiny_a_b.shape.json"
    if UPDATE:
        golden.write_text(json.dumps(found, indent=2) + "\n")
    assert found == json.loads(golden.read_text())


def test_diff_json_keys_figures_by_their_field_path(built_pair):
    result = json.loads(diff(built_pair, "a.yaml", "b.yaml", "--json"))
    assert {(c["path"], c["kind"]) for c in result["changes"]} == {
        ("surgery[0]", "added"), ("quantization.scheme", "changed")}
    (chip,) = result["chips"]
    assert chip["chips"] == {"a": "npu-16m", "b": "npu-16m"}
    assert chip["state"] == {"a": "built", "b": "built"} and chip["verdict"] == {"a": "pass", "b": "pass"}
    rows = {r["key"]: r for r in chip["figures"]}
    assert rows["verify.passed"]["a"] is rows["verify.passed"]["b"] is True
    cosine = rows["accuracy.outputs.y.cosine"]
    assert 0.99 < cosine["a"] < 1 and 0.99 < cosine["b"] < 1 and cosine["a"] != cosine["b"]
    assert cosine["limit"] == 0.99 and cosine["limit_name"] == "verify.min_cosine"
    assert cosine["ok"] == {"a": True, "b": True} and not cosine["regression"]
    assert cosine["change"]["delta"] == pytest.approx(cosine["b"] - cosine["a"])
    assert {"estimate.fps", "estimate.npu_fps", "estimate.gmem_bytes", "split.npu_share_of_nodes",
            "split.npu_share_of_macs"} <= set(rows)
    assert result["regressions"] == [] and result["gate"] == {"fail_on": None, "failed": False,
                                                              "reasons": []}


def test_diff_without_builds_says_how_to_get_figures_instead_of_an_empty_heading(tmp_path, cli):
    a = write_recipe(tmp_path, TINY_RECIPE, "a.yaml")
    b = write_recipe(tmp_path, B_RECIPE, "b.yaml")
    result = cli("diff", str(a), str(b), "--build-dir", str(tmp_path / "b"),
                 "--cache", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr
    assert (
        "figures on npu-16m (a: not built, b: not built): none to compare; build both versions "
        "once (`npubuild run`), or point --cache at the cache CI fills, to compare their figures"
        "\n\nno regression against a threshold\n") in result.stdout


def test_diff_names_the_stages_a_quantization_edit_changes(cli, tmp_path):
    a = write_recipe(tmp_path, TINY_RECIPE, "a.yaml")
    b = write_recipe(tmp_path, TINY_RECIPE.replace("scheme: symmetric", "scheme: asymmetric"), "b.yaml")
    result = cli("diff", str(a), str(b), "--json", "--build-dir", str(tmp_path / "b"),
                 "--cache", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr
    by_stage = stages(result)
    assert by_stage["import"]["same"] and by_stage["split"]["same"]
    assert not by_stage["quantize"]["same"]
    assert 'quantization.scheme: "symmetric" -> "asymmetric"' in by_stage["quantize"]["reasons"]


def test_diff_follows_an_import_change_downstream(cli, tmp_path):
    a = write_recipe(tmp_path, TINY_RECIPE, "a.yaml")
    b = write_recipe(tmp_path, TINY_RECIPE.replace("[1, 3, 8, 8]", "[1, 3, 16, 16]"), "b.yaml")
    by_stage = stages(cli("diff", str(a), str(b), "--json", "--build-dir", str(tmp_path / "b"),
                          "--cache", str(tmp_path / "c")))
    assert by_stage["import"]["reasons"] == ["model.inputs[0].shape[2]: 8 -> 16",
                                             "model.inputs[0].shape[3]: 8 -> 16"]
    assert by_stage["surgery"]["reasons"] == ["model.inputs[0].shape[2]: 8 -> 16",
                                              "model.inputs[0].shape[3]: 8 -> 16",
                                              "its input stage `import` differs"]


@pytest.mark.parametrize("revs", [[], ["HEAD"], ["HEAD~1..HEAD"], ["HEAD~1", "HEAD"]])
def test_diff_between_git_revisions_of_one_recipe(cli, tmp_path, revs):
    repo = tmp_path / "repo"
    repo.mkdir()
    recipe = repo / "r.yaml"
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    for version, body in enumerate((TINY_RECIPE, B_RECIPE)):
        recipe.write_text(body)
        subprocess.run(git + ["add", "r.yaml"], check=True)
        subprocess.run(git + ["commit", "-qm", f"v{version}"], check=True)
    if revs in ([], ["HEAD"]):  # no --rev: HEAD vs the working copy, as `git diff`
        recipe.write_text(TINY_RECIPE)  # the working copy goes back to v0
    result = cli("diff", str(recipe), *[a for r in revs for a in ("--rev", r)], "--json",
                 "--build-dir", str(tmp_path / "b"), "--cache", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr
    found = {(c["path"], c["kind"]) for c in json.loads(result.stdout)["changes"]}
    kind = "removed" if revs in ([], ["HEAD"]) else "added"
    assert found == {("surgery[0]", kind), ("quantization.scheme", "changed")}
    assert [p.name for p in repo.iterdir() if p.name.startswith(".r@")] == []


def test_diff_rejects_a_half_range(cli, tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE, "r.yaml")
    result = cli("diff", str(recipe), "--rev", "HEAD..")
    assert result.returncode == 2
    assert "--rev HEAD..: give a range as A..B" in result.stderr


@pytest.fixture(scope="module")
def chip_change(tmp_path_factory):
    """a on npu-16m; b on npu-tiny with a min_cosine the worst sample misses in int8 (the
    precision search off); each built into its own build directory, sharing one cache."""
    root = tmp_path_factory.mktemp("chips")
    write_recipe(root, TINY_RECIPE, "a.yaml")
    int8_only = TINY_RECIPE.replace("quantization:\n", "quantization:\n  auto: false\n")
    write_recipe(root, int8_only + "target: npu-tiny\nverify: {min_cosine: 0.9992}\n", "b.yaml")
    for side in "ab":
        run_cli("run", f"{side}.yaml", "--build-dir", f"build-{side}", "--cache", "cache", cwd=root)
    return root


def chip_diff(root, *args, code=0):
    result = run_cli("diff", "a.yaml", "b.yaml", "--build-dir", "build-b", "--base-build-dir",
                     "build-a", "--cache", "cache", *args, cwd=root)
    assert result.returncode == code, result.stderr
    return result


def test_a_chip_change_is_one_table_with_both_chips_on_each_line(chip_change):
    out = chip_diff(chip_change).stdout
    assert out.count("figures on ") == 1
    assert "figures on npu-16m -> npu-tiny (a: built, b: built):" in out
    fps = next(line for line in out.splitlines() if line.lstrip().startswith("fps NPU alone"))
    assert "100,000,000.00" in fps and "6,410,256.41" in fps and "-93.6 %" in fps
    assert "  b fails verify:\n    output 'y': cosine 0.997937 < min_cosine 0.9992" in out


def test_a_threshold_regression_is_marked_in_text_json_and_markdown(chip_change):
    out = chip_diff(chip_change).stdout
    verdict = next(line for line in out.splitlines() if line.lstrip().startswith("verdict"))
    assert "pass" in verdict and "FAIL ✗" in verdict and verdict.endswith("REGRESSION")
    worst = next(line for line in out.splitlines() if "y cosine (worst sample)" in line)
    assert "0.997937 ✗" in worst and "≥ 0.9992" in worst and worst.endswith("REGRESSION")
    doc = json.loads(chip_diff(chip_change, "--json").stdout)
    assert [r["key"] for r in doc["regressions"]] == ["verify.passed",
                                                      "accuracy.outputs.y.min_sample_cosine"]
    assert doc["regressions"][1]["chips"] == {"a": "npu-16m", "b": "npu-tiny"}
    md = chip_diff(chip_change, "--markdown").stdout
    assert "**2 regressions against thresholds**: verdict (npu-16m -> npu-tiny)" in md
    assert "| **y cosine (worst sample)** | **0.997937** | **0.997937 ❌** |" in md


@pytest.mark.parametrize("fail_on", ["regression", "fail"])
def test_fail_on_exits_1_for_ci_and_says_why(chip_change, fail_on):
    result = chip_diff(chip_change, "--fail-on", fail_on, code=1)
    reasons = [line for line in result.stderr.splitlines() if line.startswith("error: --fail-on")]
    if fail_on == "regression":
        assert reasons == ["error: --fail-on regression: npu-16m -> npu-tiny: verdict pass -> fail",
                           "error: --fail-on regression: npu-16m -> npu-tiny: y cosine (worst "
                           "sample) 0.997937 -> 0.997937 (limit 0.9992)"]
    else:
        assert reasons == ["error: --fail-on fail: npu-16m -> npu-tiny: b fails: output 'y': "
                           "cosine 0.997937 < min_cosine 0.9992 on the worst sample (#2; all "
                           "samples: 0.999210)"]


def test_fail_on_passes_when_nothing_regresses(built_pair):
    diff(built_pair, "a.yaml", "b.yaml", "--fail-on", "regression")
    diff(built_pair, "a.yaml", "b.yaml", "--fail-on", "fail")


def test_fail_on_fail_without_a_build_cannot_pass(tmp_path, cli):
    a = write_recipe(tmp_path, TINY_RECIPE, "a.yaml")
    result = cli("diff", str(a), str(a), "--fail-on", "fail", "--build-dir", str(tmp_path / "b"),
                 "--cache", str(tmp_path / "c"))
    assert result.returncode == 1
    assert "b fails: no verify verdict (not built): build it first" in result.stderr
