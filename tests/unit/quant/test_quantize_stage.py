"""The quantize stage on a tiny split pipeline (CPU → NPU with fused ops → CPU)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild.errors import UserError
from npubuild.fusions import load_builtins
from npubuild.quant.qgraph import QGraph
from npubuild.recipe import load_recipe
from npubuild.split import graph_infos
from npubuild.stages import STAGES, StageContext
from npubuild.stages import quantize as quantize_stage

SHAPE = [1, 3, 8, 8]


def _model(nodes, inputs, outputs, inits=()):
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs],
        [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in outputs],
        [numpy_helper.from_array(np.asarray(v, np.float32), n) for n, v in inits])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def npu_model():
    """Conv+SiLU (fused by the conv_silu rule), MaxPool, 1x1 Conv, Add."""
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["a", "w", "b"], ["c"], name="/m0/conv/Conv", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"], name="/m0/act/Sigmoid"),
             helper.make_node("Mul", ["c", "s"], ["h"], name="/m0/act/Mul"),
             helper.make_node("MaxPool", ["h"], ["p"], name="/m1/MaxPool", kernel_shape=[2, 2], strides=[2, 2]),
             helper.make_node("Conv", ["p", "w2"], ["q"], name="/m2/Conv"),
             helper.make_node("Add", ["p", "q"], ["r"], name="/m3/Add")]
    model = _model(nodes, [("a", SHAPE)], [("r", [1, 4, 4, 4])],
                   [("w", rng.normal(0, 0.4, (4, 3, 3, 3))), ("b", rng.normal(0, 0.2, 4)),
                    ("w2", rng.normal(0, 0.4, (4, 4, 1, 1)))])
    fused, report = load_builtins()["conv_silu"].apply(model)
    assert report.fired == 1
    return fused


def split_dir(root):
    d = root / "split"
    d.mkdir()
    onnx.save(_model([helper.make_node("Mul", ["x", "two"], ["a"])], [("x", SHAPE)], [("a", SHAPE)],
                     [("two", 2.0)]), d / "graph_0.onnx")
    onnx.save(npu_model(), d / "graph_1.onnx")
    onnx.save(_model([helper.make_node("Softmax", ["r"], ["y"], axis=1)], [("r", [1, 4, 4, 4])],
                     [("y", [1, 4, 4, 4])]), d / "graph_2.onnx")
    infos = graph_infos.build([("cpu", ["x"], ["a"]), ("npu", ["a"], ["r"]), ("cpu", ["r"], ["y"])],
                              {"x": SHAPE, "a": SHAPE, "r": [1, 4, 4, 4], "y": [1, 4, 4, 4]}, ["x"], ["y"])
    graph_infos.write(d / "graph_infos.json", infos)
    return d


RECIPE = """\
version: 1
name: t
model:
  path: m.onnx
  inputs: [{{name: x, shape: [1, 3, 8, 8]}}]
target: {target}
quantization:
  scheme: {scheme}
  granularity: per_channel
  calibration: {{data: "cal/*.npy", samples: 6, method: {method}}}
  overrides: {overrides}
  compare_samples: 3
{extra}"""


def context(tmp_path, scheme="pow2_symmetric", method="minmax", overrides="[]", target="npu-16m",
            data=None, extra=""):
    (tmp_path / "cal").mkdir()
    rng = np.random.default_rng(1)
    for i in range(8):
        np.save(tmp_path / "cal" / f"{i}.npy", rng.uniform(-1, 1, SHAPE).astype(np.float32))
    if data is not None:
        data(tmp_path / "cal")
    recipe = tmp_path / "r.yaml"
    recipe.write_text(RECIPE.format(scheme=scheme, method=method, overrides=overrides, target=target,
                                    extra=extra))
    loaded = load_recipe(recipe, check_files=False)
    out = tmp_path / "build" / "quantize"
    out.mkdir(parents=True)
    return StageContext(loaded, loaded.chip(), {"split": split_dir(tmp_path)}, out)


@pytest.mark.parametrize("scheme", ["pow2_symmetric", "asymmetric"])
def test_stage_writes_the_artifacts_and_its_proofs(tmp_path, scheme):
    ctx = context(tmp_path, scheme=scheme, method="kl")
    report = quantize_stage.run(ctx)
    names = sorted(p.name for p in ctx.out.iterdir())
    assert names == ["calibration.json", "graph_1.qdq.onnx", "graph_1.qgraph.json",
                     "graph_1.qgraph.npz", "per_layer.json"]
    q = report["quantization"]
    assert q["calibration_samples"] == 6 and q["crosscheck"]["graph_1"]["ok"]
    assert report["accuracy"]["outputs"]["y"]["cosine"] > 0.99
    qg = QGraph.load(ctx.out / "graph_1.qgraph.json")
    assert [layer.kind for layer in qg.layers] == ["conv", "lut", "maxpool", "conv", "add"]
    assert qg.layers[1].attrs["function"] == "SiLU"  # the fused ConvSilu, lowered by its body
    per_layer = json.loads((ctx.out / "per_layer.json").read_text())["tensors"]
    assert [r["cosine"] for r in per_layer] == sorted(r["cosine"] for r in per_layer)
    calibration = json.loads((ctx.out / "calibration.json").read_text())
    assert calibration["method"] == "kl" and "a" in calibration["graphs"]["graph_1"]["tensors"]


def test_float_override_moves_the_node_to_the_cpu_and_reports_the_gain(tmp_path):
    ctx = context(tmp_path, overrides='[{nodes: ["/m3/Add"], precision: float}]')
    report = quantize_stage.run(ctx)["quantization"]
    cpu = report["graphs"]["graph_1"]["cpu_layers"]
    assert cpu == [{"layer": "/m3/Add", "reason": "kept in float by a quantization override"}]
    (gain,) = report["overrides"]
    assert gain["matched"] == ["/m3/Add"] and gain["cosine_gain"] > 0


def test_float_override_of_a_fused_node_keeps_it_whole(tmp_path):
    fused = next(n.name for n in npu_model().graph.node if n.domain == "npubuild.fused")
    ctx = context(tmp_path, overrides=f'[{{nodes: ["{fused}"], precision: float}}]')
    report = quantize_stage.run(ctx)["quantization"]
    assert [c["layer"] for c in report["graphs"]["graph_1"]["cpu_layers"]] == [fused]
    assert report["crosscheck"]["graph_1"]["ok"]


def test_int16_override(tmp_path):
    ctx = context(tmp_path, scheme="symmetric", overrides='[{tensors: ["p"], precision: int16}]')
    report = quantize_stage.run(ctx)
    qg = QGraph.load(ctx.out / "graph_1.qgraph.json")
    assert qg.tensors["p"].dtype == "int16" and qg.tensors["q"].dtype == "int8"
    assert report["quantization"]["crosscheck"]["graph_1"]["ok"]


def test_where_int8_misses_verify_the_search_keeps_tensors_in_int16_until_it_passes(tmp_path):
    ctx = context(tmp_path, extra="verify: {min_cosine: 0.9999}\n")
    report = quantize_stage.run(ctx)
    search = report["quantization"]["search"]
    assert not report["quantization"]["int8_verdict"]["passed"]
    assert search["passed"] and search["reached"], search
    chosen = [row["tensor"] for row in search["chosen"]]
    assert chosen and {row["precision"] for row in search["chosen"]} == {"int16"}
    qg = QGraph.load(ctx.out / "graph_1.qgraph.json")
    assert all(qg.tensors[t].dtype == "int16" for t in chosen)
    assert json.loads((ctx.out / "search.json").read_text())["chosen"] == search["chosen"]
    assert report["accuracy"]["outputs"]["y"]["cosine"] >= 0.9999
    assert report["accuracy"]["outputs"]["y"]["min_sample_cosine"] >= 0.9999


def test_where_int8_misses_and_weight_rounding_is_unset_gptq_is_judged_and_the_better_kept(tmp_path):
    (tmp_path / "unset").mkdir()
    ctx = context(tmp_path / "unset", extra="  auto: false\nverify: {min_cosine: 0.9999}\n")
    q = quantize_stage.run(ctx)["quantization"]
    measured = q["weight_rounding_measured"]
    # npu-16m has int16, but with the search off nothing deploys it: judged in int8
    assert measured["judged_at"] == "int8"
    assert measured["gptq"] != measured["nearest"]
    better = "gptq" if measured["gptq"] > measured["nearest"] else "nearest"
    assert q["weight_rounding"] == better and "weight_rounding" in q["unset"]
    (tmp_path / "fixed").mkdir()
    fixed = context(tmp_path / "fixed", extra=f"  auto: false\n  weight_rounding: {better}\n"
                                               "verify: {min_cosine: 0.9999}\n")
    q_fixed = quantize_stage.run(fixed)["quantization"]
    assert "weight_rounding_measured" not in q_fixed and q_fixed["weight_rounding"] == better
    kept, chosen = (np.load(c.out / "graph_1.qgraph.npz") for c in (ctx, fixed))
    for key in kept.files:
        np.testing.assert_array_equal(kept[key], chosen[key])


def test_the_search_can_be_switched_off(tmp_path):
    ctx = context(tmp_path, extra="  auto: false\nverify: {min_cosine: 0.9999}\n")
    report = quantize_stage.run(ctx)
    assert "search" not in report["quantization"] and not (ctx.out / "search.json").exists()
    assert not report["quantization"]["int8_verdict"]["passed"]


def test_int16_needs_a_chip_with_int16(tmp_path):
    ctx = context(tmp_path, target="npu-strict", overrides='[{tensors: ["p"], precision: int16}]')
    with pytest.raises(UserError, match="no int16 support"):
        quantize_stage.run(ctx)


def test_nan_in_calibration_data_names_the_file(tmp_path):
    ctx = context(tmp_path, data=lambda d: np.save(d / "3.npy", np.full(SHAPE, np.inf, np.float32)))
    with pytest.raises(UserError, match=r"cal/3\.npy: 192 NaN or Inf"):
        quantize_stage.run(ctx)


def test_a_glob_matching_nothing_is_a_user_error_at_the_recipe_field(tmp_path):
    ctx = context(tmp_path)
    for f in (tmp_path / "cal").iterdir():
        f.unlink()
    with pytest.raises(UserError, match=r"r\.yaml:\d+:\d+: quantization\.calibration\.data: no file matches"):
        quantize_stage.run(ctx)


def test_calibration_files_are_part_of_the_cache_key(tmp_path):
    ctx = context(tmp_path)
    files = STAGES["quantize"].external_files(ctx.loaded)
    assert [f.name for f in files] == [f"{i}.npy" for i in range(8)]


def test_cross_layer_equalization_is_reported_per_graph(tmp_path):
    """The recipe switch reaches the lowering; what it did is in the report and calibration.json
    (this graph's only conv pair has SiLU between: nothing to scale, nothing changed)."""
    ctx = context(tmp_path, extra="  cross_layer_equalization: true\n")
    report = quantize_stage.run(ctx)
    assert report["quantization"]["equalization"] == {"graph_1": {"pairs": 0, "skipped": 0}}
    calibration = json.loads((ctx.out / "calibration.json").read_text())
    assert calibration["graphs"]["graph_1"]["equalization"] == {"pairs": [], "skipped": [], "sweeps": 0,
                                                                "folded_batch_norms": []}
    assert report["quantization"]["crosscheck"]["graph_1"]["ok"]


def test_the_precision_search_counts_the_choices_it_scores_in_the_stages_progress(tmp_path):
    ctx = context(tmp_path, extra="verify: {min_cosine: 0.9999}\n")
    counted = []

    def progress(items, total=None, description=""):
        for item in items:
            counted.append((description, item))
            yield item

    ctx.progress = progress
    report = quantize_stage.run(ctx)
    scored = [n for d, n in counted if d == "precision search, choices scored"]
    assert scored == list(range(1, len(scored) + 1))
    assert len(scored) == report["quantization"]["search"]["evaluations"] > 0
