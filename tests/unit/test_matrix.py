"""Matrix builds: one recipe, several variants (chips, -S sets), one comparison table; the
stages no variant changes built once."""

import json

from npubuild.matrix import combine, shared_prefix
from tests.conftest import TINY_RECIPE, write_recipe


def test_matrix_build_gives_one_row_per_chip_and_shares_chip_independent_stages(cli, tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    result = cli("run", str(recipe), "split", "--target", "npu-16m", "--target", "npu-tiny",
                 "--json", "--build-dir", str(tmp_path / "b"), "--cache", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr
    out = json.loads(result.stdout)
    assert [(row["variant"], row["target"]) for row in out["variants"]] == [
        ("tiny@npu-16m", "npu-16m"), ("tiny@npu-tiny", "npu-tiny")]
    assert all(row["state"] == "built" and row["seg NPU/CPU"] == "1/0" for row in out["variants"])
    for cell in out["cells"]:
        stages = cell["report"]["stages"]
        assert stages["import"]["status"] in ("restored", "current")  # built once, before the cells
        assert stages["split"]["status"] == "built"
        assert cell["report"]["target"] == cell["target"]
    assert (tmp_path / "b" / "tiny@npu-tiny" / "split" / "graph_infos.json").is_file()
    assert json.loads((tmp_path / "b" / "tiny@npu-tiny" / "experiment.json").read_text())[
        "overrides"] == {"target": "npu-tiny"}


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
    assert [row["target"] for row in json.loads(result.stdout)["variants"]] == ["npu-16m", "npu-strict"]


def test_chips_and_set_values_combine_into_one_matrix():
    chips = [{"target": "a"}, {"target": "b"}]
    sets = [{"quantization.scheme": "symmetric"}, {"quantization.scheme": "asymmetric"}]
    assert combine(chips, sets) == [{"target": t, "quantization.scheme": s}
                                    for t in "ab" for s in ("symmetric", "asymmetric")]
    assert combine([], sets) == sets and combine([], []) == []


def test_the_shared_prefix_stops_at_the_first_stage_a_variant_changes():
    assert shared_prefix(None, [{"target": "a"}, {"target": "b"}]) == "fusion"
    assert shared_prefix(None, [{"quantization.scheme": "x"}]) == "split"
    assert shared_prefix(None, [{"surgery[0].fold_constants.max_rounds": 2}]) == "import"
    assert shared_prefix(None, [{"model.inputs[0].shape": [1, 3, 16, 16]}]) is None
    # quantize judges by verify's thresholds (the precision search), so verify changes it
    assert shared_prefix(None, [{"verify.min_cosine": 0.9}]) == "split"
    assert shared_prefix("surgery", [{"verify.min_cosine": 0.9}]) == "surgery"


def test_a_cell_whose_recipe_no_longer_loads_is_a_failed_cell_not_a_crash(tmp_path):
    """A recipe edited while a matrix runs: the cell reports the recipe's error as data."""
    from npubuild.matrix import build_cell

    recipe = tmp_path / "r.yaml"
    recipe.write_text("version: 1\nname: r\nmodel: {path: m.onnx}\nverify: {task: nonsense}\n")
    cell = build_cell(str(recipe), "npu-16m", None, tmp_path / "b", tmp_path / "c")
    assert cell["ok"] is False and cell["exit_code"] == 2 and cell["report"] == {}
    assert "verify.task: 'nonsense' is not one of" in cell["error"]
