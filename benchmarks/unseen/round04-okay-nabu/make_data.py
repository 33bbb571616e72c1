#!/usr/bin/env python3
"""Data for microWakeWord "okay nabu" (the fourth round of unseen models, again: README.md here).

Writes, under ``benchmarks/unseen/round04-okay-nabu/data/`` (git-ignored) or the folder given,
six calibration and six verify clips, each one ``.npy`` file of the model's audio input alone,
as pymicro-wakeword 2.5.0 feeds ``okay_nabu.tflite``: 16 kHz 16-bit audio through
``MicroWakeWordFeatures`` (pymicro-features' TFLite Micro front end, 40 features per 10 ms),
three feature frames per call (the model's stride), quantized to int8 as
``MicroWakeWord.process_streaming_prob`` quantizes them (``round(f / scale + zero_point)``).
A file is one clip: a stack ``[calls, 3, 40]`` of the calls in order, so npubuild steps the
model's states over it as the package's interpreter keeps them (the top README: "Data for a
streaming model").
The states are not in the data: a user feeds the audio alone.

Clips (1.6 s): "okay nabu" in four espeak-ng voices that wake openWakeWord's okay_nabu
(`make_zoo_models.OKAY_NABU`) over a little noise, and other speech, music and loud noise
(`make_zoo_models.background`); calibration and verify differ in voice speed and noise seed.

Run: ``PYTHONPATH=<repo>:<site> python3 benchmarks/unseen/round04-okay-nabu/make_data.py`` with
``pip install --no-deps --target <site> pymicro-wakeword==2.5.0 'pymicro-features>=2,<3'``
(pymicro-features is a compiled wheel); it needs espeak-ng, scipy and TensorFlow. The data are
byte-identical from run to run.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import make_zoo_models as zoo  # noqa: E402  (espeak-ng, backgrounds, the npy writer)

OUT = Path(__file__).resolve().parent / "data"
RATE, SECONDS, STRIDE = 16000, 1.6, 3
CLIPS = 6  # per set: four wake words, then speech or music, then loud noise


def clip(i: int, seed: int, speed: int) -> np.ndarray:
    """Clip ``i`` of a set as 16-bit samples: "okay nabu" in voice ``i`` (clips 0-3) or other
    speech over music (clip 4) over `zoo.background`'s little noise, or its loud noise (clip 5)."""
    rng = np.random.default_rng(seed + i)
    length = int(RATE * SECONDS)
    audio, _ = zoo.background(i, rng, length, RATE, seed)
    if i < 5:
        voice, _, pitch, text = zoo.OKAY_NABU[i] if i < 4 else zoo.UTTERANCES[seed % 2]
        words = 0.6 * zoo.espeak(voice, speed, pitch, text, RATE)[:length - RATE // 5]
        audio[RATE // 5:RATE // 5 + len(words)] += words
    return np.round(np.clip(audio, -1, 1) * 32767).astype(np.int16)


def features(audio: np.ndarray, scale: float, zero_point: int) -> np.ndarray:
    """The model's input on every call over ``audio``, [calls, 3, 40] int8, as
    pymicro-wakeword computes and quantizes it."""
    from pymicro_wakeword import MicroWakeWordFeatures

    frames = np.concatenate(list(MicroWakeWordFeatures().process_streaming(audio.tobytes())),
                            axis=1)[0]  # [frames, 40]
    calls = len(frames) // STRIDE
    stacked = frames[:calls * STRIDE].reshape(calls, STRIDE, frames.shape[1])
    return np.round(stacked / scale + zero_point).astype(np.int8)


def input_quantization(model: Path) -> tuple[float, int]:
    """The model's input scale and zero point, which the package reads from the model too."""
    import tensorflow as tf

    [detail] = tf.lite.Interpreter(model_path=str(model)).get_input_details()
    scale, zero_point = detail["quantization"]
    return float(scale), int(zero_point)


def main(out: Path = OUT) -> Path:
    import pymicro_wakeword

    model = Path(pymicro_wakeword.__file__).parent / "models" / "okay_nabu.tflite"
    scale, zero_point = input_quantization(model)
    out.mkdir(parents=True, exist_ok=True)
    for name, seed, speed in (("cal", 400, 150), ("ver", 411, 170)):
        for i in range(CLIPS):
            zoo._write_npy(out / f"{name}_{i:02d}.npy",
                           features(clip(i, seed, speed), scale, zero_point))
    return out


if __name__ == "__main__":
    print(main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT))
