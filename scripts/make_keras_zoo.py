"""Build the Keras part of the zoo: EfficientNetB0, MobileNetV3Small, ResNet50, DenseNet121 and
MobileNetV2
(Keras applications, 96×96, random weights: no download) with BatchNorm statistics measured on
photos, saved in every TensorFlow format npubuild imports, for recipes/zoo/keras/.

    python3 scripts/make_keras_zoo.py [OUT_DIR] [MODEL ...]   # default: models/keras_zoo/, all

A random-weight network's activations shrink or blow up layer after layer; a trained one keeps
them near unit scale because each BatchNormalization's moving mean and variance are its input's
statistics. So every BatchNorm's statistics are set from calibration photos (skimage's), layer by
layer in graph order, each measured with the layers before it already set: what training gives.

Per model ``<name>`` it writes ``<name>.keras``, ``<name>_saved_model/``, ``<name>_frozen.pb``
(input ``input:0``, output ``Identity:0``), ``<name>_float.tflite``, ``<name>_fp16.tflite``
(float16 weights) and ``<name>_int8.tflite`` (every op int8, float input and output, the
representative dataset drawn from the same photos). Outputs are logits (no softmax). A fixed
seed makes every run write the same weights.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
DEFAULT_OUT = REPO / "models" / "keras_zoo"
SIZE = 96
# name -> (keras.applications class, input scale, input offset): the preprocessing each
# architecture expects, which the recipes' `preprocess` repeats. EfficientNet and MobileNetV3
# rescale inside the model (they take 0..255); ResNet50 and DenseNet121 take roughly -1..1 here.
MODELS = {
    "efficientnetb0": ("EfficientNetB0", 1.0, 0.0),
    "mobilenetv3small": ("MobileNetV3Small", 1.0, 0.0),
    "resnet50": ("ResNet50", 1 / 127.5, -1.0),
    "densenet121": ("DenseNet121", 1 / 127.5, -1.0),
    "mobilenetv2": ("MobileNetV2", 1 / 127.5, -1.0),  # recipes/real/ (issue 22's classifier)
}
CALIBRATION_PHOTOS = ["chelsea.png", "coffee.png", "astronaut.png", "rocket.jpg",
                      "motorcycle_left.png", "retina.jpg", "hubble_deep_field.jpg", "ihc.png"]


def photos(scale: float, offset: float) -> np.ndarray:
    """skimage's photos as a float32 NHWC batch at SIZE×SIZE, preprocessed as the model expects."""
    from PIL import Image
    import skimage

    data = Path(skimage.__file__).parent / "data"
    batch = [np.asarray(Image.open(data / name).convert("RGB").resize((SIZE, SIZE),
                                                                      Image.BILINEAR))
             for name in CALIBRATION_PHOTOS]
    return (np.stack(batch).astype(np.float32) * scale + offset).astype(np.float32)


def build(tf, name: str, seed: int = 0):
    """The Keras application with random weights and BatchNorm statistics from the photos."""
    cls, scale, offset = MODELS[name]
    tf.keras.backend.clear_session()  # layer and tensor names restart: the same in every run
    tf.keras.utils.set_random_seed(seed)
    model = getattr(tf.keras.applications, cls)(input_shape=(SIZE, SIZE, 3), weights=None,
                                                classifier_activation=None)
    calibrate_batch_norms(tf, model, photos(scale, offset))
    return model


def calibrate_batch_norms(tf, model, images: np.ndarray) -> None:
    """Set each BatchNormalization's moving mean and variance to its input's statistics on
    `images`, in graph order (later layers see the earlier ones already set)."""
    for layer in model.layers:
        if not isinstance(layer, tf.keras.layers.BatchNormalization):
            continue
        probe = tf.keras.Model(model.inputs, layer.input)
        x = probe(images, training=False).numpy()
        axes = tuple(i for i in range(x.ndim) if i != layer.axis % x.ndim)
        layer.moving_mean.assign(x.mean(axis=axes))
        layer.moving_variance.assign(x.var(axis=axes))


def export_all(tf, model, name: str, out: Path, images: np.ndarray) -> list[Path]:
    """Write the model in every format; return the paths."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    paths = [out / f"{name}.keras", out / f"{name}_saved_model", out / f"{name}_frozen.pb"]
    model.save(paths[0])
    model.export(str(paths[1]), verbose=False)
    spec = tf.TensorSpec([1, SIZE, SIZE, 3], tf.float32, name="input")
    concrete = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec)
    frozen = convert_variables_to_constants_v2(concrete)
    paths[2].write_bytes(frozen.graph.as_graph_def().SerializeToString())
    for kind in ("float", "fp16", "int8"):
        path = out / f"{name}_{kind}.tflite"
        path.write_bytes(tflite(tf, model, kind, images))
        paths.append(path)
    return paths


def tflite(tf, model, kind: str, images: np.ndarray) -> bytes:
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    if kind == "fp16":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.target_spec.supported_types = [tf.float16]
    elif kind == "int8":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([image[None]] for image in images)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    return converter.convert()


def main(argv: list[str]) -> Path:
    out = Path(argv[0]) if argv else DEFAULT_OUT
    names = argv[1:] or list(MODELS)
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    out.mkdir(parents=True, exist_ok=True)
    for name in names:
        _, scale, offset = MODELS[name]
        model = build(tf, name)
        for path in export_all(tf, model, name, out, photos(scale, offset)):
            print(path)
    return out


if __name__ == "__main__":
    main(sys.argv[1:])
