"""`npubuild diff`: which stages two recipe versions build differently, and why."""

import json
import subprocess

from tests.conftest import TINY_RECIPE, write_recipe


def stages(result):
    return {s["stage"]: s for s in json.loads(result.stdout)["stages"]}


def test_diff_names_the_stages_a_quantization_edit_changes(cli, tmp_path):
    a = write_recipe(tmp_path, TINY_RECIPE, "a.yaml")
    b = write_recipe(tmp_path, TINY_RECIPE.replace("scheme: symmetric", "scheme: asymmetric"), "b.yaml")
    result = cli("diff", str(a), str(b), "--json", "--build-dir", str(tmp_path / "b"),
                 "--cache", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr
    by_stage = stages(result)
    assert by_stage["import"]["same"] and by_stage["split"]["same"]
    assert not by_stage["quantize"]["same"]
    assert "quantization.scheme: 'symmetric' -> 'asymmetric'" in by_stage["quantize"]["reasons"]


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


def test_diff_between_two_git_revisions_of_one_recipe(cli, tmp_path):
    repo = tmp_path / "repo"
    repo.mkdir()
    recipe = write_recipe(repo, TINY_RECIPE, "r.yaml")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run(["git", "init", "-q", str(repo)], check=True)
    subprocess.run(git + ["add", "r.yaml"], check=True)
    subprocess.run(git + ["commit", "-qm", "v1"], check=True)
    recipe.write_text(TINY_RECIPE.replace("scheme: symmetric", "scheme: pow2_symmetric"))
    result = cli("diff", str(recipe), "--rev", "HEAD", "--json", "--build-dir", str(tmp_path / "b"),
                 "--cache", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr
    assert not stages(result)["quantize"]["same"]
    assert [p.name for p in repo.iterdir() if p.name.startswith(".r@")] == []
