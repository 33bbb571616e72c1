#!/usr/bin/env python3
"""Data for the fourteenth round of models npubuild had never seen (README: "A fourteenth round").

Writes, under ``benchmarks/unseen/round14/data/`` (git-ignored) or the folder given, 12 samples
per set (the recipes calibrate on the first six and verify on the last six), each through
ClashRoyaleBuildABot 1.2.0's own front end (its detectors' ``_preprocess``) from one screenshot
of the size the bot grabs (368 x 652): a scikit-image photo as the arena, with the numbers the
bot reads drawn where it reads them (king levels, king and princess hit points from the game's
tables in ``data/constants.py``, white with a black outline in Pillow's own font):

- ``number_*.npz``: ``NumberDetector``'s input, ``images`` [10, 3, 64, 64]: the ten number
  boxes (``NUMBER_CONFIG``, 28 x 7 pixels each) resized to 64 x 16, grey in three channels,
  padded with 114 to 64 x 64, / 255.
- ``unit_*.npz``: ``UnitDetector``'s input, ``images`` [1, 3, 416, 416]: the arena (5 % to 80 %
  of the height) resized to 416 x 416 (bicubic), / 255.
- ``side_*.npz``: ``SideDetector``'s input, ``input.1`` [1, 16, 16, 3] (NHWC): a unit's box
  (a 40 x 40 crop of the arena) resized to 16 x 16, / 255.

Run: ``PYTHONPATH=<repo>:<site> python3 benchmarks/unseen/round14/make_data.py`` with the wheel
installed (``pip install --no-deps --target <site> ClashRoyaleBuildABot==1.2.0``); it needs
Pillow and scikit-image. The data are byte-identical from run to run.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import make_zoo_models as zoo  # noqa: E402  (the npz writer)

OUT = Path(__file__).resolve().parent / "data"
SAMPLES = 12
PHOTOS = ["astronaut.png", "coffee.png", "chelsea.png", "rocket.jpg", "motorcycle_left.png",
          "horse.png", "coins.png", "camera.png", "retina.jpg", "hubble_deep_field.jpg",
          "immunohistochemistry", "grass.png"]


def _photo(i: int):
    from PIL import Image
    from skimage import data
    name = PHOTOS[i]
    if not name.endswith((".png", ".jpg")):
        return Image.fromarray(getattr(data, name)()).convert("RGB")
    return Image.open(Path(data.__file__).parent / name).convert("RGB")


def screenshot(i: int):
    """Photo ``i`` as the arena of a 368 x 652 screenshot, the bot's numbers drawn in their boxes."""
    from PIL import Image, ImageDraw, ImageFont
    from clashroyalebuildabot.data import constants as c
    shot = _photo(i).resize((c.SCREENSHOT_WIDTH, c.SCREENSHOT_HEIGHT), Image.BICUBIC)
    draw = ImageDraw.Draw(shot)
    font = ImageFont.load_default(size=8)
    rng = np.random.default_rng(i)
    for name, (x0, y0, x1, y1) in c.NUMBER_CONFIG:
        if "level_2" in name:
            continue  # the second level box is empty when the first holds the level
        value = (rng.integers(9, 15) if "level" in name else
                 rng.choice(c.KING_HP if "king" in name else c.PRINCESS_HP))
        draw.rectangle((x0, y0, x1, y1), fill=(40, 40, 60) if "enemy" in name else (30, 60, 120))
        draw.text((x0 + 1, y0 - 1), str(value), fill="white", font=font,
                  stroke_width=1, stroke_fill="black")
    return shot


def samples() -> dict[str, list[dict]]:
    from clashroyalebuildabot.data import constants as c
    from clashroyalebuildabot.state.number_detector import NumberDetector
    from clashroyalebuildabot.state.side_detector import SideDetector
    from clashroyalebuildabot.state.unit_detector import UnitDetector
    sets = {"number": [], "unit": [], "side": []}
    for i in range(SAMPLES):
        shot = screenshot(i)
        crops = np.stack([NumberDetector._preprocess(None, shot.crop(box))[0]
                          for _, box in c.NUMBER_CONFIG]).astype(np.float32)
        sets["number"].append({"images": crops})
        sets["unit"].append({"images": UnitDetector._preprocess(shot).astype(np.float32)})
        x, y = 60 + 20 * (i % 12), 120 + 30 * (i % 9)
        side = SideDetector._preprocess(None, shot.crop((x, y, x + 40, y + 40)))
        sets["side"].append({"input.1": side.astype(np.float32)})
    return sets


# EAN-13: the first digit picks which of the next six use the L or G code; the last six use R.
EAN_FIRST = ["LLLLLL", "LLGLGG", "LLGGLG", "LLGGGL", "LGLLGG", "LGGLLG", "LGGGLL", "LGLGLG",
             "LGLGGL", "LGGLGL"]
EAN_L = ["0001101", "0011001", "0010011", "0111101", "0100011", "0110001", "0101111", "0111011",
         "0110111", "0001011"]


def ean13_bars(digits: str) -> str:
    """The 95 modules (1 = bar) of an EAN-13 code for 13 digits."""
    r_code = ["".join("1" if b == "0" else "0" for b in code) for code in EAN_L]
    g_code = [code[::-1] for code in r_code]
    left = "".join(EAN_L[int(d)] if kind == "L" else g_code[int(d)]
                   for d, kind in zip(digits[1:7], EAN_FIRST[int(digits[0])]))
    return "101" + left + "01010" + "".join(r_code[int(d)] for d in digits[7:]) + "101"


def isbn13(i: int) -> str:
    body = f"978{(7302000 + 7919 * i) % 10**9:09d}"
    check = (10 - sum(int(d) * (1 if k % 2 == 0 else 3) for k, d in enumerate(body)) % 10) % 10
    return body + str(check)


def book_cover(i: int):
    """The back of a book as a phone photographs it: photo ``i`` as the cover, a white label
    with the EAN-13 barcode of an ISBN and the number printed above it (Pillow's own font)."""
    from PIL import Image, ImageDraw, ImageFont
    cover = _photo(i).resize((900, 1200), Image.BICUBIC)
    draw = ImageDraw.Draw(cover)
    rng = np.random.default_rng(100 + i)
    module = int(rng.integers(2, 5))
    width, height = 95 * module + 40, 60 * module + 60
    x0 = int(rng.integers(20, 900 - width - 20))
    y0 = int(rng.integers(600, 1200 - height - 20))
    draw.rectangle((x0, y0, x0 + width, y0 + height), fill="white")
    digits = isbn13(i)
    font = ImageFont.load_default(size=6 * module + 4)
    draw.text((x0 + 20, y0 + 6), f"ISBN {digits[:3]}-{digits[3]}-{digits[4:8]}-{digits[8:12]}-"
              f"{digits[12]}", fill="black", font=font)
    for k, bar in enumerate(ean13_bars(digits)):
        if bar == "1":
            left = x0 + 20 + k * module
            draw.rectangle((left, y0 + 10 * module + 12, left + module - 1, y0 + height - 12),
                           fill="black")
    return cover


def letterbox(image, size: int = 1280, grey: int = 114) -> np.ndarray:
    """isbnx 0.0.18's ``Detector._preprocess`` (its package imports loguru and pydantic-settings,
    not needed here): scaled to fit ``size`` (bilinear), centred on grey, RGB / 255, NCHW."""
    from PIL import Image
    scale = min(size / image.width, size / image.height)
    width, height = round(image.width * scale), round(image.height * scale)
    canvas = Image.new("RGB", (size, size), (grey, grey, grey))
    canvas.paste(image.resize((width, height), Image.Resampling.BILINEAR),
                 ((size - width) // 2, (size - height) // 2))
    array = np.asarray(canvas, dtype=np.float32) / 255.0
    return np.ascontiguousarray(array.transpose(2, 0, 1)[None])


def isbnx_samples() -> list[dict]:
    """isbnx's detector input for each cover (``DetectorConfig``: 1280 x 1280, grey 114)."""
    return [{"images": letterbox(book_cover(i))} for i in range(SAMPLES)]


def main(argv: list[str]) -> Path:
    return zoo.write_sample_sets(Path(argv[0]) if argv else OUT,
                                 {**samples(), "isbn": isbnx_samples()})


if __name__ == "__main__":
    print(main(sys.argv[1:]))
