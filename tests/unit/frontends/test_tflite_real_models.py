"""Real MediaPipe TFLite models from the mediapipe wheel through the TFLite frontend: selfie
segmentation (custom op Convolution2DTransposeBias) and the BlazePose detector (sparse
weights). Each converted model must equal the source run on a real photo."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from npubuild.frontends import tensorflow as tf_frontend
from npubuild.frontends import tflite_graph
from npubuild.onnx_io import run
from npubuild.proofs import compare
from npubuild.recipe.model import InputSpec

_SPEC = importlib.util.find_spec("mediapipe")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(
    _SPEC is None, reason="needs the mediapipe wheel: pip install --no-deps mediapipe==0.10.21")]


def _module(path: str) -> Path:
    return Path(_SPEC.submodule_search_locations[0]) / "modules" / path


def _astronaut(size: int, low: float) -> np.ndarray:
    """skimage's astronaut photo (a person) as MediaPipe feeds it: RGB in [low, 1]."""
    skimage = Path(importlib.util.find_spec("skimage").submodule_search_locations[0])
    image = Image.open(skimage / "data" / "astronaut.png").convert("RGB").resize((size, size))
    return (np.asarray(image, np.float32)[None] / 255.0 * (1 - low) + low).astype(np.float32)


@pytest.mark.parametrize("path, size, low, op_type", [
    ("selfie_segmentation/selfie_segmentation.tflite", 256, 0.0, "ConvTranspose"),
    ("pose_detection/pose_detection.tflite", 224, -1.0, "Conv"),
])
def test_mediapipe_model_converts_and_equals_the_source(path, size, low, op_type):
    model_path = _module(path)
    inputs = [InputSpec(name="input_1")]
    x = _astronaut(size, low)
    model = tf_frontend.convert(model_path, "tflite", inputs, None)
    assert op_type in {n.op_type for n in model.graph.node}
    assert not [n.op_type for n in model.graph.node if n.op_type.startswith("TFL_")]
    source = tf_frontend.run_source(model_path, "tflite", {"input_1": x}, inputs, None)
    got = run(model, {"input_1": x})
    _, bad = compare(dict(zip(got, source)), got, tolerance=1e-4)
    assert not bad, [str(b) for b in bad]
    if "selfie" in path:  # the mask finds the astronaut: the proof compares a real answer
        assert source[0].max() > 0.9 and 0.05 < (source[0] > 0.5).mean() < 0.95


def test_the_pose_detector_really_is_sparse():
    model = tflite_graph.read(_module("pose_detection/pose_detection.tflite"))
    ops = [tflite_graph.op_type(model, op) for op in model.subgraphs[0].operators]
    assert ops.count("DENSIFY") == 38
