"""The command line, run as a real subprocess: help, targets, plan/show/clean, --json."""

import json

from tests.conftest import TINY_RECIPE, write_recipe


def build_args(tmp_path):
    return ["--build-dir", str(tmp_path / "build"), "--cache", str(tmp_path / "cache")]


def test_help_lists_every_command(cli):
    result = cli("--help")
    assert result.returncode == 0
    for command in ("run", "validate", "plan", "show", "clean", "schema", "targets"):
        assert command in result.stdout


def test_targets_lists_the_simulated_presets_and_the_real_chips_with_their_toolchain(cli):
    result = cli("targets", "--json")
    assert result.returncode == 0
    chips = {c["name"]: c for c in json.loads(result.stdout)["chips"]}
    assert {"npu-16m", "npu-strict", "npu-tiny", "rk3588", "bm1684x", "ethos-u55-256"} <= set(chips)
    assert chips["npu-16m"]["backend"] == "simulated" and chips["npu-16m"]["installed"]
    assert chips["rk3588"]["backend"] == "rknn"
    assert chips["rk3588"]["toolchain"] == "rknn 2.5.0"
    assert chips["rk3588"]["install"] == "npubuild toolchain install rknn"


def test_validate_says_valid_and_touches_no_build(cli, tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    result = cli("validate", str(recipe), cwd=tmp_path)
    assert result.returncode == 0 and "valid" in result.stdout
    assert not (tmp_path / "build").exists()


def test_plan_then_run_then_plan_reports_current(cli, tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    before = json.loads(cli("plan", str(recipe), "import", "--json", *build_args(tmp_path)).stdout)
    assert before["import"] == {"action": "will run", "reason": "never built", "key": before["import"]["key"]}
    assert cli("run", str(recipe), "import", *build_args(tmp_path)).returncode == 0
    after = json.loads(cli("plan", str(recipe), "--json", *build_args(tmp_path)).stdout)
    assert after["import"]["action"] == "current"
    assert after["surgery"]["action"].startswith("not built: not implemented yet") or \
        after["surgery"]["action"] in ("will run", "current")


def test_run_json_prints_the_report(cli, tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    result = cli("run", str(recipe), "import", "--json", *build_args(tmp_path))
    report = json.loads(result.stdout)
    assert report["stages"]["import"]["status"] == "built"
    assert report["import"]["outputs"]["y"]["shape"] == [1, 4, 4, 4]


def test_show_then_clean(cli, tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    cli("run", str(recipe), "import", *build_args(tmp_path))
    shown = json.loads(cli("show", str(recipe), "--json", *build_args(tmp_path)).stdout)
    assert shown["stages"]["import"]["state"] == "current"
    assert "model.onnx" in shown["stages"]["import"]["files"]
    assert cli("clean", str(recipe), *build_args(tmp_path)).returncode == 0
    assert not (tmp_path / "build" / "tiny").exists()
    assert (tmp_path / "cache").exists()


def test_unknown_stage_is_rejected_by_the_parser(cli, tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    result = cli("run", str(recipe), "quantise")
    assert result.returncode == 2 and "invalid choice: 'quantise'" in result.stderr


def test_targets_check_prints_every_node_with_its_device(cli, tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    result = cli("targets", "--check", str(recipe), "--json", *build_args(tmp_path))
    assert result.returncode == 0, result.stderr
    nodes = {n["name"]: n for n in json.loads(result.stdout)["nodes"]}
    assert set(nodes) == {"conv", "relu", "pool", "add"}
    assert all(n["device"] == "npu" for n in nodes.values())


def test_infer_runs_the_deployed_pipeline_and_float_on_request(cli, tmp_path):
    import numpy as np

    recipe = write_recipe(tmp_path, TINY_RECIPE)
    x = np.random.default_rng(0).random((1, 3, 8, 8), dtype=np.float32)  # the calibrated range
    np.save(tmp_path / "x.npy", x)
    result = cli("infer", str(recipe), "--input", str(tmp_path / "x.npy"), "--output",
                 str(tmp_path / "y.npz"), *build_args(tmp_path))
    assert result.returncode == 0, result.stderr
    from npubuild import onnx_io
    from tests.conftest import TINY_MODEL

    expected = onnx_io.run(onnx_io.load_model(TINY_MODEL), {"x": x})["y"]
    deployed = np.load(tmp_path / "y.npz")["y"]
    assert not np.array_equal(deployed, expected)  # int8 in the simulator, not float
    from npubuild.metrics import similarity

    assert similarity(expected, deployed).cosine > 0.98
    result = cli("infer", str(recipe), "--float", "--input", str(tmp_path / "x.npy"), "--output",
                 str(tmp_path / "f.npz"), *build_args(tmp_path))
    np.testing.assert_allclose(np.load(tmp_path / "f.npz")["y"], expected, rtol=1e-6)


def test_infer_with_a_pickled_npy_is_refused(cli, tmp_path):
    import numpy as np

    recipe = write_recipe(tmp_path, TINY_RECIPE)
    np.save(tmp_path / "evil.npy", np.array([{"a": 1}], dtype=object), allow_pickle=True)
    result = cli("infer", str(recipe), "--input", str(tmp_path / "evil.npy"), *build_args(tmp_path))
    assert result.returncode == 2 and "evil.npy" in result.stderr and "Traceback" not in result.stderr


def test_infer_takes_an_image_preprocessed_as_the_recipe_says(cli, tmp_path):
    recipe = write_recipe(tmp_path, TINY_RECIPE)
    from PIL import Image

    Image.new("RGB", (32, 24), (255, 0, 0)).save(tmp_path / "red.png")
    result = cli("infer", str(recipe), "--float", "--input", str(tmp_path / "red.png"), "--json",
                 *build_args(tmp_path))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["outputs"]["y"]["shape"] == [1, 4, 4, 4]
