"""HDF5 models written by Keras 2 (shakkala 1.7's diacritizer, 2.1; russtress 0.1.4's stress
model, 2.0; nakdimon's, 2.6): Keras 3's loader for legacy HDF5 files stops inside itself (a
Sequential's configuration is a list there: "pop expected at most 1 argument, got 2"; a wrapped
LSTM without a module); import reads them from their configuration rewritten for Keras 3, and
where it cannot, names the Keras that wrote the file and what to do, instead of "check that
model.path is a Keras model"."""

from __future__ import annotations

import json

import numpy as np
import pytest

from npubuild.errors import UserError
from npubuild.frontends import tensorflow as tf_frontend
from npubuild.recipe.model import InputSpec

pytestmark = pytest.mark.slow


def _keras_2_1_h5(path, version: str = "2.1.6", **extra):
    """What Keras 2.1.6 writes for Sequential([Dense(3, input_shape=(4,))]): the layers as a
    list under ``config``, ``batch_input_shape`` on the first layer, the weights per layer."""
    import h5py

    dense = {"class_name": "Dense", "config": {
        "name": "dense_1", "trainable": True, "batch_input_shape": [None, 4], "dtype": "float32",
        "units": 3, "activation": "relu", "use_bias": True,
        "kernel_initializer": {"class_name": "VarianceScaling", "config": {
            "scale": 1.0, "mode": "fan_avg", "distribution": "uniform", "seed": None}},
        "bias_initializer": {"class_name": "Zeros", "config": {}},
        "kernel_regularizer": None, "bias_regularizer": None, "activity_regularizer": None,
        "kernel_constraint": None, "bias_constraint": None, **extra}}
    with h5py.File(path, "w") as handle:
        handle.attrs["keras_version"] = version.encode()
        handle.attrs["backend"] = b"tensorflow"
        handle.attrs["model_config"] = json.dumps(
            {"class_name": "Sequential", "config": [dense]}).encode()
        weights = handle.create_group("model_weights")
        weights.attrs["layer_names"] = [b"dense_1"]
        layer = weights.create_group("dense_1")
        layer.attrs["weight_names"] = [b"dense_1/kernel:0", b"dense_1/bias:0"]
        rng = np.random.default_rng(0)
        layer.create_dataset("dense_1/kernel:0", data=rng.normal(size=(4, 3)).astype(np.float32))
        layer.create_dataset("dense_1/bias:0", data=np.zeros(3, np.float32))
    return path


def test_a_keras_2_1_sequential_h5_imports_as_its_layers(tmp_path):
    """Keras 2.0 and 2.1 wrote a Sequential's layers as a bare list, the input shape on the
    first layer (``batch_input_shape``): Keras 3 stopped ("pop expected at most 1 argument, got
    2"), and read as a dict it took the shape for one without the batch axis. Import reads the
    list as a Sequential with an input layer of that shape."""
    import h5py

    path = _keras_2_1_h5(tmp_path / "model.h5")
    inputs = [InputSpec(name="dense_1_input", shape=[1, 4])]  # as Keras names a Sequential's
    assert tf_frontend.signature(path, "keras", inputs, None)["inputs"] == ["dense_1_input"]
    x = np.array([[1.0, -2.0, 0.5, 3.0]], np.float32)
    (got,) = tf_frontend.run_source(path, "keras", {"dense_1_input": x}, inputs, None)
    with h5py.File(path, "r") as handle:
        kernel = handle["model_weights/dense_1/dense_1/kernel:0"][()]
    np.testing.assert_allclose(got, np.maximum(x @ kernel, 0), rtol=0, atol=1e-6)


def test_a_keras_2_2_sequential_input_is_named_as_keras_2_named_it_in_any_process(tmp_path):
    """Keras 2.2 and 2.3 wrote a Sequential as ``{"name", "layers"}`` with no input layer (the
    shape on its first layer): Keras 3 names that input by a counter of the process
    (``keras_tensor``, then ``keras_tensor_2`` for the next model it reads), so a recipe could
    not name it and the name the recipe loader filled in ("dense_1") was not the model's.
    Import names it ``dense_1_input``, as Keras 2 did, however many models were read before."""
    import h5py

    from npubuild.frontends.keras_legacy import input_names

    path = _keras_2_1_h5(tmp_path / "model.h5", version="2.2.4")
    with h5py.File(path, "r+") as handle:
        config = json.loads(handle.attrs["model_config"])
        handle.attrs["model_config"] = json.dumps(
            {"class_name": "Sequential", "config": {"name": "sequential_1",
                                                    "layers": config["config"]}}).encode()
    assert input_names(path) == ["dense_1_input"]
    inputs = [InputSpec(name="dense_1_input", shape=[1, 4])]
    for _ in range(2):  # the second read is where Keras 3's counter moved on
        assert tf_frontend.signature(path, "keras", inputs, None)["inputs"] == ["dense_1_input"]


def test_a_keras_2_h5_keras_3_reads_without_error_still_computes_keras_2s_hard_sigmoid(tmp_path):
    """A Keras 2.2 Sequential whose Dense ends in ``hard_sigmoid``: Keras 3 reads the file
    without a word and computes relu6(x + 3) / 6 where Keras 2 computed clip(0.2·x + 0.5, 0, 1)
    (the import proof compares with that same wrong model). Import reads every file an older
    Keras wrote from its rewritten configuration, Keras 2's function named."""
    import h5py

    path = _keras_2_1_h5(tmp_path / "model.h5", version="2.2.4", activation="hard_sigmoid")
    with h5py.File(path, "r+") as handle:
        config = json.loads(handle.attrs["model_config"])
        handle.attrs["model_config"] = json.dumps(
            {"class_name": "Sequential", "config": {"name": "sequential_1",
                                                    "layers": config["config"]}}).encode()
        kernel = handle["model_weights/dense_1/dense_1/kernel:0"][()]
    inputs = [InputSpec(name="dense_1_input", shape=[1, 4])]
    x = np.array([[1.0, -2.0, 0.5, 3.0]], np.float32)
    (got,) = tf_frontend.run_source(path, "keras", {"dense_1_input": x}, inputs, None)
    np.testing.assert_allclose(got, np.clip(0.2 * (x @ kernel) + 0.5, 0, 1), rtol=0, atol=1e-6)


def test_a_keras_2_1_h5_keras_3_cannot_read_names_the_keras_that_wrote_it(tmp_path):
    path = _keras_2_1_h5(tmp_path / "model.h5", time_major=True)  # an argument Keras 3 removed
    inputs = [InputSpec(name="x", shape=[1, 4])]
    with pytest.raises(UserError) as caught:
        tf_frontend.signature(path, "keras", inputs, None)
    assert "written by Keras 2.1.6, with Keras 3." in caught.value.message
    assert "time_major=True" in caught.value.message
    assert "load it with Keras 2.1.6" in caught.value.hint


def test_an_unreadable_h5_naming_no_older_keras_keeps_the_plain_message(tmp_path):
    path = _keras_2_1_h5(tmp_path / "model.h5", version="")
    with pytest.raises(UserError, match="cannot read a Keras model"):
        tf_frontend.signature(path, "keras", [InputSpec(name="x", shape=[1, 4])], None)


def _keras_2_6_config(recurrent_activation: str) -> dict:
    """What Keras 2.6 writes for the tagger below (nakdimon 0.1.2's Nakdimon.h5 spells its
    layers so): the wrapped LSTM without a ``module``, its ``time_major``, inbound nodes as
    lists, the mask implicit."""
    lstm = {"class_name": "LSTM", "config": {
        "name": "lstm", "trainable": True, "dtype": "float32", "return_sequences": True,
        "return_state": False, "go_backwards": False, "stateful": False, "unroll": False,
        "time_major": False, "units": 3, "activation": "tanh",
        "recurrent_activation": recurrent_activation, "use_bias": True,
        "kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": None}},
        "recurrent_initializer": {"class_name": "Orthogonal", "config": {"gain": 1.0, "seed": None}},
        "bias_initializer": {"class_name": "Zeros", "config": {}}, "unit_forget_bias": True,
        "kernel_regularizer": None, "recurrent_regularizer": None, "bias_regularizer": None,
        "activity_regularizer": None, "kernel_constraint": None, "recurrent_constraint": None,
        "bias_constraint": None, "dropout": 0.1, "recurrent_dropout": 0.0, "implementation": 2}}
    layers = [
        {"class_name": "InputLayer", "name": "chars", "inbound_nodes": [], "config": {
            "batch_input_shape": [None, 6], "dtype": "int32", "sparse": False, "ragged": False,
            "name": "chars"}},
        {"class_name": "Embedding", "name": "embedding", "inbound_nodes": [[["chars", 0, 0, {}]]],
         "config": {"name": "embedding", "trainable": True, "batch_input_shape": [None, 6],
                    "dtype": "float32", "input_dim": 5, "output_dim": 4,
                    "embeddings_initializer": {"class_name": "RandomUniform", "config": {
                        "minval": -0.05, "maxval": 0.05, "seed": None}},
                    "embeddings_regularizer": None, "activity_regularizer": None,
                    "embeddings_constraint": None, "mask_zero": True, "input_length": None}},
        {"class_name": "Bidirectional", "name": "bidirectional",
         "inbound_nodes": [[["embedding", 0, 0, {}]]],
         "config": {"name": "bidirectional", "trainable": True, "dtype": "float32",
                    "layer": lstm, "merge_mode": "sum"}},
        {"class_name": "Dense", "name": "tags", "inbound_nodes": [[["bidirectional", 0, 0, {}]]],
         "config": {"name": "tags", "trainable": True, "dtype": "float32", "units": 2,
                    "activation": "linear", "use_bias": True,
                    "kernel_initializer": {"class_name": "GlorotUniform", "config": {"seed": None}},
                    "bias_initializer": {"class_name": "Zeros", "config": {}},
                    "kernel_regularizer": None, "bias_regularizer": None,
                    "activity_regularizer": None, "kernel_constraint": None,
                    "bias_constraint": None}}]
    return {"class_name": "Functional", "config": {
        "name": "model", "layers": layers, "input_layers": [["chars", 0, 0]],
        "output_layers": [["tags", 0, 0]]}}


def _bilstm_tagger(recurrent_activation):
    """The Keras 3 tagger `_keras_2_6_bilstm_h5` writes (the same weights on every call)."""
    import keras

    keras.utils.set_random_seed(0)
    chars = keras.Input((6,), dtype="int32", name="chars")
    embedded = keras.layers.Embedding(5, 4, mask_zero=True, name="embedding")(chars)
    lstm = keras.layers.LSTM(3, return_sequences=True, recurrent_activation=recurrent_activation)
    both = keras.layers.Bidirectional(lstm, merge_mode="sum", name="bidirectional")(embedded)
    return keras.Model(chars, keras.layers.Dense(2, name="tags")(both))


def _keras_2_6_bilstm_h5(path, recurrent_activation: str = "sigmoid"):
    """A character tagger built as nakdimon 0.1.2's Nakdimon.h5 is (Embedding with
    mask_zero, a Bidirectional LSTM summed, a Dense head): Keras 3 saves it as HDF5, its
    configuration is then replaced by the one Keras 2.6 writes. Returns the file and the
    Keras 3 model (the reference)."""
    import h5py

    model = _bilstm_tagger(recurrent_activation)
    model.save(path)
    with h5py.File(path, "r+") as handle:
        handle.attrs["model_config"] = json.dumps(_keras_2_6_config(recurrent_activation)).encode()
        handle.attrs["keras_version"] = b"2.6.0"
    return path, model


def test_a_keras_2_6_bidirectional_lstm_h5_imports_as_the_same_model(tmp_path):
    """Keras 3's legacy loader stops on it ("Could not locate class 'LSTM'" inside the
    Bidirectional, then "Unrecognized keyword arguments passed to LSTM: {'time_major': False}"):
    import reads it from its configuration rewritten for Keras 3, and it computes what the
    Keras 3 model it was written from computes (padding included: the mask)."""
    path, model = _keras_2_6_bilstm_h5(tmp_path / "tagger.h5")
    inputs = [InputSpec(name="chars", shape=[1, 6])]
    assert tf_frontend.signature(path, "keras", inputs, None)["inputs"] == ["chars"]
    chars = np.array([[1, 4, 2, 3, 0, 0]], np.int32)
    (got,) = tf_frontend.run_source(path, "keras", {"chars": chars}, inputs, None)
    np.testing.assert_allclose(got, np.asarray(model(chars)), rtol=0, atol=1e-6)


def test_a_keras_2_h5_naming_hard_sigmoid_imports_with_keras_2s_function(tmp_path):
    """Keras 2's hard_sigmoid (clip(0.2·x + 0.5, 0, 1), the default gate of Keras <= 2.2's LSTMs:
    russtress 0.1.4, shakkala 1.7) is not Keras 3's relu6(x + 3) / 6: import was refused
    ("Keras 3 would compute another model"); it now reads the LSTM with Keras 2's function, and
    computes what a Keras 3 LSTM gated by that function computes (ONNX Runtime too)."""
    import keras
    import onnxruntime as ort

    def keras2_gate(x):
        return keras.ops.clip(0.2 * x + 0.5, 0.0, 1.0)

    path, _ = _keras_2_6_bilstm_h5(tmp_path / "tagger.h5", recurrent_activation="hard_sigmoid")
    with keras.saving.custom_object_scope({"keras2_gate": keras2_gate}):  # Bidirectional copies it
        reference = _bilstm_tagger(keras2_gate)
    inputs = [InputSpec(name="chars", shape=[1, 6])]
    chars = np.array([[1, 4, 2, 3, 0, 0]], np.int32)
    (got,) = tf_frontend.run_source(path, "keras", {"chars": chars}, inputs, None)
    want = np.asarray(reference(chars))
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6)
    keras3_gate = _bilstm_tagger("hard_sigmoid")
    assert np.abs(np.asarray(keras3_gate(chars)) - want).max() > 1e-4  # the two functions differ
    converted = tf_frontend.convert(path, "keras", inputs, None)
    session = ort.InferenceSession(converted.SerializeToString(), providers=["CPUExecutionProvider"])
    np.testing.assert_allclose(session.run(None, {"chars": chars})[0], want, rtol=0, atol=1e-5)


def test_a_recurrent_layer_with_dropout_converts_as_the_model_computes_at_inference(tmp_path):
    """Keras 3's TensorFlow LSTM with dropout 0.1 (as Nakdimon.h5's) draws a dropout mask and
    advances its seed generator even at inference: freezing stopped on that variable update
    ("AssignVariableOp was passed int64 ... expected resource"). Import zeroes the rates
    (dropout does nothing at inference), and ONNX Runtime computes what Keras computes."""
    import onnxruntime as ort

    path, model = _keras_2_6_bilstm_h5(tmp_path / "tagger.h5")
    inputs = [InputSpec(name="chars", shape=[1, 6])]
    converted = tf_frontend.convert(path, "keras", inputs, None)
    chars = np.array([[1, 4, 2, 3, 0, 0]], np.int32)
    session = ort.InferenceSession(converted.SerializeToString())
    (got,) = session.run(None, {"chars": chars})
    np.testing.assert_allclose(got, np.asarray(model(chars)), rtol=0, atol=1e-5)


@pytest.mark.parametrize("layers", [[], ["not a layer"], [{"class_name": "Dense", "config": 3}]])
def test_a_sequential_configuration_of_odd_layers_is_left_to_keras_to_judge(layers):
    """The rewrite of a Sequential's configuration (an input layer put first) reads its first
    layer only where it is a layer's mapping: an empty or odd list was an IndexError or an
    AttributeError inside npubuild instead of Keras's own word on the file."""
    from npubuild.frontends.keras_legacy import _sequential_as_dict

    for config in (layers, {"name": "s", "layers": layers}):
        rewritten = _sequential_as_dict({"class_name": "Sequential", "config": config})
        assert rewritten["config"]["layers"] == layers
