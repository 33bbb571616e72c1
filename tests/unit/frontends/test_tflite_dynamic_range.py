"""A dynamic-range quantized TFLite model (int8 weights, float activations: TFLite's hybrid
kernels quantize the activations at run time) imports as the float model its weights stand for,
and is proved against TFLite running that same float model (fer's emotion_model_quantized.tflite
kept nine DequantizeLinear and was judged against the hybrid kernels' own rounding)."""

from __future__ import annotations

import numpy as np
import pytest

from npubuild.frontends import tensorflow as tf_frontend
from npubuild.frontends import tflite_graph
from npubuild.onnx_io import run
from npubuild.recipe.model import InputSpec

pytestmark = pytest.mark.slow
SHAPE = [1, 8, 8, 16]


@pytest.fixture(scope="module")
def dynamic_range(tmp_path_factory):
    """A Conv2D (4,608 weights: TFLite quantizes weights of 1,024 elements and more) + ReLU +
    Dense CNN, converted with weight-only (dynamic range) quantization."""
    tf = tf_frontend._tensorflow()
    with tf_frontend._quiet():
        tf.keras.utils.set_random_seed(0)
        image = tf.keras.Input(SHAPE[1:], name="image")
        x = tf.keras.layers.Conv2D(32, 3, activation="relu")(image)
        x = tf.keras.layers.GlobalAveragePooling2D()(x)
        model = tf.keras.Model(image, tf.keras.layers.Dense(40, name="scores")(x))
        converter = tf.lite.TFLiteConverter.from_keras_model(model)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        path = tmp_path_factory.mktemp("dr") / "model.tflite"
        path.write_bytes(converter.convert())
    return path


def test_its_weights_are_int8_beside_float_activations(dynamic_range):
    model = tflite_graph.read(dynamic_range)
    types = {t.type for t in model.subgraphs[0].tensors}
    assert 9 in types and not tflite_graph.has_integer_activations(model)


def test_it_imports_as_the_float_model_its_weights_stand_for(dynamic_range):
    inputs = [InputSpec(name="serving_default_image:0", shape=SHAPE)]
    model = tf_frontend.convert(dynamic_range, "tflite", inputs, None)
    assert not any(n.op_type in ("DequantizeLinear", "QuantizeLinear") for n in model.graph.node)
    x = np.random.default_rng(1).normal(size=SHAPE).astype(np.float32)
    [source] = tf_frontend.run_source(dynamic_range, "tflite", {"serving_default_image:0": x}, inputs, None)
    got = next(iter(run(model, {"serving_default_image:0": x}).values()))
    np.testing.assert_allclose(got, source, atol=1e-5 * np.abs(source).max())


def test_only_weights_beside_float_activations_are_dequantized(dynamic_range):
    model = tflite_graph.read(dynamic_range)
    assert tflite_graph.dequantize_weights(model) >= 1
    assert {t.type for t in model.subgraphs[0].tensors} <= {0, 2}  # float32, int32 shapes
    assert tflite_graph.dequantize_weights(model) == 0
