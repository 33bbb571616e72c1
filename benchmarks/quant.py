"""Quantization accuracy over real models: npubuild against ONNX Runtime and TFLite.

Every model is quantized whole (one graph: what npubuild cannot lower runs in float, counted in
the ``cpu layers`` column) from the same calibration photos and compared on the same held-out
photos (scikit-image's RGB photos, alternately 7 to calibrate and 7 to compare):

- npubuild: ``asymmetric`` activations, per-channel weights, minmax, int16 where int8
  underflows (``quantization.int16_where_underflows`` on an int16 chip such as npu-16m), run
  through its integer reference; ``x-check`` is the fraction of the integer reference's
  elements identical to ONNX Runtime running npubuild's own QDQ export (layer by layer, same
  integer inputs) and the largest difference in steps;
- ONNX Runtime: ``quant_pre_process`` (its documented preparation: graph optimisation folds
  BatchNormalization into Conv) then ``quantize_static`` (QDQ, int8 asymmetric activations,
  per-channel symmetric weights, MinMax: its defaults), the same photos;
- zoo recipes (``ppocr-*``, ``inception_v2``, ``vgg19``, ``zfnet512``): the recipe's own input,
  preprocessing, calibration files and verify files (PP-OCR: text lines and scanned pages),
  and npubuild with the recipe's scheme, granularity and method; PP-OCRv4 det is also judged
  by the text-map IoU at DBNet's 0.3 threshold and the cosine over all samples together
  (``cosine`` is the mean of per-image cosines, which a page without text drives to 0);
- TFLite (the Keras models: MobileNetV2 at 224, and the Keras zoo's MobileNetV3Small,
  EfficientNetB0, ResNet50, DenseNet121 at 96 as ``scripts/make_keras_zoo.py`` builds them):
  the TFLite converter's full-int8 model on the same weights and photos. The Keras models
  reach npubuild and ONNX Runtime through npubuild's own TensorFlow import, and the Keras zoo
  is judged on its recipes' photos (8 calibrate, 4 held out), as the zoo deploys it;
- ``npubuild +CLE``: npubuild with cross-layer equalisation
  (``quantization.cross_layer_equalization``).

Columns: output cosine against the float model (mean over photos), the cosine of a slice
(YOLOv8n: class scores, channels 4..), and top-1 agreement with the float model (classifiers;
PP-OCR rec: the argmax character per time step).

    pip install --no-deps -r requirements/models.txt    # PP-OCRv4 models (rapidocr-onnxruntime)
    python3 benchmarks/quant.py [--models yolov8n,mobilenetv2,...] [--json out.json]
    python3 benchmarks/quant.py --schemes      # YOLOv8n: every scheme x granularity x method
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from npubuild import metrics, onnx_io  # noqa: E402
from npubuild.quant import calibrate, check, quantizer  # noqa: E402
from npubuild.quant.data import InputInfo, load_samples  # noqa: E402
from npubuild.quant.lower import lower  # noqa: E402
from npubuild.quant.reference import quantize_inputs, run_quantized, run_reference  # noqa: E402
from npubuild.recipe.model import Preprocess  # noqa: E402
from npubuild.recipe.paths import package_dir  # noqa: E402

SCHEMES = ("symmetric", "asymmetric", "pow2_symmetric")
GRANULARITIES = ("per_tensor", "per_channel")
METHODS = ("minmax", "percentile", "kl", "mse")
ORT_METHODS = {"minmax": "MinMax", "percentile": "Percentile", "kl": "Entropy"}
CROSSCHECK_SAMPLES = 2
IMAGENET = {"mean": [0.485, 0.456, 0.406], "std": [0.229, 0.224, 0.225]}


@dataclass
class Case:
    """One benchmark model: how to build it, its input, and how to judge its output."""

    name: str
    build: Callable[[Path], Path]              # writes a static-shape ONNX model, returns it
    input: InputInfo
    slice_: tuple[int, int | None] | None = None   # (first, end) along axis 1 of the output
    top1_axis: int | None = None               # argmax axis for top-1 agreement
    tflite: Callable[[list, list], list] | None = None  # (cal, ver) -> outputs of TFLite int8
    config: dict = field(default_factory=dict)  # extra QuantConfig fields
    data: Callable[[], tuple[list, list]] | None = None  # (cal, ver); default: the photos
    text_map: bool = False                     # text-detection map: IoU of the maps at 0.3
    fusions: tuple[str, ...] = ()              # npubuild fusion rules its recipe applies first


def photos() -> list[Path]:
    from PIL import Image

    data = package_dir("skimage") / "data"
    files = sorted([*data.glob("*.png"), *data.glob("*.jpg")])
    return [f for f in files if Image.open(f).mode in ("RGB", "RGBA")]


def _optimized(model, shapes: dict, path: Path) -> Path:
    import onnxscript.optimizer

    from npubuild.frontends.onnx import normalise_ir
    from npubuild.quant.lower import MIN_OPSET, opset_of

    model = onnx_io.fix_input_shapes(normalise_ir(model), shapes)  # old IR: no weights as inputs
    if opset_of(model) < MIN_OPSET:  # per-channel DequantizeLinear needs opset 13 (its axis)
        model = onnx_io.convert_version(model, MIN_OPSET)
    model = onnxscript.optimizer.optimize(model, input_size_limit=1 << 22, output_size_limit=1 << 22)
    onnx_io.save_model(model, path)
    return path


def _onnx_file(path: Path, info: InputInfo) -> Callable[[Path], Path]:
    def build(out: Path) -> Path:
        import onnx

        return _optimized(onnx.load(path), {info.name: list(info.shape)}, out)
    return build


# ---- Keras MobileNetV2 with BatchNorm statistics from photos ----------------------------------

KERAS_INPUT = InputInfo("input", (1, 224, 224, 3), "float32", "NHWC",
                        Preprocess(resize=(224, 224), scale=1 / 127.5, mean=1.0))


def keras_mobilenetv2(files: list[Path]):
    """MobileNetV2 (random weights, fixed seed) whose BatchNorm moving statistics are the batch
    statistics of ``files``: a network whose activations look trained (no download)."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    tf.keras.utils.set_random_seed(0)
    model = tf.keras.applications.MobileNetV2(input_shape=(224, 224, 3), weights=None,
                                              classifier_activation=None)
    batch = np.concatenate([s[KERAS_INPUT.name] for s in load_samples(files, [KERAS_INPUT])])
    for layer in model.layers:
        if isinstance(layer, tf.keras.layers.BatchNormalization):
            layer.momentum = 0.0          # one training-mode call sets the moving statistics
    model(batch, training=True)
    return model


def _rename_input(model, old: str, new: str) -> None:
    """Call graph input ``old`` (TF's ``input:0``) ``new``, where the samples are keyed."""
    for value in model.graph.input:
        if value.name == old:
            value.name = new
    for node in model.graph.node:
        node.input[:] = [new if i == old else i for i in node.input]


def keras_zoo_model(name: str):
    """A Keras zoo network as recipes/zoo/keras/ deploy it: ``models/keras_zoo/<name>.keras``
    when ``scripts/make_keras_zoo.py`` has written it, else built the same way (96×96, random
    weights, BatchNorm statistics from that script's photos; TensorFlow's batch statistics
    vary in their last bits between builds, and the rows with them by ~0.001)."""
    import importlib.util

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    import tensorflow as tf

    saved = REPO / "models" / "keras_zoo" / f"{name}.keras"
    if saved.exists():
        return tf.keras.models.load_model(str(saved), compile=False)
    spec = importlib.util.spec_from_file_location("make_keras_zoo", REPO / "scripts" / "make_keras_zoo.py")
    zoo = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(zoo)
    return zoo.build(tf, name)


def _keras_zoo_info(name: str) -> InputInfo:
    scales = {"efficientnetb0": (1.0, 0.0), "mobilenetv3small": (1.0, 0.0),
              "resnet50": (1 / 127.5, 1.0), "densenet121": (1 / 127.5, 1.0)}
    scale, mean = scales[name]
    return InputInfo("input", (1, 96, 96, 3), "float32", "NHWC",
                     Preprocess(resize=(96, 96), scale=scale, mean=mean))


def _keras_case(label: str = "mobilenetv2 (keras)", make=None, info: InputInfo = KERAS_INPUT,
                fusions: tuple[str, ...] = (), data=None) -> Case:
    """A Keras network through tf2onnx (npubuild, ORT) and TFLite's full-int8 converter."""
    state: dict = {}
    make = make or keras_mobilenetv2

    def model_for(files):
        if "model" not in state:
            state["model"] = make(files)
        return state["model"]

    def build(out: Path) -> Path:
        # npubuild's own import (`npubuild.frontends.tensorflow`: tf2onnx with the transpose
        # optimizer taught the elementwise ops Keras puts between convolutions), as a recipe
        # with `format: keras` gets it; ORT quantizes the same ONNX model.
        from npubuild.frontends import tensorflow as tf_frontend

        model = model_for(photos())
        saved = out.with_suffix(".keras")
        model.save(saved)
        onnx_model = tf_frontend.convert(saved, "keras", [], None)  # shapes fixed below
        _rename_input(onnx_model, onnx_model.graph.input[0].name, info.name)
        return _optimized(onnx_model, {info.name: list(info.shape)}, out)

    def tflite(cal, ver):
        import tensorflow as tf

        model = model_for(photos())
        converter = tf.lite.TFLiteConverter.from_keras_model(model)
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        converter.representative_dataset = lambda: ([s[info.name]] for s in cal)
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.int8
        converter.inference_output_type = tf.int8
        with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
            blob = converter.convert()
        interp = tf.lite.Interpreter(model_content=blob)
        interp.allocate_tensors()
        inp, outp = interp.get_input_details()[0], interp.get_output_details()[0]
        outs = []
        for s in ver:
            (si, zi), (so, zo) = inp["quantization"], outp["quantization"]
            q = np.clip(np.rint(s[info.name] / si) + zi, -128, 127).astype(np.int8)
            interp.set_tensor(inp["index"], q)
            interp.invoke()
            outs.append((interp.get_tensor(outp["index"]).astype(np.float32) - zo) * so)
        return outs

    return Case(label, build, info, top1_axis=-1, tflite=tflite, fusions=fusions, data=data)


KERAS_ZOO = ("mobilenetv3small", "efficientnetb0", "resnet50", "densenet121")
KERAS_ZOO_FUSIONS = ("fold_affine", "conv_bn", "conv_act", "hard_swish")  # as recipes/zoo/keras


def keras_zoo_cases() -> list[Case]:
    """The Keras zoo networks on their recipes' photos (``recipes/zoo/keras/keras-*-keras.yaml``:
    8 to calibrate, 4 held out). Their BatchNorm statistics come from photos, so the synthetic
    images of the 7/7 split (``color.png``, ``logo.png``) drive them 10-100x outside every
    calibrated range: there every quantizer's output is below 0 dB SQNR, noise whose cosine
    ranks nothing."""
    from npubuild.recipe import load_recipe

    cases = []
    for name in KERAS_ZOO:
        info = _keras_zoo_info(name)
        loaded = load_recipe(REPO / "recipes" / "zoo" / "keras" / f"keras-{name}-keras.yaml")
        cases.append(_keras_case(f"{name} (keras zoo)", lambda files, n=name: keras_zoo_model(n),
                                 info, KERAS_ZOO_FUSIONS, data=_recipe_data(loaded, info)))
    return cases


def _installed(package: str, sub: str) -> Path | None:
    import importlib.util

    return Path(package_dir(package)) / sub if importlib.util.find_spec(package) else None


def _recipe_data(loaded, info: InputInfo) -> Callable[[], tuple[list, list]]:
    """A recipe's calibration files (all of them, as both quantizers see the same) and its
    verify files, as ``info`` reads them."""
    q = loaded.recipe.quantization

    def data():
        cal = loaded.resolve_glob(q.calibration.data, "quantization")
        ver = loaded.resolve_glob(loaded.recipe.verify.data, "verify")
        return (list(load_samples(cal, [info], q.calibration.samples)),
                list(load_samples(ver, [info], loaded.recipe.verify.samples)))
    return data


def recipe_case(name: str, recipe: str, **kw) -> Case:
    """A zoo recipe's model, input and data: its calibration files to calibrate, its verify
    files to compare (PP-OCR's text lines and scanned pages, where text matters)."""
    from npubuild.recipe import load_recipe

    loaded = load_recipe(REPO / "recipes" / "zoo" / recipe)
    spec = loaded.recipe.model.inputs[0]
    info = InputInfo(spec.name, tuple(spec.shape), "float32", spec.layout, spec.preprocess)
    model = loaded.resolve(loaded.recipe.model.path, "model", "path")
    q = loaded.recipe.quantization
    config = {"scheme": q.scheme, "granularity": q.granularity, "method": q.calibration.method,
              "int16_underflow": q.int16_where_underflows}
    return Case(name, _onnx_file(model, info), info, data=_recipe_data(loaded, info),
                config=config, **kw)


def cases() -> list[Case]:
    light = Path(package_dir("onnx")) / "backend" / "test" / "data" / "light"
    ocr = _installed("rapidocr_onnxruntime", "models")
    yolo = InputInfo("images", (1, 3, 320, 320), "float32", "NCHW",
                     Preprocess(resize=(320, 320), scale=1 / 255, channel_order="RGB"))
    det = InputInfo("x", (1, 3, 320, 320), "float32", "NCHW",
                    Preprocess(resize=(320, 320), scale=1 / 255, channel_order="BGR", **IMAGENET))
    rec = InputInfo("x", (1, 3, 48, 320), "float32", "NCHW",
                    Preprocess(resize=(48, 320), scale=1 / 127.5, mean=1.0, channel_order="BGR"))
    caffe = dict(resize=(224, 224), scale=1.0, mean=[104.0, 117.0, 123.0], channel_order="BGR")
    out = [Case("yolov8n", _onnx_file(package_dir("nudenet") / "320n.onnx", yolo), yolo,
                slice_=(4, None)),
           _keras_case(), *keras_zoo_cases()]
    for name, inp in (("squeezenet", "data_0"), ("shufflenet", "gpu_0/data_0")):
        info = InputInfo(inp, (1, 3, 224, 224), "float32", "NCHW", Preprocess(**caffe))
        out.append(Case(name, _onnx_file(light / f"light_{name}.onnx", info), info, top1_axis=-1))
    for name in ("inception_v2", "vgg19", "zfnet512"):
        out.append(recipe_case(name, f"light-{name.replace('_', '-')}.yaml", top1_axis=-1))
    if ocr is None:
        print("  PP-OCRv4 skipped: pip install --no-deps -r requirements/models.txt (rapidocr-onnxruntime)", file=sys.stderr)
        return out
    out.append(Case("ppocrv4_det", _onnx_file(ocr / "ch_PP-OCRv4_det_infer.onnx", det), det))
    out.append(Case("ppocrv4_rec", _onnx_file(ocr / "ch_PP-OCRv4_rec_infer.onnx", rec), rec,
                    top1_axis=-1))
    if (REPO / "models" / "zoo").is_dir():  # text lines: python3 scripts/make_zoo_models.py
        out.append(recipe_case("ppocr-v4-det", "ppocr-v4-det.yaml", text_map=True))
        out.append(recipe_case("ppocr-v4-rec", "ppocr-v4-rec.yaml", top1_axis=-1))
        out.append(recipe_case("ppocr-cls", "ppocr-cls.yaml", top1_axis=-1))
    return out


# ---- quantizers -------------------------------------------------------------------------------

def npubuild_quantize(model, cal, scheme="asymmetric", granularity="per_channel", method="minmax",
                      equalize=False, **extra):
    fg, probe = lower(model, equalize=equalize)
    stats = calibrate.observe(fg, probe, cal, method)
    config = quantizer.QuantConfig(scheme=scheme, granularity=granularity, method=method, **extra)
    return quantizer.quantize_graph(fg, stats, config, "graph_0")[0]


def ort_quantize(model_path: Path, out: Path, cal, scheme="asymmetric", granularity="per_channel",
                 method="minmax") -> Path:
    from onnxruntime.quantization import (CalibrationDataReader, CalibrationMethod, QuantFormat,
                                          QuantType, quantize_static)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter(cal)

        def get_next(self):
            return next(self.it, None)

    from onnxruntime.quantization.shape_inference import quant_pre_process

    # ORT's documented pre-processing (its optimizer folds BatchNormalization into Conv):
    # without it, per-channel quantize_static writes PP-OCR models ORT itself cannot load
    # (a per-channel axis 1 on a rank-1 BatchNormalization scale).
    prepared = out.with_name(out.stem + ".pre.onnx")
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        quant_pre_process(str(model_path), str(prepared), skip_symbolic_shape=True)
    with contextlib.redirect_stdout(io.StringIO()):  # ORT's calibrators print progress
        quantize_static(str(prepared), str(out), Reader(), quant_format=QuantFormat.QDQ,
                        per_channel=granularity == "per_channel", activation_type=QuantType.QInt8,
                        weight_type=QuantType.QInt8,
                        calibrate_method=getattr(CalibrationMethod, ORT_METHODS[method]),
                        extra_options={"ActivationSymmetric": scheme == "symmetric",
                                       "WeightSymmetric": True, "CalibPercentile": 99.99})
    return out


def fused(model, rules: tuple[str, ...]):
    """``model`` after npubuild's fusion ``rules`` (what the recipe's fusion stage does; ORT
    and TFLite get the model as converted)."""
    from npubuild.fusions import load_builtins

    registry = load_builtins()
    for rule in rules:
        model, _ = registry[rule].apply(model)
    return model


# ---- metrics ----------------------------------------------------------------------------------

def scores(case: Case, refs: list, outs: list) -> dict:
    """Mean output cosine, slice cosine and top-1 agreement of ``outs`` against ``refs``."""
    every = metrics.similarity(np.concatenate([np.ravel(r) for r in refs]),
                               np.concatenate([np.ravel(o) for o in outs]))
    row = {"cosine": float(np.mean([metrics.similarity(r, o).cosine for r, o in zip(refs, outs)])),
           "sqnr_all": every.sqnr_db}
    if case.slice_:
        lo, hi = case.slice_
        row["slice"] = float(np.mean([metrics.similarity(r[:, lo:hi], o[:, lo:hi]).cosine
                                      for r, o in zip(refs, outs)]))
    if case.text_map:
        from npubuild.verify import tasks

        row["text_iou"] = tasks.text_detection(refs, outs)["text_map_iou"]
        row["cosine_all"] = every.cosine
    if case.top1_axis is not None:
        row["top1"] = float(np.mean([np.mean(np.argmax(r, case.top1_axis) == np.argmax(o, case.top1_axis))
                                     for r, o in zip(refs, outs)]))
    return row


def crosscheck(qg, ver) -> dict:
    checker = check.CrossChecker(qg)
    for s in ver[:CROSSCHECK_SAMPLES]:
        checker.add(run_reference(qg, quantize_inputs(qg, s)))
    return checker.result.summary()


def measure(case: Case, tmp: Path, npubuild_config: dict) -> dict:
    import onnx

    start = time.perf_counter()
    path = case.build(tmp / f"{case.name.split()[0]}.onnx")
    model = onnx.load(path)
    if case.data:
        cal, ver = case.data()
    else:
        samples = list(load_samples(photos(), [case.input]))
        cal, ver = samples[0::2], samples[1::2]
    sess = onnx_io.session(model)
    out_name = sess.get_outputs()[0].name
    refs = [onnx_io.run(sess, s)[out_name] for s in ver]
    qmodel = fused(model, case.fusions)
    qg = npubuild_quantize(qmodel, cal, **{**npubuild_config, **case.config})
    ours = scores(case, refs, [run_quantized(qg, s, [out_name])[out_name] for s in ver])
    ours["cpu_layers"] = sum(layer.device == "cpu" for layer in qg.layers)
    qg_cle = npubuild_quantize(qmodel, cal, equalize=True, **{**npubuild_config, **case.config})
    ours["cle"] = scores(case, refs, [run_quantized(qg_cle, s, [out_name])[out_name]
                                      for s in ver])["cosine"]
    xc = crosscheck(qg, ver)
    ours["xcheck"] = (xc["identical_fraction"], xc["max_lsb"])
    try:
        ort_sess = onnx_io.session(ort_quantize(path, tmp / "ort.onnx", cal))
        theirs = scores(case, refs, [onnx_io.run(ort_sess, s)[out_name] for s in ver])
    except Exception as exc:  # noqa: BLE001 - a benchmark row says what failed
        theirs = {"error": str(exc).splitlines()[0][:120]}
    row = {"model": case.name, "npubuild": ours, "ort": theirs}
    if case.tflite:
        row["tflite"] = scores(case, refs, case.tflite(cal, ver))
    row["seconds"] = time.perf_counter() - start
    print(f"  {case.name}: {json.dumps(row)}", file=sys.stderr, flush=True)
    return row


def _fmt(row: dict | None, key: str, digits: int = 4) -> str:
    value = (row or {}).get(key)
    return "—" if value is None else f"{value:.{digits}f}"


def zoo_table(rows: list[dict]) -> str:
    lines = ["| model | npubuild cosine | npubuild +CLE | ORT cosine | TFLite cosine | npubuild slice "
             "| ORT slice | npubuild top-1 | ORT top-1 | TFLite top-1 | npubuild text IoU | ORT text IoU "
             "| npubuild cosine, all images | ORT cosine, all images "
             "| npubuild SQNR dB | ORT SQNR dB | TFLite SQNR dB "
             "| cpu layers | x-check identical, max LSB |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        n, o, t = r["npubuild"], r["ort"], r.get("tflite")
        frac, lsb = n["xcheck"]
        lines.append(f"| {r['model']} | {_fmt(n, 'cosine')} | {_fmt(n, 'cle')} | {_fmt(o, 'cosine')} | "
                     f"{_fmt(t, 'cosine')} | {_fmt(n, 'slice')} | {_fmt(o, 'slice')} | "
                     f"{_fmt(n, 'top1')} | {_fmt(o, 'top1')} | {_fmt(t, 'top1')} | "
                     f"{_fmt(n, 'text_iou')} | {_fmt(o, 'text_iou')} | "
                     f"{_fmt(n, 'cosine_all')} | {_fmt(o, 'cosine_all')} | "
                     f"{_fmt(n, 'sqnr_all', 2)} | {_fmt(o, 'sqnr_all', 2)} | {_fmt(t, 'sqnr_all', 2)} | "
                     f"{n['cpu_layers']} | {100 * frac:.4f} %, {lsb} |")
    return "\n".join(lines)


def scheme_table(tmp: Path) -> str:
    """YOLOv8n: every scheme x granularity x method, npubuild and (where it has one) ORT."""
    import onnx

    case = cases()[0]
    path = case.build(tmp / "yolov8n.onnx")
    model = onnx.load(path)
    samples = list(load_samples(photos(), [case.input]))
    cal, ver = samples[0::2], samples[1::2]
    refs = [onnx_io.run(onnx_io.session(model), s)["output0"] for s in ver]
    lines = ["| scheme | granularity | method | npubuild cosine | ORT cosine |", "|---|---|---|---|---|"]
    for scheme in SCHEMES:
        for granularity in GRANULARITIES:
            for method in METHODS:
                qg = npubuild_quantize(model, cal, scheme, granularity, method)
                ours = scores(case, refs, [run_quantized(qg, s)["output0"] for s in ver])["cosine"]
                theirs = "—"
                if scheme != "pow2_symmetric" and method in ORT_METHODS:
                    sess = onnx_io.session(ort_quantize(path, tmp / "a.onnx", cal, scheme,
                                                        granularity, method))
                    theirs = f"{scores(case, refs, [onnx_io.run(sess, s)['output0'] for s in ver])['cosine']:.5f}"
                lines.append(f"| {scheme} | {granularity} | {method} | {ours:.5f} | {theirs} |")
                print(lines[-1], file=sys.stderr, flush=True)
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", help="comma-separated names (default: all)")
    parser.add_argument("--schemes", action="store_true", help="YOLOv8n scheme x method table")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp_name:
        tmp = Path(tmp_name)
        if args.schemes:
            print(scheme_table(tmp))
            return
        wanted = set(args.models.split(",")) if args.models else None
        rows = [measure(c, tmp, {"int16_underflow": True}) for c in cases()
                if wanted is None or c.name.split()[0] in wanted]
    print(f"{len(photos()) // 2} calibration photos, {len(photos()) - len(photos()) // 2} held out "
          "(zoo recipes: their own calibration and verify files)\n")
    print(zoo_table(rows))
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
