"""`npubuild diff`: which fields and stages two recipe versions differ in, and how the figures
moved per chip; text and Markdown output pinned by golden files (regenerate with
NPUBUILD_UPDATE_GOLDEN=1 after a deliberate change)."""

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.conftest import TINY_RECIPE, run_cli, write_recipe

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("NPUBUILD_UPDATE_GOLDEN") == "1"
B_RECIPE = (TINY_RECIPE.replace("scheme: symmetric", "scheme: asymmetric")
            .replace("quantization:", "surgery:\n  - fold_constants: {}\nquantization:"))


def stages(result):
    return {s["stage"]: s for s in json.loads(result.stdout)["stages"]}


@pytest.fixture(scope="module")
def built_pair(tmp_path_factory):
    """a.yaml and b.yaml (scheme changed, a surgery step added), both built into one cache."""
    root = tmp_path_factory.mktemp("diff")
    for name, body in (("a.yaml", TINY_RECIPE), ("b.yaml", B_RECIPE)):
        write_recipe(root, body, name)
        result = run_cli("run", name, "--build-dir", "build", "--cache", "cache", cwd=root)
        assert result.returncode == 0, result.stderr
    return root


def diff(root, *args):
    result = run_cli("diff", *args, "--build-dir", "build", "--cache", "cache", cwd=root)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.mark.parametrize("fmt, flag", [("txt", None), ("md", "--markdown")])
def test_diff_output_matches_its_golden_file(built_pair, fmt, flag):
    out = diff(built_pair, "a.yaml", "b.yaml", *([flag] if flag else []))
    golden = GOLDEN / f"tiny_a_b.{fmt}"
    if UPDATE:
        golden.write_text(out)
    assert out == golden.read_text()


def test_diff_json_has_every_change_and_both_sides_figures(built_pair):
    result = json.loads(diff(built_pair, "a.yaml", "b.yaml", "--json"))
    assert {(c["path"], c["kind"]) for c in result["changes"]} == {
        ("surgery[0]", "added"), ("quantization.scheme", "changed")}
    (chip,) = result["chips"]
    assert chip["chip"] == "npu-16m" and chip["a"] == chip["b"] == "built"
    rows = {r["figure"]: r for r in chip["figures"]}
    assert rows["verdict"]["a"] == rows["verdict"]["b"] == "pass"
    cosine = rows["cosine output y"]
    assert 0.99 < cosine["a"] < 1 and 0.99 < cosine["b"] < 1 and cosine["a"] != cosine["b"]
    assert {"NPU fps", "GMEM bytes grouped", "NPU share of nodes", "NPU share of MACs"} <= set(rows)


def test_diff_without_builds_says_how_to_get_figures_instead_of_an_empty_heading(tmp_path, cli):
    a = write_recipe(tmp_path, TINY_RECIPE, "a.yaml")
    b = write_recipe(tmp_path, B_RECIPE, "b.yaml")
    result = cli("diff", str(a), str(b), "--build-dir", str(tmp_path / "b"),
                 "--cache", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr
    assert result.stdout.rstrip().endswith(
        "figures on npu-16m (a: not built, b: not built): none to compare; build both versions "
        "once (`npubuild run`), or point --cache at the cache CI fills, to compare their figures")


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


@pytest.mark.parametrize("revs", [["HEAD"], ["HEAD~1..HEAD"], ["HEAD~1", "HEAD"]])
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
    if revs == ["HEAD"]:
        recipe.write_text(TINY_RECIPE)  # the working copy goes back to v0
    result = cli("diff", str(recipe), *[a for r in revs for a in ("--rev", r)], "--json",
                 "--build-dir", str(tmp_path / "b"), "--cache", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr
    found = {(c["path"], c["kind"]) for c in json.loads(result.stdout)["changes"]}
    kind = "removed" if revs == ["HEAD"] else "added"
    assert found == {("surgery[0]", kind), ("quantization.scheme", "changed")}
    assert [p.name for p in repo.iterdir() if p.name.startswith(".r@")] == []


def test_diff_rejects_a_half_range(cli, tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE, "r.yaml")
    result = cli("diff", str(recipe), "--rev", "HEAD..")
    assert result.returncode == 2
    assert "--rev HEAD..: give a range as A..B" in result.stderr
