"""Stage `surgery`: steps applied in order and proven one by one, the log, and the two ways a
step fails (bad arguments -> located recipe error; a failed check -> build error with numbers),
neither of which writes anything."""

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild import onnx_io
from npubuild.errors import BuildError, UserError
from npubuild.recipe import load_recipe
from npubuild.stages import STAGES, StageContext
from npubuild.stages.surgery import run
from npubuild.surgery import origins

n = helper.make_node


def head_model() -> onnx.ModelProto:
    """x (1,3,4,4) -> Conv -> Dropout -> Reshape (1,4,16) -> Softmax -> y; shape code via Shape."""
    rng = np.random.default_rng(0)
    nodes = [n("Conv", ["x", "w"], ["c"], name="conv"), n("Dropout", ["c"], ["d"], name="drop"),
             n("Shape", ["d"], ["s"], name="shape"), n("Gather", ["s", "i"], ["nc"], name="gather"),
             n("Concat", ["nc", "minus1"], ["target"], name="target", axis=0),
             n("Reshape", ["d", "target"], ["r"], name="reshape"),
             n("Softmax", ["r"], ["y"], name="softmax", axis=1)]
    inits = [numpy_helper.from_array(rng.standard_normal((4, 3, 1, 1)).astype(np.float32), "w"),
             numpy_helper.from_array(np.array([0, 1], np.int64), "i"),
             numpy_helper.from_array(np.array([-1], np.int64), "minus1")]
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 4, 4])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model, data_prop=True)


def context(tmp_path, surgery: str, model: onnx.ModelProto | None = None) -> StageContext:
    imported = tmp_path / "import"
    imported.mkdir()
    onnx_io.save_model(model or head_model(), imported / "model.onnx")
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(f"version: 1\nname: s\nmodel:\n  path: import/model.onnx\nsurgery:{surgery}")
    out = tmp_path / "surgery"
    out.mkdir()
    return StageContext(load_recipe(recipe), None, {"import": imported}, out)


def log_of(ctx) -> list[dict]:
    return json.loads((ctx.out / "log.json").read_text())["steps"]


def test_the_stage_is_in_the_pipeline():
    assert STAGES["surgery"].function() is run


def test_empty_surgery_copies_the_model_through(tmp_path):
    ctx = context(tmp_path, " []\n")
    report = run(ctx)
    assert onnx.load(str(ctx.out / "model.onnx")).graph == onnx.load(str(tmp_path / "import/model.onnx")).graph
    assert log_of(ctx) == [] and report["surgery"]["steps"] == 0


def test_steps_apply_in_order_and_each_is_logged(tmp_path):
    ctx = context(tmp_path, "\n  - fold_constants: {}\n  - reshape_to_4d: {}\n"
                            "  - rename_tensors: {names: {y: probs}}\n")
    report = run(ctx)
    fold, lift, rename = log_of(ctx)
    assert [e["index"] for e in (fold, lift, rename)] == [0, 1, 2]
    assert fold["rewrite"] == "fold_constants" and fold["check"] == "relative tolerance 1e-05"
    assert fold["nodes_removed"]["op_types"] == {"Dropout": 1, "Shape": 1, "Gather": 1, "Concat": 1}
    assert set(fold["nodes_removed"]["names"]) == {"drop", "shape", "gather", "target"}
    assert fold["max_abs"] == 0.0 and "seconds" not in fold  # timings: report.json only
    assert report["surgery"]["seconds"] >= 0
    assert lift["check"] == "bit-identical" and lift["outputs"]["y"]["identical"]
    assert lift["nodes_changed"]["names"] == ["reshape", "softmax"]
    assert rename["outputs"]["y"]["how"] == "renamed" and rename["not_comparable"] == {}
    final = onnx.load(str(ctx.out / "model.onnx"))
    assert [o.name for o in final.graph.output] == ["probs"]
    assert origins.read(final, origins.MODEL_KEY)["outputs"] == {
        "y": origins.parts(["probs"], None, [1, 4, 16])}
    assert report["surgery"]["steps"] == 3 and report["surgery"]["op_types"] == {
        "Conv": 1, "Reshape": 1, "Softmax": 1}


def test_bad_argument_names_step_rewrite_node_and_recipe_line(tmp_path):
    ctx = context(tmp_path, "\n  - fold_constants: {}\n  - remove_nodes: {nodes: [softmx]}\n")
    with pytest.raises(UserError) as err:
        run(ctx)
    assert str(err.value) == (
        f"{tmp_path / 'recipe.yaml'}:7:5: surgery[1].remove_nodes: step 1 (remove_nodes): "
        "node not found: 'softmx'; did you mean 'softmax'?")
    assert err.value.exit_code == 2
    assert list(ctx.out.iterdir()) == []


def test_a_step_that_changes_the_outputs_fails_with_tensor_and_numbers(tmp_path):
    ctx = context(tmp_path, "\n  - remove_nodes: {nodes: [softmax]}\n")
    with pytest.raises(BuildError) as err:
        run(ctx)
    message = str(err.value)
    assert message.startswith("surgery: step 0 (remove_nodes): the outputs changed: tensor 'y': max abs diff")
    assert "above the tolerance 1e-05" in message and "expect_change: true" in message
    assert list(ctx.out.iterdir()) == []


def test_expect_change_logs_the_differences_instead_of_failing(tmp_path):
    ctx = context(tmp_path, "\n  - remove_nodes: {nodes: [softmax], expect_change: true}\n")
    run(ctx)
    (entry,) = log_of(ctx)
    assert entry["check"] == "recorded only (expect_change)"
    assert entry["changes"][0].startswith("tensor 'y': max abs diff")


def test_a_step_that_breaks_the_model_is_a_build_error(tmp_path):
    ctx = context(tmp_path, "\n  - set_attribute: {nodes: [conv], attributes: {kernel_shape: [3, 3]}}\n")
    with pytest.raises(BuildError, match=r"surgery: step 0 \(set_attribute\) produced an invalid model: "
                                         "shape inference: .*node name: softmax"):
        run(ctx)
    assert list(ctx.out.iterdir()) == []


def test_dropped_outputs_are_listed_as_not_comparable(tmp_path):
    ctx = context(tmp_path, "\n  - extract: {outputs: [c]}\n")
    run(ctx)
    (entry,) = log_of(ctx)
    assert entry["not_comparable"] == {"y": "no longer an output, and no origin recorded"}
    assert entry["outputs"]["c"]["identical"]


def test_split_outputs_are_compared_after_recombination(tmp_path):
    ctx = context(tmp_path, "\n  - fold_constants: {}\n  - extract: {outputs: [r]}\n"
                            "  - reshape_to_4d: {}\n")
    run(ctx)
    entry = log_of(ctx)[-1]
    assert entry["outputs"]["r"]["how"] == "recombined" and entry["outputs"]["r"]["identical"]
    assert entry["origins"]["outputs"] == {"r": origins.parts(["r"], None, [1, 4, 16])}
