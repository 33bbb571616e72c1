"""Each vendor backend end to end on the tiny recipe, through the real toolchain (no mocks):
compile writes the vendor artifact into the graph's context_dir with the vendor's figures, and
verify runs it (RKNN's simulator, the int8 TFLite Vela compiles, TPU-MLIR's cmodel). Slow; each
skips, saying how to install it, when its toolchain environment is absent."""

from __future__ import annotations

import json

import pytest

from npubuild import toolchains
from npubuild.split import graph_infos
from npubuild.toolchains.env import find
from tests.conftest import TINY_RECIPE, write_recipe

pytestmark = pytest.mark.slow


def needs(name: str) -> None:
    if find(toolchains.get(name)) is None:
        pytest.skip(f"the {name} toolchain is not installed (npubuild toolchain install {name})")


def build(cli, tmp_path, chip: str, extra: str = "", base: str = TINY_RECIPE) -> tuple[dict, object]:
    """The tiny recipe (``base``, plus ``extra`` YAML) built for ``chip``; the vendor's scratch
    folders (in a TMPDIR of the test's own) are all gone afterwards."""
    body = base.replace("name: tiny", f"name: tiny-{chip}") + f"target: {chip}\n" + \
        "verify: {data: 'pkg:skimage/data/[d-h]*.png', samples: 2, min_cosine: 0.98}\n" + extra
    recipe = write_recipe(tmp_path, body)
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    result = cli("run", str(recipe), "--build-dir", str(tmp_path / "build"),
                 "--cache", str(tmp_path / "cache"), cwd=tmp_path, timeout=1800,
                 env={"TMPDIR": str(scratch)})
    assert result.returncode == 0, result.stderr[-3000:]
    assert [p.name for p in scratch.iterdir() if p.name.startswith("npubuild-")] == []
    root = tmp_path / "build" / f"tiny-{chip}"
    return json.loads((root / "report.json").read_text()), root


def test_rknn_builds_an_rknn_and_verify_runs_it_in_the_simulator(cli, tmp_path):
    needs("rknn")
    report, root = build(cli, tmp_path, "rk3588")
    infos = graph_infos.read(root / "split")
    npu = [g for g in infos["graphs"] if g["device"] == "npu"]
    assert (root / "compile" / npu[0]["context_dir"] / "graph_0.vendor.rknn").is_file()
    assert report["vendor"]["npu_ops"] >= 2 and report["vendor"]["reproducible"] is False
    graph = report["compile"]["graphs"]["graph_0"]
    assert set(graph["quantizers"]) == {"vendor", "npubuild"}  # side by side
    # every integer tensor the toolkit holds carries npubuild's Q/DQ: none fell back
    coverage = graph["quantizers"]["npubuild"]["quantization"]
    assert coverage["entries"] >= 2 and coverage["fell_back"] == []
    # npubuild's integer reference against the simulator running npubuild's QDQ model
    agreement = graph["quantizers"]["npubuild"]["integer_reference"]
    assert set(agreement["outputs"]) == {"y"}
    assert agreement["bit_exact"] == sum(r["max_steps"] == 0 for r in agreement["outputs"].values())
    assert "Conv+SiLU" in agreement["why"]  # the measured reason they are not bit-exact
    assert report["verify"]["passed"] and report["accuracy"]["outputs"]["y"]["cosine"] > 0.98
    assert report["compile"]["toolchain"]["rknn-toolkit2"] == "2.5.0"


def test_vela_compiles_the_int8_tflite_and_verify_runs_it(cli, tmp_path):
    needs("vela")
    report, root = build(cli, tmp_path, "ethos-u55-256")
    folder = root / "compile" / "graph_ir_0"
    assert (folder / "graph_0.vendor_vela.tflite").is_file()
    assert report["vendor"]["npu_ops"] >= 2 and report["vendor"]["cpu_ops"] == 0
    assert report["vendor"]["cycles"] > 0 and report["vendor"]["inferences_per_second"] > 0
    assert report["verify"]["passed"] and report["accuracy"]["outputs"]["y"]["cosine"] > 0.98


def test_tpu_mlir_builds_a_bmodel_and_verify_runs_it_on_the_cmodel(cli, tmp_path):
    needs("tpu-mlir")
    report, root = build(cli, tmp_path, "bm1684x")
    assert (root / "compile" / "graph_ir_0" / "graph_0.vendor.bmodel").is_file()
    # every calibration-table entry took npubuild's range under TPU-MLIR's name: none fell back
    coverage = report["compile"]["graphs"]["graph_0"]["quantizers"]["npubuild"]["quantization"]
    assert coverage["entries"] >= 2 and coverage["applied"] == coverage["entries"]
    assert coverage["fell_back"] == []
    assert report["verify"]["passed"] and report["accuracy"]["outputs"]["y"]["cosine"] > 0.98


def test_what_npubuild_keeps_in_float_runs_in_f16_in_the_bmodel(cli, tmp_path):
    """npubuild's precision decisions reach TPU-MLIR as its quantize table: the tensor the
    recipe keeps in float (an override, as the precision search would) runs in F16."""
    needs("tpu-mlir")
    base = TINY_RECIPE.replace("quantization:\n", "quantization:\n  overrides: "
                               "[{tensors: [relu], precision: float}]\n")
    report, root = build(cli, tmp_path, "bm1684x",
                         "compile: {quantizer: npubuild, compare_quantizers: false}\n", base)
    qtable = (root / "compile" / "graph_ir_0" / "graph_0.npubuild.qtable").read_text()
    coverage = report["compile"]["graphs"]["graph_0"]["quantizers"]["npubuild"]["quantization"]
    assert coverage["float16"] >= 1 and coverage["fell_back"] == []
    assert qtable and all(line.endswith(" F16") for line in qtable.splitlines())
    assert any(line.startswith("relu") for line in qtable.splitlines())
    assert report["verify"]["passed"]


def test_a_failing_rknn_build_leaves_no_scratch_folder_and_keeps_its_log(tmp_path, monkeypatch):
    import tempfile

    from npubuild.backends import rknn
    from npubuild.backends.vendor import NpuGraph
    from npubuild.errors import BuildError
    from npubuild.toolchains.env import require

    needs("rknn")
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    folder = tmp_path / "graph_ir_0"
    folder.mkdir()
    (folder / "g.onnx").write_bytes(b"not an ONNX model")
    job = {"onnx": "g.onnx", "platform": "rk3588", "inputs": ["x"], "outputs": ["y"],
           "input_shapes": [[1, 3, 8, 8]], "quantize": False, "dataset": [],
           "export": "graph_0.vendor.rknn", "proof": [], "proof_outputs": "proof_outputs.npz"}
    graph = NpuGraph(0, "graph_0", ["x"], ["y"], folder / "g.onnx")
    with pytest.raises(BuildError, match="graph_0: rknn failed") as err:
        rknn._run(require(toolchains.get("rknn")), graph, folder, job, tmp_path / "logs")
    kept = tmp_path / "logs" / "compile.graph_0.vendor.rknn_worker.log"
    assert list(scratch.iterdir()) == [] and kept.is_file()
    assert f"the whole log: {kept}" in err.value.hint
