#!/usr/bin/env python3
"""Data for the nineteenth round of models npubuild had never seen (README: "A nineteenth round").

Writes, under ``benchmarks/unseen/round19/data/`` (git-ignored) or the folder given, 12 samples
per set (the recipes calibrate on the first six and verify on the last six), each through its
package's own front end:

- ``rxn_*.npz``: chython-rxnmap 2.0's atom-to-atom mapping transformer (``rxnmap.onnx``: two
  encoder layers applied eight times each over a reaction's atoms, a graph-distance bias,
  int64 inputs of a dynamic length): ``atoms``, ``neighbors``, ``roles`` [1, 48] and ``distances`` [1, 48, 48], a
  reaction's SMILES parsed by chython 3.4 and encoded by its own ``encode_reaction`` (one row of
  tokens: a reaction token, then each molecule's token and atoms), then padded to 48 tokens with
  the encoding's padding value, 0, except each padding token's distance to itself, 1 (as the
  reaction token's): the model masks distance 0, and a row masked whole is NaN through its softmax,
  which then reaches every token. So padded, its attention over the real tokens is the unpadded
  run's exactly (ONNX Runtime, all twelve). The package runs one reaction at its own length; a
  fixed-shape NPU needs one length.
- ``skin_*.npz``: sklesion 0.2.2's skin-lesion classifier (``model.keras``): ``input_layer_2``
  [1, 254, 254, 3], a dermoscopy-like picture (skin, a pigmented lesion of irregular border, hairs,
  the scope's dark corners; no patient image ships in a wheel) JPEG-encoded and put through
  ``SkinLesionClassifier.preprocess`` (TensorFlow's JPEG decoder, ``tf.image.resize`` to 254,
  0..255), and ``input_layer_3`` [1, 10], its metadata (age, sex, body site) through the same
  front end (one-hot sex and site from the package's ``model_props.pkl``, age / 90, a missing
  flag); recorded from the ``tf.data.Dataset`` it returns.
- ``iso_check_*.npz`` and ``iso_clean_*.npz``: ai-isometric-extractor 0.1.2's two Keras U-Nets
  (``anomaly.keras``, ``my_model_keras.keras``): an isometric line drawing (boxes, steps and
  cylinders with hidden lines, dimension lines and text; a different part per sample) through
  the package's own ``run_inference``: the crop resized to 224 x 224 by OpenCV, grey, fed raw
  (0..255) to the anomaly check and divided by 255 to the cleaner; recorded from the models'
  ``predict``, as [1, 224, 224, 1]. Its YOLO detector is a PyTorch checkpoint (``best.pt``; no
  PyTorch here), so the detection it would make is given: the drawing's bounding box with a
  margin.

Run: ``PYTHONPATH=<repo>:<site> python3 benchmarks/unseen/round19/make_data.py`` with the wheels
installed (``pip install --no-deps --target <site> chython==3.4 chython-rxnmap==2.0 quickjs-ng
sklesion==0.2.2 ai-isometric-extractor==0.1.2 pandas``; chython is a source distribution that
compiles a Cython extension). It needs TensorFlow with Keras 3, OpenCV and onnxruntime. The data
are byte-identical from run to run.
"""
from __future__ import annotations

import sys
import tempfile
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import make_zoo_models as zoo  # noqa: E402  (the npz writer)
from npubuild.recipe.paths import package_dir  # noqa: E402  (finds a package without importing it)

OUT = Path(__file__).resolve().parent / "data"
SAMPLES = 12
TOKENS = 48  # the padded length of a reaction's token row (the longest reaction here: 39)

# Twelve reactions of textbook organic chemistry (reactants >> products, no agents).
REACTIONS = [
    "CC(=O)O.OCC>>CC(=O)OCC.O",                                   # Fischer esterification
    "OC(=O)C(=C)C=C.C=CC#N>>OC(=O)C1=CCCC(C1)C#N",                 # Diels-Alder (chython's README)
    "CC(=O)Cl.Nc1ccccc1>>CC(=O)Nc1ccccc1.Cl",                      # acylation of aniline
    "Brc1ccccc1.OB(O)c1ccc(C)cc1>>Cc1ccc(cc1)-c1ccccc1.OB(O)Br",   # Suzuki coupling
    "CC=O.CC[Mg]Br>>CCC(C)O[Mg]Br",                                 # Grignard addition
    "c1ccccc1.ClC(=O)CC>>CCC(=O)c1ccccc1.Cl",                      # Friedel-Crafts acylation
    "CCBr.[OH-]>>CCO.[Br-]",                                       # SN2 hydrolysis
    "CC(C)(C)OC(=O)NCC(=O)O>>NCC(=O)O.CC(C)=C.O=C=O",              # Boc removal
    "O=Cc1ccccc1.CC(=O)C>>O=C(C)C=Cc1ccccc1.O",                    # aldol condensation
    "CC(=O)OC(C)=O.Oc1ccccc1C(=O)O>>CC(=O)Oc1ccccc1C(=O)O.CC(=O)O",  # aspirin
    "C=CC(=O)OC.NCc1ccccc1>>COC(=O)CCNCc1ccccc1",                  # aza-Michael addition
    "OCc1ccc(Cl)cc1.O=S(Cl)Cl>>ClCc1ccc(Cl)cc1.O=S=O.Cl",          # chlorination with SOCl2
]


def reaction_inputs() -> list[dict]:
    """Each reaction through chython's own encoder, padded to TOKENS: zeros, the encoding's
    padding value, but each padding token's distance to itself 1 (the reaction token's self-loop),
    so that its attention row is not all masked (an all-zero row is NaN through the softmax, and the
    NaN reaches every token in the next layer)."""
    from chython import smiles
    from chython.reactions.attention._encode import encode_reaction

    samples = []
    for text in REACTIONS:
        reaction = smiles(text)
        encoded = encode_reaction(reaction.reactants, reaction.products)
        n = encoded.atoms.shape[0]
        assert n <= TOKENS, (text, n)
        sample = {}
        for name in ("atoms", "neighbors", "roles"):
            row = np.zeros((1, TOKENS), np.int64)
            row[0, :n] = getattr(encoded, name)
            sample[name] = row
        distances = np.zeros((1, TOKENS, TOKENS), np.int64)
        distances[0, :n, :n] = encoded.distances
        distances[0, np.arange(n, TOKENS), np.arange(n, TOKENS)] = 1  # each padding token: a self-loop
        sample["distances"] = distances
        samples.append(sample)
    return samples


def skin_picture(i: int) -> np.ndarray:
    """A dermoscopy-like picture, 450 x 600 BGR: skin, a pigmented lesion of irregular border and
    uneven colour, a few hairs and the scope's dark corners; colour, size and place per sample."""
    import cv2

    rng = np.random.default_rng(1900 + i)
    h, w = 450, 600
    yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
    skin = np.array([150.0, 170.0, 215.0]) * rng.uniform(0.8, 1.05, 3)       # BGR, pinkish beige
    image = skin * (1.0 - 0.15 * (yy / h))[..., None] + rng.normal(0, 4, (h, w, 3))
    cy, cx = h / 2 + rng.uniform(-40, 40), w / 2 + rng.uniform(-60, 60)
    angle = np.arctan2(yy - cy, xx - cx)
    radius = rng.uniform(70, 150) * (1 + sum(rng.uniform(0.02, 0.12) * np.sin(k * angle + rng.uniform(0, 6))
                                            for k in (2, 3, 5, 7)))
    r = np.hypot(yy - cy, xx - cx) / radius
    lesion = np.array([[40.0, 60.0, 110.0], [25.0, 30.0, 60.0], [70.0, 70.0, 170.0],
                       [90.0, 110.0, 160.0]])[i % 4] * rng.uniform(0.8, 1.2, 3)
    weight = np.clip(1.3 - r, 0, 1)[..., None] ** 0.7
    blotch = 1 + 0.25 * np.sin(xx / rng.uniform(9, 25)) * np.cos(yy / rng.uniform(9, 25))
    image = image * (1 - weight) + (lesion * blotch[..., None]) * weight
    image = np.clip(image, 0, 255).astype(np.uint8)
    for _ in range(rng.integers(0, 6)):                                     # hairs
        p = rng.uniform([0, 0], [w, h], (2, 2)).astype(np.int32)
        cv2.line(image, tuple(int(v) for v in p[0]), tuple(int(v) for v in p[1]), (30, 30, 40),
                 int(rng.integers(1, 3)))
    corners = np.clip(1.6 - np.hypot((yy - h / 2) / (h / 2), (xx - w / 2) / (w / 2)), 0, 1)
    return (image * corners[..., None]).astype(np.uint8)


def skin_inputs() -> list[dict]:
    """Each picture, JPEG-encoded, and its metadata through SkinLesionClassifier.preprocess."""
    import cv2
    from sklesion.model import SkinLesionClassifier

    classifier = SkinLesionClassifier()
    sexes, sites = ["female", "male", "unknown"], ["arm", "head-or-neck", "leg-or-genital", "trunk", "unknown"]
    samples = []
    for i in range(SAMPLES):
        ok, jpeg = cv2.imencode(".jpg", skin_picture(i), [cv2.IMWRITE_JPEG_QUALITY, 92])
        assert ok
        meta = {"age": float(20 + 5 * ((7 * i) % 14)), "sex": sexes[i % 3], "location": sites[i % 5]}
        (image, features), = next(iter(classifier.preprocess({"image": jpeg.tobytes(), "meta": meta})))
        samples.append({"input_layer_2": np.asarray(image, np.float32),
                        "input_layer_3": np.asarray(features, np.float32)})
    return samples


def iso_drawing(i: int) -> np.ndarray:
    """An isometric line drawing, 360 x 480 BGR on white: a box, steps or a cylinder, hidden
    lines dashed, a dimension line and a label; part, size and place per sample."""
    import cv2

    rng = np.random.default_rng(1950 + i)
    image = np.full((360, 480, 3), 255, np.uint8)
    origin = np.array([240.0, 200.0]) + rng.uniform(-40, 40, 2)
    ax = np.array([[np.cos(np.pi / 6), np.sin(np.pi / 6)], [-np.cos(np.pi / 6), np.sin(np.pi / 6)],
                   [0.0, -1.0]])                                          # x, y, z on the page
    thick = int(rng.integers(1, 3))

    def page(p):
        return tuple(int(round(v)) for v in origin + np.asarray(p, float) @ ax)

    def box(lo, hi):
        corners = [np.array([x, y, z]) for x in (lo[0], hi[0]) for y in (lo[1], hi[1]) for z in (lo[2], hi[2])]
        for a in range(8):
            for b in range(a + 1, 8):
                if np.count_nonzero(corners[a] != corners[b]) == 1:
                    hidden = any((c == np.asarray(lo)).all() for c in (corners[a], corners[b]))
                    colour = (150, 150, 150) if hidden else (0, 0, 0)
                    cv2.line(image, page(corners[a]), page(corners[b]), colour, thick, cv2.LINE_AA)

    size = rng.uniform(50, 110, 3)
    kind = i % 3
    if kind == 0:
        box(-size / 2, size / 2)
    elif kind == 1:
        box(-size / 2, size / 2 * np.array([1, 1, 0]))
        box(-size / 2 * np.array([1, 1, 1]) + np.array([0, 0, size[2] / 2]),
            np.array([0, size[1] / 2, size[2] / 2]))
    else:
        radius, height = size[0] / 2, size[2]
        for z in (-height / 2, height / 2):
            ring = [page([radius * np.cos(t), radius * np.sin(t), z]) for t in np.linspace(0, 2 * np.pi, 48)]
            cv2.polylines(image, [np.array(ring, np.int32)], True, (0, 0, 0), thick, cv2.LINE_AA)
        for t in (-np.pi / 4, 3 * np.pi / 4):                             # the silhouette
            cv2.line(image, page([radius * np.cos(t), radius * np.sin(t), -height / 2]),
                     page([radius * np.cos(t), radius * np.sin(t), height / 2]), (0, 0, 0), thick, cv2.LINE_AA)
    y = int(origin[1] + 120)
    cv2.line(image, (int(origin[0] - 60), y), (int(origin[0] + 60), y), (0, 0, 0), 1, cv2.LINE_AA)
    cv2.putText(image, f"{int(size[0])} mm", (int(origin[0] - 25), y - 6), cv2.FONT_HERSHEY_SIMPLEX,
                0.45, (0, 0, 0), 1, cv2.LINE_AA)
    return image


class _Boxes:
    def __init__(self, xyxy):
        self.xyxy = xyxy


class _Detector:
    """What the package's YOLO detector would return: the drawing's bounding box, 12 px margin."""

    def __init__(self, path):
        self.path = path

    def __call__(self, image):
        ys, xs = np.nonzero(image.min(axis=2) < 200)
        h, w = image.shape[:2]
        box = [max(xs.min() - 12, 0), max(ys.min() - 12, 0), min(xs.max() + 12, w), min(ys.max() + 12, h)]
        return [types.SimpleNamespace(boxes=_Boxes(np.array([box], np.float32)))]


def iso_inputs() -> tuple[list[dict], list[dict]]:
    """Each drawing through run_inference; what it feeds each Keras model's predict, recorded."""
    import cv2
    import tensorflow as tf

    sys.modules.setdefault("ultralytics", types.SimpleNamespace(YOLO=_Detector))
    fed = {"anomaly.keras": [], "my_model_keras.keras": []}
    load = tf.keras.models.load_model

    def loading(path, **kwargs):
        model = load(path, **kwargs)
        name, predict = Path(path).name, model.predict

        def recording(x, *args, **kw):
            fed[name].append(np.asarray(x, np.float32).reshape(1, 224, 224, 1))
            return predict(x, *args, **kw)

        model.predict = recording
        return model

    from ai_isometric_extractor.main import run_inference
    assert (package_dir("ai_isometric_extractor") / "anomaly.keras").is_file()
    tf.keras.models.load_model = loading
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for i in range(SAMPLES):
                path = str(Path(tmp) / f"drawing_{i:02d}.png")
                cv2.imwrite(path, iso_drawing(i))
                run_inference(path)
    finally:
        tf.keras.models.load_model = load
    checks, cleans = fed["anomaly.keras"], fed["my_model_keras.keras"]
    assert len(checks) == SAMPLES and len(cleans) == SAMPLES, (len(checks), len(cleans))
    return ([{"input_layer": x} for x in checks], [{"input_layer_23": x} for x in cleans])


def main(argv: list[str]) -> Path:
    checks, cleans = iso_inputs()
    return zoo.write_sample_sets(Path(argv[0]) if argv else OUT, {
        "rxn": reaction_inputs(), "skin": skin_inputs(), "iso_check": checks, "iso_clean": cleans})


if __name__ == "__main__":
    print(main(sys.argv[1:]))
