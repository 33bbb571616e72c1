"""npubuild's estimate against Arm Vela's on the same int8 TFLite models.

For every model (the Keras zoo's full-int8 TFLite files, from scripts/make_keras_zoo.py, and
Keras MobileNetV2-224 written the same way), Vela (``ethos-u-vela`` in its own virtual
environment, ``--vela``) compiles it for ethos-u55-256 and ethos-u65-256 with its default
system and memory configurations and writes its summary (cycles, inferences/s, off-chip bytes);
npubuild builds the same file up to ``quantize`` (plain int8: asymmetric, per channel) for the
same chips, whose files carry those configurations, and estimates the quantized NPU graphs as
report.html does beside Vela's figures (`npubuild.backends.vendor.quantized_estimate`: the
simulated compiler's plan; no Vela toolchain needed on npubuild's side). The table puts
cycles, inferences per second and off-chip bytes side by side with the ratio npubuild / Vela.
Both count the NPU part only (Vela leaves the float input's Quantize and the output's
Dequantize on the CPU; npubuild's split does the same).

    python3 benchmarks/estimate_vs_vela.py --vela /work/scratch/speed/vela-venv/bin/vela \
        [--models mobilenetv2 ...] [--json out.json]

Goal (issue 23): within 25 % of Vela on every row.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from benchmarks.builds import add_build_options, build_roots

MODELS_DIR = REPO / "models" / "keras_zoo"
ZOO_SIZE = 96
# name -> input size; the Keras zoo's files (96x96) and MobileNetV2 at 224
MODELS = {"mobilenetv2": 224, "mobilenetv3small": ZOO_SIZE, "efficientnetb0": ZOO_SIZE,
          "resnet50": ZOO_SIZE, "densenet121": ZOO_SIZE}
CHIPS = ("ethos-u55-256", "ethos-u65-256")
PHOTOS = ["chelsea.png", "coffee.png", "astronaut.png", "rocket.jpg"]

RECIPE = """\
version: 1
name: vela-{name}-{chip}
model:
  path: {path}
  format: tflite
  inputs:
    - name: "{input}"
      shape: [1, {size}, {size}, 3]
      layout: NHWC
      preprocess: {{resize: [{size}, {size}], scale: 1.0, channel_order: RGB}}
target: {chip}
surgery:
  - fold_constants: {{}}
fusion: [fold_affine, conv_bn, conv_act, hard_swish]
split:
  policy: npu_first
quantization:
  scheme: asymmetric
  granularity: per_channel
  calibration:
    data: [{photos}]
    samples: 4
    method: minmax
compile:
  layer_group: true
  proof_samples: 1
"""


def model_file(name: str) -> Path:
    """The model's int8 TFLite, written when missing (TensorFlow; a fixed seed). A size other
    than the zoo's is in the file name: the zoo writes its own 96x96 ``<name>_int8.tflite``."""
    size = MODELS[name]
    stem = name if size == ZOO_SIZE else f"{name}_{size}"
    path = MODELS_DIR / f"{stem}_int8.tflite"
    if not path.is_file():
        env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "3"}
        if name in ("mobilenetv2",):
            subprocess.run([sys.executable, __file__, "--write-mobilenetv2", str(path)], check=True,
                           env=env, stdout=subprocess.DEVNULL)
        else:
            subprocess.run([sys.executable, str(REPO / "scripts" / "make_keras_zoo.py"),
                            str(MODELS_DIR), name], check=True, env=env, stdout=subprocess.DEVNULL)
    return path


def write_mobilenetv2(path: Path, size: int = 224) -> None:
    """Keras MobileNetV2 at ``size`` (random weights, BatchNorm statistics from photos) as a
    full-int8 TFLite, as scripts/make_keras_zoo.py writes its models."""
    sys.path.insert(0, str(REPO / "scripts"))
    import make_keras_zoo as zoo
    import numpy as np
    import skimage
    import tensorflow as tf
    from PIL import Image

    data = Path(skimage.__file__).parent / "data"
    images = np.stack([np.asarray(Image.open(data / name).convert("RGB").resize(
        (size, size), Image.BILINEAR)) for name in zoo.CALIBRATION_PHOTOS]).astype(np.float32)
    images = images / 127.5 - 1.0
    tf.keras.backend.clear_session()
    tf.keras.utils.set_random_seed(0)
    model = tf.keras.applications.MobileNetV2(input_shape=(size, size, 3), weights=None,
                                              classifier_activation=None)
    zoo.calibrate_batch_norms(tf, model, images)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(zoo.tflite(tf, model, "int8", images))


def input_name(path: Path) -> str:
    import tensorflow as tf

    return tf.lite.Interpreter(model_path=str(path)).get_input_details()[0]["name"]


def run_vela(vela: str, model: Path, accelerator: str, out: Path) -> dict:
    subprocess.run([vela, str(model), "--accelerator-config", accelerator, "--output-dir",
                    str(out)], check=True, capture_output=True, text=True)
    (summary,) = out.glob(f"{model.stem}_summary_*.csv")
    row = next(csv.DictReader(summary.open()))
    offchip = sum(float(row[f"{area}_total_bytes"]) for area in ("dram", "off_chip_flash"))
    return {"cycles": float(row["cycles_total"]), "fps": float(row["inferences_per_second"]),
            "offchip_bytes": offchip, "macs": float(row["nn_macs"])}


def run_npubuild(name: str, model: Path, chip: str, size: int, root: Path, cache: Path) -> dict:
    from npubuild import api
    from npubuild.backends.vendor import quantized_estimate
    from npubuild.recipe import load_recipe

    photos = ", ".join(f'"pkg:skimage/data/{p}"' for p in PHOTOS)
    recipe = root / f"{name}@{chip}.yaml"
    recipe.write_text(RECIPE.format(name=name, path=model, input=input_name(model), size=size,
                                    chip=chip, photos=photos))
    session = api.session_for(load_recipe(recipe), build_root=root, cache=cache)
    api.build(session, "quantize")
    est = quantized_estimate(session.paths.stage_dir("quantize"), session.loaded.chip())
    return {"cycles": est["cycles"], "fps": est["npu_fps"], "offchip_bytes": est["offchip_bytes"],
            "macs": None}


def rows_for(name: str, vela: str, root: Path, cache: Path) -> list[dict]:
    model = model_file(name)
    rows = []
    for chip in CHIPS:
        theirs = run_vela(vela, model, chip, root / "vela" / name / chip)
        ours = run_npubuild(name, model, chip, MODELS[name], root, cache)
        rows.append({"model": name, "chip": chip, "vela": theirs, "npubuild": ours})
        print(f"{name} {chip}: done", file=sys.stderr)
    return rows


def print_table(rows: list[dict]) -> None:
    head = ("model", "chip", "Vela cycles", "npubuild cycles",
            "ratio", "Vela inf/s", "npubuild inf/s", "Vela off-chip B", "npubuild off-chip B",
            "ratio")
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
    for r in rows:
        v, n = r["vela"], r["npubuild"]
        print(f"| {r['model']} | {r['chip']} | {v['cycles']:,.0f} | "
              f"{n['cycles']:,.0f} | {n['cycles'] / v['cycles']:.2f} | {v['fps']:,.1f} | "
              f"{n['fps']:,.1f} | {v['offchip_bytes']:,.0f} | {n['offchip_bytes']:,.0f} | "
              f"{n['offchip_bytes'] / max(v['offchip_bytes'], 1):.2f} |")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vela", default="vela", help="the vela executable (its own venv)")
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    add_build_options(parser)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--write-mobilenetv2", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.write_mobilenetv2:
        write_mobilenetv2(args.write_mobilenetv2)
        return 0
    with build_roots(args) as (root, cache):
        root = root.resolve()
        root.mkdir(parents=True, exist_ok=True)
        rows = [row for name in args.models for row in rows_for(name, args.vela, root, cache)]
    print_table(rows)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2) + "\n")
    worst = max(abs(r["npubuild"]["cycles"] / r["vela"]["cycles"] - 1) for r in rows)
    return 0 if worst <= 0.25 else 1


if __name__ == "__main__":
    sys.exit(main())
