"""Keras 3 LSTMs as tf2onnx converts them: an ONNX ``LSTM``, not a ``Loop`` over the steps.

tf2onnx writes a Keras LSTM it does not recognise as a ``Loop`` (a counter, the cell's MatMuls
and gates in the body), which import unrolls only when short and ONNX Runtime runs slowly
(Shakkala's 315-step BiLSTMs: 0.1 fps). Its Keras LSTM rewriter missed every Keras 3 LSTM at
batch 1 (Keras's ``ops.add`` writes the state's product as a bias, ``BiasAdd(x, Squeeze(h))``)
and every ``implementation=1`` one (Keras 2's default, four products per step). Toy models
built here, each checked against Keras itself on the same input; a short LSTM is then unrolled
by import (a long one, Shakkala's, stays whole on the CPU).
"""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest

from npubuild.frontends import onnx as onnx_frontend
from npubuild.frontends import tensorflow as tf_frontend
from npubuild.frontends.keras_legacy import keras2_hard_sigmoid
from npubuild.recipe.model import InputSpec
from npubuild.stages import importer

pytestmark = pytest.mark.slow

STEPS = 12


def _tagger(keras, implementation: int, mask_zero: bool = False,
            recurrent_activation="sigmoid"):
    """Embedding, a Bidirectional LSTM (sequences), a backward LSTM (last state), Dense."""
    keras.utils.set_random_seed(0)
    chars = keras.Input((STEPS,), dtype="int32", name="chars")
    x = keras.layers.Embedding(10, 6, mask_zero=mask_zero)(chars)
    options = {"implementation": implementation, "recurrent_activation": recurrent_activation}
    x = keras.layers.Bidirectional(keras.layers.LSTM(5, return_sequences=True, **options))(x)
    x = keras.layers.LSTM(4, go_backwards=True, **options)(x)
    return keras.Model(chars, keras.layers.Dense(3, name="tags")(x))


def _converted(tmp_path, model):
    import onnxruntime as ort

    path = tmp_path / "model.keras"
    model.save(path)
    converted = tf_frontend.convert(path, "keras", [InputSpec(name="chars", shape=[1, STEPS])],
                                    None)
    chars = np.array([[1, 4, 2, 3, 9, 8, 7, 5, 6, 1, 0, 0]], np.int32)
    session = ort.InferenceSession(converted.SerializeToString(),
                                   providers=["CPUExecutionProvider"])
    (got,) = session.run(None, {"chars": chars})
    np.testing.assert_allclose(got, np.asarray(model(chars)), rtol=0, atol=1e-5)
    return converted, Counter(node.op_type for node in converted.graph.node)


@pytest.mark.parametrize("implementation", [1, 2])
def test_a_keras_lstm_converts_to_the_onnx_lstm_it_computes(tmp_path, implementation):
    import keras

    converted, ops = _converted(tmp_path, _tagger(keras, implementation))
    assert ops["Loop"] == 0, ops
    assert ops["LSTM"] == 2, ops  # the Bidirectional one, and the backward one
    # then import unrolls them over their 12 steps, as any ONNX LSTM of a static length
    feeds = {"chars": np.arange(STEPS, dtype=np.int32)[None] % 10}
    model = onnx_frontend.resolve_shapes(converted, declared=converted)
    model, _ = importer.fold_constants(model, feeds)
    _, figures = importer.unroll_recurrent(model, feeds)
    assert figures["unrolled"] == {"LSTM": 2}, figures


def test_keras_2s_hard_sigmoid_gate_converts_to_hard_sigmoid(tmp_path):
    """Keras 2's gate (read from a Keras 2 file as `keras2_hard_sigmoid`) is ONNX's
    HardSigmoid with its default alpha 0.2 and beta 0.5."""
    import keras

    with keras.saving.custom_object_scope({"keras2_hard_sigmoid": keras2_hard_sigmoid}):
        model = _tagger(keras, 1, recurrent_activation=keras2_hard_sigmoid)
        converted, ops = _converted(tmp_path, model)
    assert ops["Loop"] == 0 and ops["LSTM"] == 2, ops
    for node in converted.graph.node:
        if node.op_type == "LSTM":
            (activations,) = [a.strings for a in node.attribute if a.name == "activations"]
            assert activations[0] == b"HardSigmoid", activations


def test_a_masked_keras_lstm_stays_a_loop_computing_the_same(tmp_path):
    """Keras 3 masks a step by a per-step tensor (``where(mask[t], h', h)``), not by a length
    tf2onnx's rewriter reads: the layer stays a Loop, computing what Keras computes."""
    import keras

    _, ops = _converted(tmp_path, _tagger(keras, 2, mask_zero=True))
    assert ops["Loop"] == 3 and ops["LSTM"] == 0, ops
