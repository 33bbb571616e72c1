#!/usr/bin/env python3
"""Data for the seventeenth round of models npubuild had never seen (README: "A seventeenth round").

Writes, under ``benchmarks/unseen/round17/data/`` (git-ignored) or the folder given, 12 samples
per set (the recipes calibrate on the first six and verify on the last six), each through its
package's own front end. The two models are Silicon Labs MLTK's (silabs-mltk 0.20.0), shipped
as plain ``.tflite`` files in ``mltk/utils/test_helper/data/``, full-integer (int8) exports for
microcontrollers, their front-end settings in the file's own ``SL_PARAMSv1`` metadata:

- ``speech_*.npz``: ``tflite_micro_speech.tflite`` (TFLM's micro speech: yes / no / unknown /
  silence): ``input_1_int8`` [1, 49, 40, 1] int8, one second of 16 kHz audio through MLTK's own
  ``AudioFeatureGenerator`` (its C++ microfrontend: 30 ms windows every 20 ms, 40 channels,
  noise reduction, PCAN, log scale) with the settings the model carries (``fe.*``), its int8
  output (``process_sample(..., dtype=np.int8)``, what TFLM's micro_features feeds the model).
  Clip ``i``: a word spoken by espeak-ng (yes, no, and other words; two clips silence) centred in
  the second, over a little noise (music under every sixth, louder noise under the next).
- ``cifar_*.npz``: ``image_classification.tflite`` (MLPerf Tiny's ResNet-8 for CIFAR-10):
  ``input_1_int8`` [1, 32, 32, 3] int8: a photo of scikit-image's (a square crop) shrunk to
  32 x 32 RGB, its pixels 0..255 through the input's own quantization (scale 1, zero point
  -128: ``pixel - 128``), as MLTK's evaluation quantizes CIFAR's raw pixels.

The wheel's third such model, ``anomaly_detection.tflite`` (MLPerf Tiny's ToyADMOS autoencoder),
is not used: its front end is not in the wheel (MLTK trains and evaluates it on preprocessed
features it downloads; its input's quantization, 0..237, matches no log-mel of ours).

Run: ``PYTHONPATH=<repo>:<site> python3 benchmarks/unseen/round17/make_data.py`` with the wheel
installed (``pip install --no-deps --target <site> silabs-mltk==0.20.0``: a cp311 wheel, its
microfrontend a compiled extension; MLTK's ``mltk.core`` imports scikit-learn, matplotlib and
more, so the two modules used here are imported without running its package ``__init__``s). It
needs TensorFlow (the flatbuffer schema), scipy, Pillow, scikit-image and Debian's espeak-ng.
The data are byte-identical from run to run.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import make_zoo_models as zoo  # noqa: E402  (espeak, the background, the sets' writer)
from npubuild.recipe.paths import package_dir  # noqa: E402  (finds a package without importing it)

OUT = Path(__file__).resolve().parent / "data"
SAMPLES = 12
RATE = 16000
# The 2021 model names its front-end settings as MLTK then did; today's AudioFeatureGeneratorSettings
# spells some of them differently (fe.n_channels is fe.filterbank_n_channels).
RENAMED = {"n_channels": "filterbank_n_channels", "upper_band_limit": "filterbank_upper_band_limit",
           "lower_band_limit": "filterbank_lower_band_limit",
           "enable_noise_reduction": "noise_reduction_enable",
           "smoothing_bits": "noise_reduction_smoothing_bits",
           "even_smoothing": "noise_reduction_even_smoothing",
           "odd_smoothing": "noise_reduction_odd_smoothing",
           "min_signal_remaining": "noise_reduction_min_signal_remaining",
           "enable_pcan": "pcan_enable", "gain_bits": "pcan_gain_bits",
           "enable_log": "log_scale_enable", "scale_shift": "log_scale_shift"}
# (voice, word): yes, no and other words, the way the model's four classes split them.
WORDS = [("en", "yes"), ("en-us", "no"), ("en", "seven"), ("en-gb", "no"), ("en-us", "yes"),
         ("en", ""), ("en-us", "house"), ("en", "no"), ("en-gb", "yes"), ("en", "left"),
         ("en-us", ""), ("en-gb", "down")]
MICRO_SPEECH_MODEL = "utils/test_helper/data/tflite_micro_speech.tflite"
ON_OFF_MODEL = "models/siliconlabs/keyword_spotting_on_off_v3.mltk.zip/keyword_spotting_on_off_v3.tflite"
ON_OFF = [("en", "on"), ("en-us", "off"), ("en", "open"), ("en-gb", "off"), ("en-us", "on"),
          ("en", ""), ("en-us", "of"), ("en", "off"), ("en-gb", "on"), ("en", "one"),
          ("en-us", ""), ("en-gb", "often")]
PHOTOS = [("chelsea.png", 0.9), ("coffee.png", 1.0), ("astronaut.png", 1.0), ("rocket.jpg", 1.0),
          ("motorcycle_left.png", 1.0), ("hubble_deep_field.jpg", 1.0), ("retina.jpg", 1.0),
          ("ihc.png", 1.0), ("color.png", 1.0), ("motorcycle_right.png", 0.8),
          ("chelsea.png", 0.5), ("astronaut.png", 0.45)]


def mltk_root() -> Path:
    return package_dir("mltk")  # looked up once: before `mltk_modules` registers it bare


def mltk_modules():
    """MLTK's flatbuffer dictionary (its model parameters' format) and its AudioFeatureGenerator,
    imported with its packages registered bare: ``mltk/core/__init__.py`` would import training
    code (scikit-learn, matplotlib, typer) that these two never use."""
    root = mltk_root()
    for name in ("mltk", "mltk.core", "mltk.core.preprocess", "mltk.core.preprocess.audio",
                 "mltk.core.tflite_model_parameters"):
        if name not in sys.modules:
            module = types.ModuleType(name)
            module.__path__ = [str(root.joinpath(*name.split(".")[1:]))]
            sys.modules[name] = module
    from mltk.core.preprocess.audio.audio_feature_generator import (
        AudioFeatureGenerator, AudioFeatureGeneratorSettings)
    from mltk.core.tflite_model_parameters.flatbuffer_dictionary import FlatbufferDictionary
    return FlatbufferDictionary, AudioFeatureGenerator, AudioFeatureGeneratorSettings


def model_bytes(name: str) -> bytes:
    """A model file of the wheel's, by its path under ``mltk/``; a path through a ``.zip`` names
    a member of that archive (MLTK's model zoo ships each model as a ``.mltk.zip``)."""
    import zipfile
    archive, found, member = name.partition(".zip/")
    if found:
        with zipfile.ZipFile(mltk_root() / (archive + ".zip")) as z:
            return z.read(member)
    return (mltk_root() / name).read_bytes()


def model_parameters(name: str) -> dict:
    """The parameters MLTK stored in the model's ``SL_PARAMSv1`` metadata."""
    from tensorflow.lite.python import schema_py_generated as schema
    dictionary, _, _ = mltk_modules()
    data = model_bytes(name)
    model = schema.ModelT.InitFromObj(schema.Model.GetRootAs(data, 0))
    for entry in model.metadata or []:
        if entry.name.decode() == "SL_PARAMSv1":
            return dict(dictionary.deserialize(bytes(model.buffers[entry.buffer].data)))
    raise SystemExit(f"{name} has no SL_PARAMSv1 metadata")


def speech_clip(i: int, words: list, seed: int) -> np.ndarray:
    rng = np.random.default_rng(seed + i)
    audio, _ = zoo.background(i, rng, RATE, RATE, seed + i)
    voice, word = words[i]
    if word:
        spoken = zoo.espeak(voice, 140 + 5 * i, 40 + 3 * i, word, RATE)[:RATE]
        start = (RATE - len(spoken)) // 2
        audio[start:start + len(spoken)] += 0.8 * spoken / max(1e-9, np.abs(spoken).max())
    return np.clip(audio, -1, 1)


def spoken_inputs(model: str, words: list, name: str, shape: tuple, seed: int) -> list[dict]:
    """Each clip through MLTK's AudioFeatureGenerator with the settings ``model`` carries."""
    _, generator, settings_type = mltk_modules()
    settings = settings_type()
    for key, value in model_parameters(model).items():
        if key.startswith("fe.") and key != "fe.fft_length":  # derived from the window
            setattr(settings, RENAMED.get(key[3:], key[3:]), value)
    samples = []
    for i in range(SAMPLES):
        pcm = (speech_clip(i, words, seed) * 32767).astype(np.int16)  # as apply_frontend does
        features = generator(settings).process_sample(pcm, dtype=np.int8)
        samples.append({name: features.reshape(shape)})
    return samples


def cifar_inputs() -> list[dict]:
    from PIL import Image
    folder = package_dir("skimage") / "data"
    samples = []
    for name, fraction in PHOTOS:
        image = Image.open(folder / name).convert("RGB")
        side = int(min(image.size) * fraction)
        left, top = (image.width - side) // 2, (image.height - side) // 2
        small = image.crop((left, top, left + side, top + side)).resize((32, 32), Image.BILINEAR)
        pixels = np.asarray(small, np.int16)
        samples.append({"input_1_int8": (pixels - 128).astype(np.int8)[None]})
    return samples


def main(argv: list[str]) -> Path:
    return zoo.write_sample_sets(Path(argv[0]) if argv else OUT, {
        "speech": spoken_inputs(MICRO_SPEECH_MODEL, WORDS, "input_1_int8", (1, 49, 40, 1), 1700),
        "cifar": cifar_inputs(),
        "onoff": spoken_inputs(ON_OFF_MODEL, ON_OFF, "serving_default_input_1:0", (1, 98, 1, 104),
                               1720)})


if __name__ == "__main__":
    print(main(sys.argv[1:]))
