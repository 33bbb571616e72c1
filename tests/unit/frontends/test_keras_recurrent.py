"""Keras 3 LSTMs and GRUs as tf2onnx converts them: an ONNX ``LSTM`` or ``GRU``, not a ``Loop``
over the steps.

tf2onnx writes a Keras LSTM it does not recognise as a ``Loop`` (a counter, the cell's MatMuls
and gates in the body), which import unrolls only when short and ONNX Runtime runs slowly
(Shakkala's 315-step BiLSTMs: 0.1 fps). Its Keras LSTM rewriter missed every Keras 3 LSTM at
batch 1 (Keras's ``ops.add`` writes the state's product as a bias, ``BiasAdd(x, Squeeze(h))``)
and every ``implementation=1`` one (Keras 2's default, four products per step); its Keras GRU
rewriter missed every Keras 3 GRU (biases split inside the step, the state's product sliced,
not split). Toy models
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
            recurrent_activation="sigmoid", layer="LSTM", **options):
    """Embedding, a Bidirectional LSTM (sequences), a backward LSTM (last state), Dense (or the
    same of GRUs: `layer`)."""
    keras.utils.set_random_seed(0)
    chars = keras.Input((STEPS,), dtype="int32", name="chars")
    x = keras.layers.Embedding(10, 6, mask_zero=mask_zero)(chars)
    options.update(implementation=implementation, recurrent_activation=recurrent_activation)
    recurrent = getattr(keras.layers, layer)
    x = keras.layers.Bidirectional(recurrent(5, return_sequences=True, **options))(x)
    x = recurrent(4, go_backwards=True, **options)(x)
    return keras.Model(chars, keras.layers.Dense(3, name="tags")(x))


def _trained(keras, model):
    """`model` fitted for a few epochs to tag random sequences by a rule over their ids (gates
    that open and close, not the initial weights' near-constant ones)."""
    rng = np.random.default_rng(0)
    ids = rng.integers(1, 10, (256, STEPS)).astype(np.int32)
    ids[:, -2:] *= rng.integers(0, 2, (256, 1)).astype(np.int32)  # some sequences padded
    tags = (ids[:, :4].sum(1) * 3 // (9 * 4 + 1)).astype(np.int32)  # 0, 1 or 2
    model.compile(optimizer=keras.optimizers.Adam(0.02),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    model.fit(ids, tags, epochs=4, batch_size=32, verbose=0)
    return model


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


@pytest.mark.parametrize("options", [{}, {"recurrent_dropout": 0.1}, {"reset_after": False}],
                         ids=["implementation-2", "recurrent-dropout", "reset-before"])
def test_a_keras_gru_converts_to_the_onnx_gru_it_computes(tmp_path, options):
    """Keras 3's GRU (``reset_after``, its default) is ONNX's GRU with ``linear_before_reset``;
    one resetting before the recurrent product (Keras 2.2's default) is ONNX's without it
    (written as TensorFlow 1's GRUCell, the form tf2onnx maps); a recurrent dropout makes
    Keras 3 run the cell as ``implementation=1`` (three products per step), traced as 2.
    Trained, so the gates are not the initial weights' ones."""
    import keras

    model = _trained(keras, _tagger(keras, 2, layer="GRU", **options))
    converted, ops = _converted(tmp_path, model)
    assert ops["Loop"] == 0, ops
    assert ops["GRU"] == 2, ops  # the Bidirectional one, and the backward one
    for node in converted.graph.node:
        if node.op_type == "GRU":
            linear = [a.i for a in node.attribute if a.name == "linear_before_reset"]
            assert (linear or [0]) == [int(options.get("reset_after", True))]  # ONNX's default 0
    feeds = {"chars": np.arange(STEPS, dtype=np.int32)[None] % 10}
    model = onnx_frontend.resolve_shapes(converted, declared=converted)
    model, _ = importer.fold_constants(model, feeds)
    _, figures = importer.unroll_recurrent(model, feeds)
    assert figures["unrolled"] == {"GRU": 2}, figures


@pytest.mark.parametrize("layer, options", [
    ("LSTM", {}), ("GRU", {}), ("GRU", {"reset_after": False})],
    ids=["lstm", "gru", "gru-reset-before"])
def test_a_masked_keras_rnn_stays_a_loop_computing_the_same(tmp_path, layer, options):
    """Keras 3 masks a step by a per-step tensor (``where(mask[t], h', h)``), not by a length
    tf2onnx's rewriter reads; a length (ONNX's ``sequence_lens``) would be the same only where
    every mask is a prefix, which the graph cannot show: the mask is the data's ``ids != 0``,
    and an id 0 inside a sequence is a step Keras skips. These stay Loops, computing what
    Keras computes."""
    import keras

    model = _trained(keras, _tagger(keras, 2, mask_zero=True, layer=layer, **options))
    _, ops = _converted(tmp_path, model)
    assert ops["Loop"] == 3 and ops[layer] == 0, ops


def test_a_tf2onnx_without_the_gru_internals_npubuild_patches_converts_as_before(monkeypatch):
    """The GRUCell patch reads tf2onnx's internals by name; a tf2onnx that names them otherwise
    is left alone (an AttributeError there stopped every TensorFlow import in its process)."""
    from tf2onnx import tfonnx
    from tf2onnx.rewriter import gru_tf2_rewriter

    from npubuild.frontends import tf_loops

    monkeypatch.delattr(gru_tf2_rewriter, "make_grucell_pattern")
    before = tfonnx.rewrite_gru_tf2
    tf_loops.read_gru_cells_without_identities()
    assert tfonnx.rewrite_gru_tf2 is before
