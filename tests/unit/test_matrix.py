"""Matrix builds: one recipe, several chips, one comparison table; shared stages built once."""

import json

from tests.conftest import TINY_RECIPE, write_recipe


def test_matrix_build_gives_one_row_per_chip_and_shares_chip_independent_stages(cli, tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    result = cli("run", str(recipe), "split", "--target", "npu-16m", "--target", "npu-tiny",
                 "--json", "--build-dir", str(tmp_path / "b"), "--cache", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert [row["target"] for row in out["targets"]] == ["npu-16m", "npu-tiny"]
    assert all(row["status"] == "ok" and row["npu seg"] >= 1 for row in out["targets"])
    for cell in out["cells"]:
        stages = cell["report"]["stages"]
        assert stages["import"]["status"] in ("restored", "cached")  # built once, before the cells
        assert stages["split"]["status"] == "built"
        assert cell["report"]["target"] == cell["target"]
    assert (tmp_path / "b" / "tiny@npu-tiny" / "split" / "graph_infos.json").is_file()


def test_matrix_with_an_unknown_chip_fails_before_building(cli, tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    result = cli("run", str(recipe), "--target", "npu-16m", "--target", "npu-404",
                 "--build-dir", str(tmp_path / "b"), "--cache", str(tmp_path / "c"))
    assert result.returncode == 2 and "unknown target 'npu-404'" in result.stderr
    assert not (tmp_path / "b").exists()


def test_targets_list_in_the_recipe_is_a_matrix_build(cli, tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE + "targets: [npu-16m, npu-strict]\n")
    result = cli("run", str(recipe), "fusion", "--json", "--build-dir", str(tmp_path / "b"),
                 "--cache", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr
    assert [row["target"] for row in json.loads(result.stdout)["targets"]] == ["npu-16m", "npu-strict"]


def test_a_cell_whose_recipe_no_longer_loads_is_a_failed_cell_not_a_crash(tmp_path):
    """A recipe edited while a matrix runs: the cell reports the recipe's error as data."""
    from npubuild.matrix import build_cell

    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nname: r\nmodel: {path: m.onnx}\nverify: {task: nonsense}\n")
    cell = build_cell(str(recipe), "npu-16m", None, tmp_path / "b", tmp_path / "c")
    assert cell["ok"] is False and cell["exit_code"] == 2 and cell["report"] == {}
    assert "verify.task: 'nonsense' is not one of" in cell["error"]
