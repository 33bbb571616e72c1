"""The import proof of a TensorFlow/TFLite source judges its difference from the imported model
against the scale of the values involved and beyond the float rounding the model itself shows
in ONNX Runtime (its result with graph optimisations on against off), with `model.tolerance`
on top; a failure names where and the measured figures, and the tolerance that accepts them.

The source framework is stood in for (`run_source`): these tests are about the judgement."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from npubuild import onnx_io, proofs
from npubuild.errors import BuildError
from npubuild.frontends import tensorflow as tf_frontend
from npubuild.recipe import load_recipe
from npubuild.stages import importer
from tests.conftest import write_recipe

C = 8


def _f32(value) -> np.ndarray:
    return np.asarray(value, np.float32)


def amplifier():
    """y = (BatchNormalization(Conv(x)) - the same conv with the norm folded in) * 1e4: zero in
    exact arithmetic, so y is float rounding, magnified; ONNX Runtime folds the norm itself
    when its graph optimisations are on, and rounds otherwise."""
    rng = np.random.default_rng(0)
    w = _f32(rng.normal(size=(C, C, 3, 3)))
    gamma, beta, mean, var = (_f32(rng.uniform(0.5, 2, C)), _f32(rng.normal(size=C)),
                              _f32(rng.normal(size=C)), _f32(rng.uniform(0.5, 2, C)))
    k = gamma / np.sqrt(var + 1e-5)
    inits = [numpy_helper.from_array(a, n) for a, n in [
        (w, "w"), (gamma, "g"), (beta, "b"), (mean, "m"), (var, "v"),
        (_f32(w * k[:, None, None, None]), "wf"), (_f32(beta - mean * k), "bf"),
        (_f32(1e4), "gain")]]
    nodes = [helper.make_node("Conv", ["x", "w"], ["c"], pads=[1] * 4),
             helper.make_node("BatchNormalization", ["c", "g", "b", "m", "v"], ["n"]),
             helper.make_node("Conv", ["x", "wf", "bf"], ["f"], pads=[1] * 4),
             helper.make_node("Sub", ["n", "f"], ["d"]),
             helper.make_node("Mul", ["d", "gain"], ["y"])]
    return _model(nodes, inits)


def plain_conv():
    rng = np.random.default_rng(1)
    inits = [numpy_helper.from_array(_f32(rng.normal(size=(C, C, 3, 3))), "w")]
    return _model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1] * 4)], inits)


def _model(nodes, inits):
    graph = helper.make_graph(nodes, "m", [helper.make_tensor_value_info("x", 1, [1, C, 8, 8])],
                              [helper.make_tensor_value_info("y", 1, [1, C, 8, 8])], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)],
                             ir_version=onnx_io.MAX_ORT_IR_VERSION)


FEEDS = {"x": np.random.default_rng(2).normal(size=(1, C, 8, 8)).astype(np.float32)}


def prove(tmp_path, monkeypatch, model, source_outputs, tolerance=None):
    """The import stage's proof of ``model`` against a Keras source that returns
    ``source_outputs``."""
    (tmp_path / "m.keras").write_bytes(b"")
    extra = f"  tolerance: {tolerance}\n" if tolerance is not None else ""
    loaded = load_recipe(write_recipe(tmp_path, f"version: 1\nname: t\nmodel:\n  path: m.keras\n"
                                                f"{extra}"), check_files=False)
    monkeypatch.setattr(tf_frontend, "source_tensors", lambda *a: None)
    monkeypatch.setattr(tf_frontend, "run_source", lambda *a: [source_outputs])
    return importer.prove(loaded, "keras", None, model, FEEDS)


def test_a_source_within_the_rounding_the_model_shows_in_onnx_runtime_passes(tmp_path,
                                                                             monkeypatch):
    model = amplifier()
    optimised = onnx_io.run(onnx_io.session(model, optimized=True), FEEDS)["y"]
    plain = onnx_io.run(model, FEEDS)["y"]
    _, scales = proofs.run_with_scales(model, FEEDS, ["y"])
    assert np.abs(optimised - plain).max() / scales["y"] > 1e-2  # far above 1e-4: rounding
    proof, _ = prove(tmp_path, monkeypatch, model, optimised)
    assert proof["y"]["rounding_floor"] > 1e-2 and proof["y"]["max_rel"] <= proof["y"]["allowed"]


def test_a_difference_beyond_rounding_fails_naming_the_op_and_the_tolerance_that_accepts_it(
        tmp_path, monkeypatch):
    model = plain_conv()
    wrong = onnx_io.run(model, FEEDS)["y"] * 1.003
    with pytest.raises(BuildError) as err:
        prove(tmp_path, monkeypatch, model, wrong)
    assert "import: the imported model differs from the source: tensor 'y'" in str(err.value)
    hint = err.value.hint
    assert "at 'y' (Conv" in hint and "cut the model at an earlier tensor" in hint
    accepted = float(hint.rsplit("model.tolerance: ", 1)[1].split()[0])
    proof, _ = prove(tmp_path, monkeypatch, model, wrong, tolerance=accepted)
    assert proof["y"]["allowed"] == accepted


def test_a_conv_output_is_judged_against_the_sum_of_its_products():
    model = plain_conv()
    _, own = proofs.run_with_scales(model, FEEDS, ["y"])
    _, products = proofs.run_with_scales(model, FEEDS, ["y"], products=True)
    assert products["y"] > own["y"]


def test_compare_takes_one_tolerance_per_tensor():
    ref = {"a": np.ones(4, np.float32), "b": np.ones(4, np.float32)}
    got = {"a": ref["a"] * 1.01, "b": ref["b"] * 1.01}
    _, bad = proofs.compare(ref, got, tolerance={"a": 0.02, "b": 0.001})
    assert [m.tensor for m in bad] == ["b"]
