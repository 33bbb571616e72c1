"""TFLite spectrograms: TFLite Model Maker's speech-commands models squeeze the complex
spectrum of an RFFT2D before its COMPLEX_ABS; tf2onnx converts an RFFT2D only when
COMPLEX_ABS reads it directly ("could not convert these ops to ONNX: RFFT2D, ComplexAbs")."""

from __future__ import annotations

import numpy as np
import pytest

from npubuild.frontends import tensorflow as tf_frontend
from npubuild.frontends import tflite_graph
from npubuild.onnx_io import run
from npubuild.recipe.model import InputSpec

pytestmark = pytest.mark.slow
INPUTS = [InputSpec(name="x", shape=[1, 4, 1, 16])]


@pytest.fixture(scope="module")
def squeezed_spectrum(tmp_path_factory):
    """x [batch, 4, 1, 16] → RFFT2D → squeeze the height-1 axis → |·| → log; the batch left
    dynamic as Model Maker exports it (with static shapes tf2onnx folds the reshape away)."""
    tf = tf_frontend._tensorflow()
    with tf_frontend._quiet():
        @tf.function(input_signature=[tf.TensorSpec([None, 4, 1, 16], tf.float32, name="x")])
        def spectrum(x):
            return tf.math.log(tf.abs(tf.squeeze(tf.signal.rfft2d(x), axis=2)) + 1e-6)

        converter = tf.lite.TFLiteConverter.from_concrete_functions(
            [spectrum.get_concrete_function()], spectrum)
        path = tmp_path_factory.mktemp("spectrum") / "spectrum.tflite"
        path.write_bytes(converter.convert())
    return path


def kinds(model) -> list[str]:
    return [tflite_graph.op_type(model, op) for op in model.subgraphs[0].operators]


def test_the_magnitude_moves_next_to_the_fft(squeezed_spectrum):
    model = tflite_graph.read(squeezed_spectrum)
    assert kinds(model)[kinds(model).index("RFFT2D") + 1] in ("SQUEEZE", "RESHAPE")
    assert tflite_graph.complex_abs_next_to_fft(model) == 1
    assert kinds(model)[kinds(model).index("RFFT2D") + 1] == "COMPLEX_ABS"
    assert tflite_graph.complex_abs_next_to_fft(model) == 0


def test_it_imports_equal_to_tflite(squeezed_spectrum):
    model = tf_frontend.convert(squeezed_spectrum, "tflite", INPUTS, None)
    x = np.random.default_rng(0).standard_normal((1, 4, 1, 16)).astype(np.float32)
    [source] = tf_frontend.run_source(squeezed_spectrum, "tflite", {"x": x}, INPUTS, None)
    got = next(iter(run(model, {"x": x}).values()))
    assert got.shape == source.shape == (1, 4, 9)
    np.testing.assert_allclose(got, source, atol=1e-4)
