"""The fusion stage: recipe rules applied in order, logged, warned about, and proven numerically."""

from __future__ import annotations

import json
import logging

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild.errors import BuildError
from npubuild.fusions import FusionReport, FusionRule
from npubuild.onnx_io import run as run_model
from npubuild.proofs import make_feeds as random_feeds
from npubuild.recipe import load_recipe
from npubuild.stages import STAGES, StageContext
from npubuild.stages import fusion as fusion_stage


def conv_silu_model() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="/m0/conv/Conv", pads=[1, 1, 1, 1]),
             helper.make_node("Sigmoid", ["c"], ["s"], name="/m0/act/Sigmoid"),
             helper.make_node("Mul", ["c", "s"], ["y"], name="/m0/act/Mul")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 8, 8])],
        [numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "w"),
         numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def stage_context(tmp_path, fusion_yaml: str) -> StageContext:
    recipe = tmp_path / "r.yaml"
    recipe.write_text(f"version: 1\nname: t\nmodel: {{path: m.onnx}}\nfusion: {fusion_yaml}\n")
    surgery = tmp_path / "build" / "surgery"
    surgery.mkdir(parents=True)
    onnx.save(conv_silu_model(), surgery / "model.onnx")
    out = tmp_path / "build" / "fusion"
    out.mkdir()
    return StageContext(load_recipe(recipe, check_files=False), None, {"surgery": surgery}, out)


def test_an_empty_fusion_list_copies_the_model_unchanged(tmp_path):
    ctx = stage_context(tmp_path, "[]")
    report = fusion_stage.run(ctx)
    assert (ctx.out / "model.onnx").read_bytes() == (ctx.upstream["surgery"] / "model.onnx").read_bytes()
    assert report == {"fusion": {"rules": {}, "fused_ops": {}, "warnings": []}}
    assert json.loads((ctx.out / "log.json").read_text())["rules"] == []


def test_the_stage_writes_the_fused_model_and_a_log_of_what_fired(tmp_path):
    ctx = stage_context(tmp_path, "[conv_silu, silu]")
    report = fusion_stage.run(ctx)["fusion"]
    assert report["rules"] == {"conv_silu": 1, "silu": 0}
    assert report["fused_ops"] == {"ConvSilu": 1}
    fused = onnx.load(ctx.out / "model.onnx")
    assert [n.op_type for n in fused.graph.node] == ["ConvSilu"]
    log = json.loads((ctx.out / "log.json").read_text())
    first = log["rules"][0]
    assert first["fired"] == 1 and first["nodes"] == ["/m0/ConvSilu"]
    assert first["ops"] == {"npubuild.fused.ConvSilu:Silu": 1}
    assert first["check"]["identical"] is True
    feeds = random_feeds(fused)
    assert np.array_equal(run_model(fused, feeds)["y"], run_model(conv_silu_model(), feeds)["y"])


def test_a_rule_that_fired_nowhere_is_a_warning_explained_at_info_level(tmp_path, caplog):
    ctx = stage_context(tmp_path, "[silu, conv_silu]")
    with caplog.at_level(logging.INFO, logger="npubuild"):
        report = fusion_stage.run(ctx)["fusion"]
    assert report["rules"] == {"silu": 1, "conv_silu": 0}
    assert report["warnings"] == ["fusion rule 'conv_silu' fired nowhere; nearest candidate: "
                                  "the graph has no Mul node"]
    log = json.loads((ctx.out / "log.json").read_text())
    assert log["warnings"] == [log["rules"][1]["warning"]]
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warned] == ["fusion rule 'conv_silu' fired nowhere"]
    explained = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("did not match: the graph has no Mul node" in m for m in explained)
    assert any("saw the graph left by silu" in m for m in explained)


def test_a_rule_written_in_the_recipe_yaml_fires(tmp_path):
    rule = ("\n  - name: swish\n    pattern:\n      - {op: Sigmoid, inputs: [v]}\n"
            "      - {op: Mul, inputs: [v, Sigmoid]}")
    ctx = stage_context(tmp_path, rule)
    report = fusion_stage.run(ctx)["fusion"]
    assert report["rules"] == {"swish": 1} and report["fused_ops"] == {"Swish": 1}
    log = json.loads((ctx.out / "log.json").read_text())
    assert log["rules"][0]["kind"] == "recipe"


def test_a_rule_that_changes_the_outputs_fails_the_build_naming_rule_and_tensor(tmp_path, monkeypatch):
    def breaks_math(model):
        broken = onnx.ModelProto()
        broken.CopyFrom(model)
        broken.graph.node[1].op_type = "Tanh"
        return broken, FusionReport(fired=1, fused_nodes=["/m0/act/Sigmoid"])

    monkeypatch.setattr(fusion_stage, "load_builtins", lambda: {"silu": FusionRule("silu", breaks_math)})
    ctx = stage_context(tmp_path, "[silu]")
    with pytest.raises(BuildError, match=r"fusion: rule 'silu' changed the model's outputs: "
                                         r"tensor 'y': max abs diff") as err:
        fusion_stage.run(ctx)
    assert err.value.stage == "fusion"
    assert not (ctx.out / "model.onnx").exists()


def test_the_pipeline_runs_the_fusion_stage_through_its_entry():
    assert STAGES["fusion"].entry == "npubuild.stages.fusion:run"
    assert STAGES["fusion"].function() is fusion_stage.run


def saturated_conv_bn_model() -> onnx.ModelProto:
    """Conv → BatchNormalization → Sigmoid whose logits sit near -12, as PP-OCRv4 det's map does
    on an image without text: the output is ~1e-3 at most, and ONNX Runtime's Sigmoid alone is
    off by ~1.5e-7 — 1e-4 of the output's magnitude after folding the BN (issue 11, class 3)."""
    rng = np.random.default_rng(0)
    inits = {"w": rng.normal(0, 1.0, (16, 8, 3, 3)), "b": rng.normal(0, 1, 16),
             "g": rng.uniform(0.1, 0.2, 16), "beta": np.full(16, -12.0),
             "mu": rng.normal(0, 1, 16), "var": rng.uniform(0.5, 2, 16)}
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1] * 4,
                              kernel_shape=[3, 3]),
             helper.make_node("BatchNormalization", ["c", "g", "beta", "mu", "var"], ["bn"], name="bn"),
             helper.make_node("Sigmoid", ["bn"], ["y"], name="sigmoid")]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 8, 32, 32])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 16, 32, 32])],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in inits.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


def test_exact_folding_before_a_saturated_sigmoid_is_judged_against_the_logits_scale():
    model = saturated_conv_bn_model()
    log = fusion_stage.fuse(model, ["conv_bn"])
    check = log["rules"][0]["check"]
    fused = log["model"]
    feeds = random_feeds(model)
    before, after = run_model(model, feeds)["y"], run_model(fused, feeds)["y"]
    own_scale_error = np.abs(before - after).max() / np.abs(before).max()
    assert own_scale_error > 1e-5  # what failed before: the error over the output's own magnitude
    assert check["max_rel"] <= 1e-6 and check["tensors_compared"] == 2  # y and the folded conv


def test_a_fusion_entry_takes_a_tolerance(tmp_path, monkeypatch):
    def off_by_a_little(model):
        changed = onnx.ModelProto()
        changed.CopyFrom(model)
        bias = changed.graph.initializer[1]
        value = numpy_helper.to_array(bias) * np.float32(1.001)
        bias.CopyFrom(numpy_helper.from_array(value.astype(np.float32), bias.name))
        return changed, FusionReport(fired=1, fused_nodes=["/m0/conv/Conv"])

    monkeypatch.setattr(fusion_stage, "load_builtins",
                        lambda: {"silu": FusionRule("silu", off_by_a_little)})
    with pytest.raises(BuildError, match="give the rule a tolerance"):
        fusion_stage.run(stage_context(tmp_path, "[silu]"))
    (tmp_path / "t").mkdir()
    report = fusion_stage.run(stage_context(tmp_path / "t", "[{silu: {tolerance: 0.01}}]"))
    assert report["fusion"]["rules"] == {"silu": 1}
    log = json.loads((tmp_path / "t" / "build" / "fusion" / "log.json").read_text())
    assert log["rules"][0]["check"]["tolerance"] == 0.01


def _pp_ocr_det():
    from npubuild import onnx_io
    from npubuild.recipe.paths import package_dir

    path = package_dir("rapidocr_onnxruntime") / "models" / "ch_PP-OCRv4_det_infer.onnx"
    return onnx_io.fix_input_shapes(onnx_io.load_model(path), {"x": [1, 3, 320, 320]})


@pytest.mark.slow
def test_pp_ocr_det_batchnorm_folding_passes_on_seeded_inputs():
    """Where class 3 appeared: conv_bn on PP-OCRv4 det failed with 'max abs diff 1.49e-07 =
    0.0025 of its magnitude' on the all-but-zero probability map of seeded noise."""
    log = fusion_stage.fuse(_pp_ocr_det(), ["conv_bn", "hard_swish"])
    conv_bn = log["rules"][0]
    assert conv_bn["fired"] >= 1 and conv_bn["check"]["max_rel"] <= 1e-5
