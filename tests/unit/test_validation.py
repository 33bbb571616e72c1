"""`npubuild validate` checks what `run` would check before any stage runs: data files, input
shapes, calibration data, node and tensor names (through surgery's renames), options the chip
ignores; and says what it could not check."""

from __future__ import annotations

import json

from tests.conftest import TINY_RECIPE, run_cli, write_recipe


def validate(tmp_path, text: str, *names: str):
    paths = [write_recipe(tmp_path, text, name) for name in names or ("recipe.yaml",)]
    return run_cli("validate", "--json", *map(str, paths), cwd=tmp_path)


def entry(result) -> dict:
    """The one recipe's entry of validate's --json document."""
    (one,) = json.loads(result.stdout)["recipes"]
    return one


def test_an_option_the_chip_ignores_is_a_warning_not_an_error(tmp_path):
    text = TINY_RECIPE.replace("scheme: symmetric", "scheme: symmetric\n  int16_where_underflows: true")
    result = validate(tmp_path, text + "target: npu-strict\n")
    assert result.returncode == 0, result.stderr
    (warning,) = entry(result)["warnings"]
    assert warning["field"] == "quantization.int16_where_underflows"
    assert "npu-strict has no int16 support: int16_where_underflows is ignored" in warning["message"]
    assert result.stderr.startswith(f"warning: {tmp_path}/recipe.yaml:11:27: quantization.int16")


def test_names_follow_the_recipe_renames_and_are_not_checked_where_rewrites_may_make_them(tmp_path):
    renamed = TINY_RECIPE + "surgery: [{rename_tensors: {names: {y: out}}}]\n"
    ok = validate(tmp_path, renamed + "verify: {slices: [{tensor: out, axis: 1}]}\n")
    assert ok.returncode == 0 and entry(ok)["not_checked"] == []
    old = validate(tmp_path, renamed + "verify: {slices: [{tensor: y, axis: 1}]}\n")
    assert old.returncode == 2
    assert "surgery[0] (rename_tensors) renames 'y' to 'out'" in old.stderr
    fused = validate(tmp_path, TINY_RECIPE + "fusion: [conv_act]\nsplit: {force_cpu: [conv_relu]}\n")
    assert fused.returncode == 0, fused.stderr
    assert entry(fused)["not_checked"] == [
        "split.force_cpu[0]: 'conv_relu' is not in the imported model; fusion (conv_act) may make it"]


def test_two_recipes_with_one_name_are_refused_together(tmp_path):
    result = validate(tmp_path, TINY_RECIPE, "a.yaml", "b.yaml")
    assert result.returncode == 2
    assert "b.yaml:2:7: name: a.yaml has the same name; the two would share build/tiny/" \
        in result.stderr.replace(str(tmp_path) + "/", "")
