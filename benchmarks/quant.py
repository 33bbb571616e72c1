"""Quantization on YOLOv8n: npubuild against ONNX Runtime's ``quantize_static``, side by side.

YOLOv8n (nudenet 320n.onnx, 1x3x320x320, constants folded) as one NPU graph; the 14 RGB photos
of scikit-image split alternately, 7 to calibrate and 7 to compare. Two tables:

1. time: calibration + quantization (npubuild: lowering, statistics, parameters, integer
   weights; ORT: its calibration pass and QDQ rewrite), median of ``--runs``;
2. accuracy: mean output cosine vs the float model on the 7 held-out photos, for every scheme ×
   granularity × method; npubuild through its integer reference, ORT through its QDQ model
   (``Percentile`` at 99.99, ``Entropy`` for kl; ORT has no mse and no power-of-two scheme).

    python3 benchmarks/quant.py [--runs 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from npubuild import metrics, onnx_io  # noqa: E402
from npubuild.quant import calibrate, quantizer  # noqa: E402
from npubuild.quant.data import InputInfo, load_samples  # noqa: E402
from npubuild.quant.lower import lower  # noqa: E402
from npubuild.quant.reference import run_quantized  # noqa: E402
from npubuild.recipe.model import Preprocess  # noqa: E402
from npubuild.recipe.paths import package_dir  # noqa: E402

INPUT = InputInfo("images", (1, 3, 320, 320), "float32", "NCHW",
                  Preprocess(resize=(320, 320), scale=1 / 255, channel_order="RGB"))
SCHEMES = ("symmetric", "asymmetric", "pow2_symmetric")
GRANULARITIES = ("per_tensor", "per_channel")
METHODS = ("minmax", "percentile", "kl", "mse")
ORT_METHODS = {"minmax": "MinMax", "percentile": "Percentile", "kl": "Entropy"}


def photos() -> list[Path]:
    from PIL import Image

    data = package_dir("skimage") / "data"
    files = sorted([*data.glob("*.png"), *data.glob("*.jpg")])
    return [f for f in files if Image.open(f).mode in ("RGB", "RGBA")]


def static_yolov8n(path: Path) -> Path:
    import onnx
    import onnxscript.optimizer

    model = onnx.load(package_dir("nudenet") / "320n.onnx")
    model = onnx_io.fix_input_shapes(model, {INPUT.name: list(INPUT.shape)})
    model = onnxscript.optimizer.optimize(model, input_size_limit=1 << 22, output_size_limit=1 << 22)
    onnx_io.save_model(model, path)
    return path


def npubuild_quantize(model, cal, scheme, granularity, method):
    fg, probe = lower(model)
    stats = calibrate.observe(fg, probe, cal, method)
    config = quantizer.QuantConfig(scheme=scheme, granularity=granularity, method=method)
    return quantizer.quantize_graph(fg, stats, config, "graph_0")[0]


def ort_quantize(model_path: Path, out: Path, cal, scheme, granularity, method) -> Path:
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat,
                                          QuantType, quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(cal)

        def get_next(self):
            return next(self.it, None)

    symmetric = scheme == "symmetric"
    with contextlib.redirect_stdout(io.StringIO()):  # ORT's calibrators print progress
        quantize_static(str(model_path), str(out), Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=granularity == "per_channel", activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8,
                        calibrate_method=getattr(CalibrationMethod, ORT_METHODS[method]),
                        extra_options={"ActivationSymmetric": symmetric, "WeightSymmetric": True,
                                       "CalibPercentile": 99.99})
    return out


def mean_cosine(refs, outputs) -> float:
    return float(np.mean([metrics.similarity(r, o).cosine for r, o in zip(refs, outputs)]))


def timing(model, model_path, cal, runs, tmp):
    rows = []
    for method in ("minmax", "kl"):
        ours = []
        for _ in range(runs):
            start = time.perf_counter()
            npubuild_quantize(model, cal, "symmetric", "per_channel", method)
            ours.append(time.perf_counter() - start)
        theirs = []
        for _ in range(runs):
            start = time.perf_counter()
            ort_quantize(model_path, tmp / "t.onnx", cal, "symmetric", "per_channel", method)
            theirs.append(time.perf_counter() - start)
        rows.append((method, statistics.median(ours), statistics.median(theirs)))
    return rows


def accuracy(model, model_path, cal, ver, refs, tmp):
    rows = []
    for scheme in SCHEMES:
        for granularity in GRANULARITIES:
            for method in METHODS:
                qg = npubuild_quantize(model, cal, scheme, granularity, method)
                ours = mean_cosine(refs, [run_quantized(qg, s)["output0"] for s in ver])
                theirs = None
                if scheme != "pow2_symmetric" and method in ORT_METHODS:
                    path = ort_quantize(model_path, tmp / "a.onnx", cal, scheme, granularity, method)
                    sess = onnx_io.session(path)
                    theirs = mean_cosine(refs, [onnx_io.run(sess, s)["output0"] for s in ver])
                rows.append((scheme, granularity, method, ours, theirs))
                print(f"  {scheme:15s} {granularity:12s} {method:10s} {ours:.5f} "
                      f"{'' if theirs is None else f'{theirs:.5f}'}", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    import onnx

    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        model_path = static_yolov8n(tmp / "yolov8n.onnx")
        model = onnx.load(model_path)
        samples = list(load_samples(photos(), [INPUT]))
        cal, ver = samples[0::2], samples[1::2]
        sess = onnx_io.session(model)
        refs = [onnx_io.run(sess, s)["output0"] for s in ver]
        times = timing(model, model_path, cal, args.runs, tmp)
        table = accuracy(model, model_path, cal, ver, refs, tmp)

    print(f"YOLOv8n 320, {len(cal)} calibration photos, {len(ver)} held out\n")
    print("| calibration + quantization | npubuild | ONNX Runtime quantize_static |")
    print("|---|---|---|")
    for method, ours, theirs in times:
        print(f"| symmetric per_channel {method} | {ours:.2f} s | {theirs:.2f} s |")
    print("\n| scheme | granularity | method | npubuild cosine | ONNX Runtime cosine |")
    print("|---|---|---|---|---|")
    for scheme, granularity, method, ours, theirs in table:
        print(f"| {scheme} | {granularity} | {method} | {ours:.5f} | "
              f"{'—' if theirs is None else f'{theirs:.5f}'} |")
    if args.json:
        args.json.write_text(json.dumps({"times": times, "accuracy": table}, indent=1))


if __name__ == "__main__":
    main()
