"""Build Keras MobileNetV2 (224×224, random weights: no download) and save it as a frozen
TensorFlow graph for recipes/mobilenetv2-tf.yaml.

    python3 scripts/make_mobilenetv2.py [OUT.pb]     # default: models/mobilenetv2_frozen.pb

The graph's input is ``input:0`` [1, 224, 224, 3] (NHWC) and its output ``Identity:0`` [1, 1000] (logits).
Weights come from a fixed seed, so every run writes the same model.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "models" / "mobilenetv2_frozen.pb"


def build_frozen_graph(seed: int = 0) -> bytes:
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    tf.keras.utils.set_random_seed(seed)
    # Logits, not softmax: with random weights a softmax is nearly uniform and hides errors.
    model = tf.keras.applications.MobileNetV2(input_shape=(224, 224, 3), weights=None,
                                              classifier_activation=None)
    spec = tf.TensorSpec([1, 224, 224, 3], tf.float32, name="input")
    concrete = tf.function(lambda x: model(x, training=False)).get_concrete_function(spec)
    frozen = convert_variables_to_constants_v2(concrete)
    return frozen.graph.as_graph_def().SerializeToString()


def main(argv: list[str]) -> Path:
    out = Path(argv[0]) if argv else DEFAULT_OUT
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".pb.tmp")
    tmp.write_bytes(build_frozen_graph())
    tmp.replace(out)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1:]))
