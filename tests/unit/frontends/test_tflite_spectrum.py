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


@pytest.fixture(scope="module", params=["cast", "real", "imag"])
def one_part_of_a_spectrum(request, tmp_path_factory):
    """x [batch, 4, 20] → frames' RFFT (length 16: the last 4 samples cropped) → one part of
    the spectrum → a dense layer, as BirdNET's spectrogram reads ``tf.cast(rfft, tf.float32)``
    (the real part); TFLite writes an RFFT2D on an expanded axis and squeezes it."""
    tf = tf_frontend._tensorflow()
    part = {"cast": lambda s: tf.cast(s, tf.float32), "real": tf.math.real, "imag": tf.math.imag}
    weights = np.random.default_rng(1).standard_normal((9, 3)).astype(np.float32)
    with tf_frontend._quiet():
        @tf.function(input_signature=[tf.TensorSpec([None, 4, 20], tf.float32, name="x")])
        def spectrum(x):
            return tf.matmul(part[request.param](tf.signal.rfft(x, fft_length=[16])), weights)

        converter = tf.lite.TFLiteConverter.from_concrete_functions(
            [spectrum.get_concrete_function()], spectrum)
        path = tmp_path_factory.mktemp("part") / f"{request.param}.tflite"
        path.write_bytes(converter.convert())
    return path


def test_one_part_of_a_spectrum_imports_as_a_product_equal_to_tflite(one_part_of_a_spectrum):
    """tf2onnx stopped: "could not convert these ops to ONNX: RFFT2D". The part is a product by
    its DFT basis, proven against TFLite's own RFFT2D."""
    inputs = [InputSpec(name="x", shape=[1, 4, 20])]
    model = tf_frontend.convert(one_part_of_a_spectrum, "tflite", inputs, None)
    assert "MatMul" in {n.op_type for n in model.graph.node}
    x = np.random.default_rng(0).standard_normal((1, 4, 20)).astype(np.float32)
    [source] = tf_frontend.run_source(one_part_of_a_spectrum, "tflite", {"x": x}, inputs, None)
    got = next(iter(run(model, {"x": x}).values()))
    assert got.shape == source.shape == (1, 4, 3)
    np.testing.assert_allclose(got, source, atol=1e-4)
    assert np.abs(source).max() > 1.0  # not a model that computes nothing
