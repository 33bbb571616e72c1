"""Every fusion rule, through quantize and compile: the fused functions reach every model a stage
writes (issue 11, class 4: ``npubuild.fused:HardSwish(-1) is not a registered function/op`` when
quantize converted an opset-12 PP-OCR submodel and the opset converter dropped its functions).

One tiny opset-12 model per rule (a Conv first, so the data is image-like); the test fails when a
rule is registered without a model here.
"""

from __future__ import annotations

import glob

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild import api, fusions, onnx_io
from npubuild.stages.fusion import fused_op_counts
from tests.conftest import write_recipe

OPSET = 12  # below quantize's opset 13: the version conversion is on the path
RNG = np.random.default_rng(5)


def _conv(x: str, y: str, cin: int = 3, cout: int = 4, pad: int = 1) -> tuple[list, dict]:
    w, b = f"{y}_w", f"{y}_b"
    node = helper.make_node("Conv", [x, w, b], [y], name=y, kernel_shape=[3, 3], pads=[pad] * 4)
    return [node], {w: RNG.normal(0, 0.3, (cout, cin, 3, 3)), b: RNG.normal(0, 0.1, cout)}


def _n(op, inputs, outputs, **attrs):
    return helper.make_node(op, inputs, outputs, name=outputs[0], **attrs)


def _channels(v):
    return np.asarray(v, np.float32).reshape(1, 4, 1, 1)


def _pattern(rule: str) -> tuple[list, dict]:
    """The nodes after the first Conv (output ``c``), ending in ``y``, and their constants."""
    c4 = RNG.uniform(0.5, 1.5, 4)
    if rule == "fold_affine":
        return [_n("Mul", ["c", "s"], ["m"]), _n("Add", ["m", "t"], ["y"])], {
            "s": _channels(c4), "t": _channels(c4 - 1)}
    if rule == "conv_bn":
        return [_n("BatchNormalization", ["c", "g", "b", "mu", "var"], ["y"])], {
            "g": c4, "b": c4 - 1, "mu": c4 / 3, "var": c4}
    if rule == "pad_conv":
        nodes, consts = _conv("p", "y", 4, 4, pad=0)
        return [_n("Pad", ["c", "pads"], ["p"]), *nodes], {
            **consts, "pads": np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64)}
    if rule in ("conv_silu", "silu"):
        src = "c" if rule == "conv_silu" else "a"
        pre = [] if rule == "conv_silu" else [_n("Add", ["c", "one"], ["a"])]
        return [*pre, _n("Sigmoid", [src], ["s"]), _n("Mul", [src, "s"], ["y"])], {"one": np.float32(1)}
    if rule == "conv_act":
        return [_n("Relu", ["c"], ["y"])], {}
    if rule == "hard_swish":  # PP-OCR's spelling: x * Relu6(x + 3) / 6
        return [_n("Add", ["c", "three"], ["a"]), _n("Clip", ["a", "zero", "six"], ["r"]),
                _n("Mul", ["c", "r"], ["m"]), _n("Div", ["m", "six"], ["y"])], {
            "three": np.float32(3), "zero": np.float32(0), "six": np.float32(6)}
    if rule == "gemm_act":
        return [_n("GlobalAveragePool", ["c"], ["g"]), _n("Flatten", ["g"], ["f"]),
                _n("Gemm", ["f", "w", "wb"], ["m"], transB=1), _n("Relu", ["m"], ["y"])], {
            "w": RNG.normal(0, 0.5, (5, 4)), "wb": RNG.normal(0, 0.1, 5)}
    if rule == "matmul_add":
        return [_n("Reshape", ["c", "shape"], ["r"]), _n("MatMul", ["r", "w"], ["m"]),
                _n("Add", ["m", "wb"], ["y"])], {
            "shape": np.array([1, 4, 64], np.int64), "w": RNG.normal(0, 0.2, (64, 6)),
            "wb": RNG.normal(0, 0.1, 6)}
    if rule == "layer_norm":
        return [_n("Reshape", ["c", "shape"], ["r"]),
                _n("ReduceMean", ["r"], ["mu"], axes=[-1]), _n("Sub", ["r", "mu"], ["d"]),
                _n("Pow", ["d", "two"], ["sq"]), _n("ReduceMean", ["sq"], ["var"], axes=[-1]),
                _n("Add", ["var", "eps"], ["ve"]), _n("Sqrt", ["ve"], ["std"]),
                _n("Div", ["d", "std"], ["n"]), _n("Mul", ["n", "gamma"], ["ng"]),
                _n("Add", ["ng", "beta"], ["y"])], {
            "shape": np.array([1, 4, 64], np.int64), "two": np.float32(2),
            "eps": np.float32(1e-5), "gamma": RNG.uniform(0.5, 1.5, 64), "beta": RNG.normal(0, .1, 64)}
    raise KeyError(rule)


def rule_model(rule: str) -> onnx.ModelProto:
    conv, consts = _conv("x", "c")
    nodes, more = _pattern(rule)
    inits = [numpy_helper.from_array(v if np.asarray(v).dtype.kind == "i"
                                     else np.asarray(v, np.float32), k)
             for k, v in {**consts, **more}.items()]
    graph = helper.make_graph(
        conv + nodes, rule,
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], ir_version=7)
    return onnx.shape_inference.infer_shapes(model)


RECIPE = """\
version: 1
name: {rule}
model:
  path: {model}
  inputs: [{{name: x, shape: [1, 3, 8, 8], preprocess: {{resize: [8, 8], scale: 0.0039}}}}]
fusion: [{rule}]
quantization:
  scheme: symmetric
  calibration: {{data: "pkg:skimage/data/[a-c]*.png", samples: 2}}
verify: {{data: "pkg:skimage/data/rocket.jpg", samples: 1, min_cosine: -1}}
"""


def test_every_registered_rule_has_a_model_here():
    for rule in fusions.load_builtins().names():
        _pattern(rule)


@pytest.mark.parametrize("rule", fusions.DEFAULT_RULES)
def test_a_fused_model_goes_through_quantize_compile_and_verify(tmp_path, rule, monkeypatch):
    if rule == "layer_norm":  # import writes it as LayerNormalization where it can convert the
        # model to opset 17: the fused op is what is left where it cannot
        from npubuild.frontends import onnx as onnx_frontend

        # (a converter that refuses opset 17 refuses 23 too: else the centred tail would be
        # written as an RMSNormalization)
        for as_op in ("layer_norms_as_op", "rms_norms_as_op"):
            monkeypatch.setattr(onnx_frontend, as_op,
                                lambda model: (model, "the converter refused (this test)"))
    onnx.save(rule_model(rule), str(tmp_path / "m.onnx"))
    recipe = write_recipe(tmp_path, RECIPE.format(rule=rule, model=tmp_path / "m.onnx"))
    session = api.session_for(recipe, build_root=tmp_path / "build", cache=tmp_path / "cache")
    report = api.build(session, None)
    build = tmp_path / "build" / rule
    fusion_log = (build / "fusion" / "log.json").read_text()
    assert f'"fired": 0' not in fusion_log, fusion_log
    written = sorted(glob.glob(str(build / "*" / "*.onnx")))
    assert any("/split/" in p for p in written) and any("/quantize/" in p for p in written)
    for path in written:
        assert onnx_io.missing_functions(onnx_io.load_model(path)) == [], path
    assert report["stages"]["verify"]["status"] == "built", report["stages"]


@pytest.mark.parametrize("chip", ["npu-tiny", "npu-strict"])
def test_a_table_op_whose_body_the_chip_does_not_list_compiles_on_its_npu(tmp_path, chip):
    """The fused HardSwish with its Div (neither chip lists Div) placed on the NPU as the
    lookup table quantize makes of it: compile takes it and verify passes."""
    onnx.save(rule_model("hard_swish"), str(tmp_path / "m.onnx"))
    recipe = write_recipe(tmp_path, RECIPE.format(rule="hard_swish", model=tmp_path / "m.onnx")
                          + f"target: {chip}\n")
    session = api.session_for(recipe, build_root=tmp_path / "build", cache=tmp_path / "cache")
    report = api.build(session, None)
    assert report["split"]["cpu_nodes"] == 0, report["split"]
    assert report["stages"]["verify"]["status"] == "built", report["stages"]


@pytest.mark.slow
def test_pp_ocr_cls_with_hard_swish_goes_through_quantize_compile_and_verify(ppocr_cls):
    """Where class 4 appeared: PP-OCR (opset 12) with hard_swish fused."""
    build, result = ppocr_cls
    assert result.returncode == 0, result.stderr
    log = (build / "fusion" / "log.json").read_text()
    assert '"rule": "hard_swish"' in log and '"HardSwish"' in log
    for path in sorted(build.glob("*/*.onnx")):
        assert onnx_io.missing_functions(onnx_io.load_model(path)) == [], path
    assert (build / "compile").is_dir() and (build / "verify" / "verify.json").is_file()
