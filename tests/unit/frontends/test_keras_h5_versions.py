"""An HDF5 model written by Keras 2.1 (shakkala 1.7's diacritizer): Keras 3's loader for legacy
HDF5 files stops inside itself (a Sequential's configuration is a list there: "pop expected at
most 1 argument, got 2"), so import names the Keras that wrote the file and what to do, instead
of "check that model.path is a Keras model"."""

from __future__ import annotations

import json

import numpy as np
import pytest

from npubuild.errors import UserError
from npubuild.frontends import tensorflow as tf_frontend
from npubuild.recipe.model import InputSpec

pytestmark = pytest.mark.slow


def _keras_2_1_h5(path, version: str = "2.1.6"):
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
        "kernel_constraint": None, "bias_constraint": None}}
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


def test_a_keras_2_1_h5_names_the_keras_that_wrote_it(tmp_path):
    path = _keras_2_1_h5(tmp_path / "model.h5")
    inputs = [InputSpec(name="x", shape=[1, 4])]
    with pytest.raises(UserError) as caught:
        tf_frontend.signature(path, "keras", inputs, None)
    assert "written by Keras 2.1.6, with Keras 3." in caught.value.message
    assert "load it with Keras 2.1.6" in caught.value.hint


def test_an_unreadable_h5_naming_no_older_keras_keeps_the_plain_message(tmp_path):
    path = _keras_2_1_h5(tmp_path / "model.h5", version="")
    with pytest.raises(UserError, match="cannot read a Keras model"):
        tf_frontend.signature(path, "keras", [InputSpec(name="x", shape=[1, 4])], None)
