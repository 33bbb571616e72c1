#!/usr/bin/env python3
"""Data for the sixth round's Shakkala diacritizer (`shakkala.yaml` beside this file).

Writes, under ``benchmarks/unseen/round6-ppocr-v2/data/`` (git-ignored) or the folder given,
twelve undiacritized Arabic sentences as ``shakkala==1.7``'s ``Shakkala.prepare_input`` feeds
its model: each character's id from the package's own table
(``dictionary/input_vocab_to_int.pickle``, ``<UNK>`` for a character outside it), zero-padded
after the sentence to its 315 places (``pad_sequences(..., padding='post')``): ``shakkala_cal_*``
(the first six) calibrate, ``shakkala_ver_*`` (the last six) verify. The package's own call
needs Keras 2's ``pad_sequences``, so the padding is written here as it does it.

Run: ``PYTHONPATH=<repo>:<site> python3 benchmarks/unseen/round6-ppocr-v2/make_shakkala_data.py``
with the wheel installed (``pip install --no-deps --target <site> shakkala==1.7``). The data are
byte-identical from run to run.
"""
from __future__ import annotations

import pickle
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
sys.path.insert(0, str(ROOT))
import make_zoo_models as zoo  # noqa: E402  (the npz writer)

from npubuild.recipe.paths import package_dir  # noqa: E402

OUT = Path(__file__).resolve().parent / "data"
PLACES = 315  # Shakkala(version=3).max_sentence
SENTENCES = ["ذهب الولد الى المدرسة صباحا", "كتب الطالب الدرس في الدفتر", "العلم نور والجهل ظلام",
             "يحب الناس السفر في الصيف", "قرأت كتابا جميلا عن التاريخ", "السماء صافية والشمس مشرقة",
             "الكتاب خير جليس في الزمان", "سافر الرجل الى المدينة الكبيرة",
             "شربت الماء البارد بعد الظهر", "تعلم اللغة العربية ممتع جدا", "جلس الاطفال حول المائدة",
             "كان الجو جميلا في الحديقة"]


def ids(sentence: str, table: dict) -> np.ndarray:
    """``prepare_input``: the characters' ids, zero-padded after them to `PLACES`."""
    row = np.zeros((1, PLACES), np.int32)
    chars = [table.get(ch, table["<UNK>"]) for ch in sentence]
    row[0, :len(chars)] = chars
    return row


def main(out: Path = OUT) -> None:
    with open(package_dir("shakkala") / "dictionary" / "input_vocab_to_int.pickle", "rb") as f:
        table = pickle.load(f)
    samples = [{"embedding_7_input": ids(s, table)} for s in SENTENCES]
    zoo.write_sample_sets(out, {"shakkala_cal": samples[:6], "shakkala_ver": samples[6:]})


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else OUT)
