"""scripts/make_keras_zoo.py: BatchNorm statistics from photos give every BatchNorm a
normalised output (what a trained network's layers see), layer after layer."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from tests.conftest import REPO


def load_script():
    spec = importlib.util.spec_from_file_location("make_keras_zoo", REPO / "scripts" / "make_keras_zoo.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.slow
def test_batch_norm_statistics_come_from_the_photos_layer_by_layer():
    from npubuild.frontends import tensorflow as tf_frontend

    zoo = load_script()
    tf = tf_frontend._tensorflow()
    keras = tf.keras
    keras.utils.set_random_seed(0)
    image = keras.Input((zoo.SIZE, zoo.SIZE, 3))
    x = image
    for _ in range(3):  # random convs: without statistics the scale drifts layer by layer
        x = keras.layers.BatchNormalization()(keras.layers.Conv2D(8, 3, padding="same")(x))
    model = keras.Model(image, x)
    photos = zoo.photos(1 / 127.5, -1.0)
    assert photos.shape == (len(zoo.CALIBRATION_PHOTOS), zoo.SIZE, zoo.SIZE, 3)
    assert -1.0 <= photos.min() < 0 < photos.max() <= 1.0

    zoo.calibrate_batch_norms(tf, model, photos)
    for layer in model.layers:
        if isinstance(layer, keras.layers.BatchNormalization):
            seen = keras.Model(model.inputs, layer.input)(photos, training=False).numpy()
            np.testing.assert_allclose(layer.moving_mean.numpy(), seen.mean(axis=(0, 1, 2)),
                                       rtol=1e-4, atol=1e-5)
            np.testing.assert_allclose(layer.moving_variance.numpy(), seen.var(axis=(0, 1, 2)),
                                       rtol=1e-4)
            out = keras.Model(model.inputs, layer.output)(photos, training=False).numpy()
            np.testing.assert_allclose(out.mean(axis=(0, 1, 2)), 0, atol=1e-3)
            # unit scale up to BatchNorm's epsilon (1e-3), which shrinks low-variance channels
            assert 0.9 < out.std(axis=(0, 1, 2)).min() and out.std(axis=(0, 1, 2)).max() <= 1.0
