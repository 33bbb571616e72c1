"""Zero NPU segments (``split.policy: cpu_only``, or nothing the chip runs): quantize, compile
and verify still run, say so in the report, and verify checks the CPU-only pipeline against the
float original."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from tests.conftest import TINY_RECIPE, run_cli, write_recipe


def _sin_cos_model(path) -> None:
    """Sin → Cos: ops no preset chip runs, so the split has no NPU node under any policy (Exp
    and Log were; npu-16m tables Exp now)."""
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 3, 8, 8])
    graph = helper.make_graph([helper.make_node("Sin", ["x"], ["e"], name="sin"),
                               helper.make_node("Cos", ["e"], ["y"], name="cos")], "g", [x], [y])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8),
              str(path))


@pytest.mark.parametrize("case", ["cpu_only_policy", "nothing_the_chip_runs"])
def test_a_build_without_npu_graphs_passes_verify_and_says_why(tmp_path, case):
    body = TINY_RECIPE
    if case == "cpu_only_policy":
        body += "split: {policy: cpu_only}\n"
    else:
        _sin_cos_model(tmp_path / "sincos.onnx")
        body = body.replace(body.split("path: ")[1].splitlines()[0], str(tmp_path / "sincos.onnx"))
    recipe = write_recipe(tmp_path, body)
    result = run_cli("run", str(recipe), "--json", "--build-dir", str(tmp_path / "build"),
                     "--cache", str(tmp_path / "cache"))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["split"]["npu_segments"] == 0
    if case == "nothing_the_chip_runs":  # says why, counted, where the recipe did not ask for it
        assert report["split"]["note"] == (
            "the split placed every node on the CPU (1 of 2 nodes: op Sin is not supported by chip "
            "npu-16m; 1 of 2 nodes: op Cos is not supported by chip npu-16m; every node's reasons: "
            "split/support.json)")
        assert "the split placed every node on the CPU" in result.stderr
    else:
        assert "note" not in report["split"]
    assert report["quantization"]["npu_graphs"] == 0 and "CPU" in report["quantization"]["note"]
    assert report["compile"]["npu_graphs"] == 0 and "no NPU graph" in report["compile"]["note"]
    assert report["verify"]["passed"] and report["verify"]["npu_graphs"] == 0
    cosine = report["accuracy"]["outputs"]["y"]["min_sample_cosine"]
    assert np.isclose(cosine, 1.0), cosine
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_pp_ocr_cls_with_the_cpu_only_policy_passes_verify(tmp_path_factory, shared_cache):
    from tests.conftest import ppocr_cls_build

    build, result = ppocr_cls_build(tmp_path_factory, shared_cache, "cpu_only")
    assert result.returncode == 0, result.stderr
    report = json.loads((build / "report.json").read_text())
    assert report["split"]["npu_segments"] == 0 and report["compile"]["npu_graphs"] == 0
    assert report["verify"]["passed"] and report["verify"]["npu_graphs"] == 0


def test_an_all_cpu_split_of_unshaped_tensors_says_what_to_do():
    from npubuild.stages.split import why_all_cpu

    nodes = [{"reasons": ["Tensor shape is unknown or not static: 'p' has shape [unk__0]"]}] * 3
    nodes += [{"reasons": ["op Cast is not supported by chip npu-16m"]}, {"reasons": []}]
    note = why_all_cpu(nodes)
    assert note.startswith("the split placed every node on the CPU (3 of 5 nodes: Tensor shape is "
                           "unknown or not static; 1 of 5 nodes: op Cast is not supported by chip npu-16m;")
    assert "fold_constants" in note and "model.inputs" in note
    assert "fold_constants" not in why_all_cpu(nodes[3:])


def test_an_all_cpu_split_under_an_if_on_an_input_names_the_input_and_value():
    # silero_vad.onnx: one If on Equal(sr, 16000) around the whole model
    from npubuild.stages.split import deciding_inputs, why_all_cpu

    then = helper.make_graph([helper.make_node("Relu", ["x"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", TensorProto.FLOAT, None)])
    graph = helper.make_graph(
        [helper.make_node("Constant", [], ["rate"], value=onnx.numpy_helper.from_array(np.array(16000))),
         helper.make_node("Equal", ["sr", "rate"], ["is_16k"]),
         helper.make_node("If", ["is_16k"], ["y"], then_branch=then, else_branch=other)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    assert deciding_inputs(graph_model := helper.make_model(graph)) == ["sr"]
    note = why_all_cpu([{"reasons": ["Op has a subgraph (control flow runs on the CPU)"]}],
                       deciding_inputs(graph_model))
    assert "Control flow decided by input 'sr' runs on the CPU" in note
    assert "{name: sr, value: ...}" in note and "fold_constants" not in note
