"""MediaPipe's TFLite custom ops lowered to ONNX, each checked numerically: against TensorFlow
Lite's interpreter where it can run the op (Convolution2DTransposeBias = its builtin
TRANSPOSE_CONV with a bias), else against the numpy reference of the op's documented semantics
(MaxPoolingWithArgmax2D, MaxUnpooling2D), itself checked against an independent formulation.
Models are written from scratch as flatbuffers (`tflite_models`)."""

from __future__ import annotations

import numpy as np
import pytest

from npubuild.errors import UserError
from npubuild.frontends import tensorflow as tf_frontend
from npubuild.frontends import tflite_custom, tflite_graph
from npubuild.onnx_io import run
from npubuild.proofs import compare
from npubuild.recipe.model import InputSpec
from tests.unit.frontends import tflite_models
from tests.unit.frontends.tflite_models import SAME, VALID

pytestmark = pytest.mark.slow  # TensorFlow and tf2onnx

INPUTS = [InputSpec(name="x")]


def _interpret(path, x):
    interpreter = tflite_graph.interpreter_for(tf_frontend._tensorflow(), path.read_bytes())
    interpreter.allocate_tensors()
    interpreter.set_tensor(interpreter.get_input_details()[0]["index"], x)
    interpreter.invoke()
    return [interpreter.get_tensor(d["index"]) for d in interpreter.get_output_details()]


def _lowered(path, x, outputs=None):
    model = tf_frontend.convert(path, "tflite", INPUTS, outputs)
    assert not {n.op_type for n in model.graph.node} & {f"TFL_{op}" for op in tflite_custom.CUSTOM_OPS}
    return model, list(run(model, {"x": x}).values())


def _assert_close(expected, got, tolerance=1e-5):
    _, bad = compare(dict(enumerate(expected)), dict(enumerate(got)), tolerance=tolerance)
    assert not bad, [str(b) for b in bad]


@pytest.mark.parametrize("size, kernel, stride, padding", [
    ((8, 8), 3, 2, SAME), ((7, 5), 4, 2, SAME), ((5, 6), 2, 2, VALID), ((6, 6), 3, 1, SAME),
    ((4, 7), 3, 3, VALID)])
def test_transpose_conv_bias_equals_tflites_builtin_transpose_conv(tmp_path, size, kernel,
                                                                  stride, padding):
    builtin = tflite_models.transpose_conv(tmp_path, size, kernel, stride, padding, custom=False)
    custom = tflite_models.transpose_conv(tmp_path, size, kernel, stride, padding, custom=True)
    x = np.random.default_rng(3).normal(0, 1, (1, *size, 4)).astype(np.float32)
    (expected,) = _interpret(builtin, x)
    # the source run: RELU and LOGISTIC in the interpreter, the custom op in its reference
    (source,) = tf_frontend.run_source(custom, "tflite", {"x": x}, INPUTS, None)
    _assert_close([expected], [source])
    model, got = _lowered(custom, x)
    assert "ConvTranspose" in {n.op_type for n in model.graph.node}
    _assert_close([expected], got)


@pytest.mark.parametrize("size, kernel, stride, padding, activation", [
    ((6, 8), 2, 2, VALID, 0), ((5, 7), 2, 2, SAME, 0), ((7, 7), 3, 2, SAME, 0),
    ((6, 6), 2, 2, VALID, 3)])
def test_max_pool_argmax_and_unpooling_match_their_reference(tmp_path, size, kernel, stride,
                                                             padding, activation):
    path = tflite_models.pool_unpool(tmp_path, size, kernel, stride, padding, activation)
    # values in [-3, 9]: RELU6 saturates some of them, so ties inside a window occur
    x = np.random.default_rng(4).uniform(-3, 9, (1, *size, 3)).astype(np.float32)
    source = tf_frontend.run_source(path, "tflite", {"x": x}, INPUTS, None)
    _, got = _lowered(path, x)
    _assert_close(source, got, tolerance=0.0)  # pooling and scattering are exact


def test_pooling_reference_agrees_with_block_max_and_first_argmax():
    """An independent formulation for 2×2 stride-2 windows: the block maximum, the first
    position holding it (row-major), and unpooling that puts each maximum back there."""
    rng = np.random.default_rng(5)
    x = rng.integers(0, 3, (2, 6, 4, 3)).astype(np.float32)  # many ties
    opts = {"padding": VALID, "stride_w": 2, "stride_h": 2, "filter_w": 2, "filter_h": 2,
            "activation": 0}
    values, indices = tflite_custom.max_pool_with_argmax(x, opts)
    blocks = x.reshape(2, 3, 2, 2, 2, 3).transpose(0, 1, 3, 2, 4, 5).reshape(2, 3, 2, 4, 3)
    np.testing.assert_array_equal(values, blocks.max(axis=3))
    np.testing.assert_array_equal(indices, (blocks.argmax(axis=3) + 0.1).astype(np.float32))
    (unpooled,) = tflite_custom.max_unpooling(values, indices, opts)
    first = np.zeros_like(blocks)
    np.put_along_axis(first, blocks.argmax(axis=3)[:, :, :, None], 1, axis=3)
    expected = (blocks * first).reshape(2, 3, 2, 2, 2, 3).transpose(0, 1, 3, 2, 4, 5).reshape(x.shape)
    np.testing.assert_array_equal(unpooled, expected)


def test_an_unsupported_custom_op_names_itself_and_the_cut_before_it(tmp_path):
    path = tflite_models.with_unknown_custom_op(tmp_path)
    with pytest.raises(UserError) as err:
        tf_frontend.convert(path, "tflite", INPUTS, None)
    message, hint = err.value.message, err.value.hint
    assert "TransformTensorNearest (the operator writing 'warped')" in message
    assert "Convolution2DTransposeBias" in message  # what it can lower
    assert 'model.outputs: ["side", "relu"]' in hint  # the independent output, and the op's input


def test_the_suggested_cut_converts_and_is_proved_on_the_cut(tmp_path):
    """The interpreter cannot run the whole model (an unresolved custom op), so the source is
    run cut at the same tensors as the ONNX model."""
    path = tflite_models.with_unknown_custom_op(tmp_path)
    x = np.random.default_rng(6).normal(0, 1, (1, 4, 4, 2)).astype(np.float32)
    outputs = ["side", "relu"]
    source = tf_frontend.run_source(path, "tflite", {"x": x}, INPUTS, outputs)
    np.testing.assert_allclose(source[1], np.maximum(x, 0))
    np.testing.assert_allclose(source[0], np.tanh(x), rtol=1e-6)
    _, got = _lowered(path, x, outputs)
    _assert_close(source, got)


def test_options_that_do_not_fit_the_struct_are_a_user_error(tmp_path):
    path = tflite_models.pool_unpool(tmp_path, (4, 4), 2, 2, VALID)
    good = tflite_models.c_struct(VALID, 2, 2, 2, 2, 0)
    path.write_bytes(path.read_bytes().replace(good, tflite_models.c_struct(7, 2, 2, 2, 2, 0)))
    with pytest.raises(UserError, match="custom op 'MaxPoolingWithArgmax2D'.*unknown padding 7"):
        tf_frontend.convert(path, "tflite", INPUTS, None)


def test_a_cut_at_an_inner_input_is_converted_and_run_from_there(tmp_path):
    """``model.inputs`` naming an inner tensor cuts the model there: the RELU before it is gone
    from both the ONNX model and the source run, which is fed at that tensor."""
    path = tflite_models.transpose_conv(tmp_path, (8, 8), 3, 2, SAME, custom=True)
    inputs = [InputSpec(name="relu", shape=[1, 8, 8, 4])]
    model = tf_frontend.convert(path, "tflite", inputs, None)
    assert [i.name for i in model.graph.input] == ["relu"]
    assert "Relu" not in {n.op_type for n in model.graph.node}
    x = np.random.default_rng(7).normal(0, 1, (1, 8, 8, 4)).astype(np.float32)  # negatives too
    source = tf_frontend.run_source(path, "tflite", {"relu": x}, inputs, None)
    _assert_close(source, list(run(model, {"relu": x}).values()))


ATTENTION_INPUTS = [InputSpec(name="x"), InputSpec(name="pts"), InputSpec(name="local")]


def _attention_feeds(seed: int, points: int, size: tuple[int, int]) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"x": rng.normal(0, 1, (1, *size, 4)).astype(np.float32),
            "pts": np.concatenate([rng.uniform(2, min(size) - 2, (1, points, 2)),
                                   rng.normal(0, 1, (1, points, 1))], -1).astype(np.float32),
            "local": rng.uniform(0, 8, (1, 5, 2)).astype(np.float32)}


@pytest.mark.parametrize("seed, target, crop, size", [
    (0, 0.0, (8, 8), (24, 24)), (1, 0.3, (6, 10), (20, 28)), (2, None, (8, 8), (16, 16))])
def test_attention_mesh_ops_lower_to_their_reference(tmp_path, seed, target, crop, size):
    """MediaPipe's face mesh with attention (Landmarks2TransformMatrix, TransformTensorBilinear,
    TransformLandmarks; flexbuffer options, one op with none) converts, and the ONNX model
    equals the source run, whose custom ops are their numpy references."""
    path = tflite_models.attention_crop(tmp_path, 12, [0, 3, 5, 7, 9, 11], (2, 8), crop, size,
                                        target)
    feeds = _attention_feeds(seed, 12, size)
    source = tf_frontend.run_source(path, "tflite", feeds, ATTENTION_INPUTS, None)
    model = tf_frontend.convert(path, "tflite", ATTENTION_INPUTS, None)
    assert "GridSample" in {n.op_type for n in model.graph.node}
    assert not {n.op_type for n in model.graph.node} & {f"TFL_{op}" for op in tflite_custom.CUSTOM_OPS}
    _assert_close(source, list(run(model, feeds).values()), tolerance=1e-4)
    assert np.count_nonzero(source[1]) > source[1].size // 2  # the crop reads the map


def test_attention_references_agree_with_the_geometry_they_describe():
    """Independent of the formulas: a level pair of rotation landmarks and a subset spanning
    [4, 12] x [6, 10] give a crop 1.5 times that box around its centre; the bilinear crop of a
    map linear in x and y is that map at the crop's pixel centres, zero where they fall out;
    landmarks move by the matrix's first two rows."""
    points = np.zeros((1, 4, 3), np.float32)
    points[0, :, :2] = [[4, 6], [12, 6], [4, 10], [12, 10]]
    opts = {"left_rotation_idx": 0, "right_rotation_idx": 1, "output_height": 4,
            "output_width": 8, "scale_x": 1.5, "scale_y": 1.5, "subset_idxs": [0, 3, 1, 2],
            "target_rotation_radians": 0.0}
    (matrix,) = tflite_custom.landmarks_to_transform_matrix(points, opts)
    # crop pixel (0, 0) at the box's corner less a quarter: centre (8, 8), extent 12 x 6
    np.testing.assert_allclose(matrix[0], [[1.5, 0, 0, 2], [0, 1.5, 0, 5], [0, 0, 1, 0],
                                           [0, 0, 0, 1]], atol=1e-6)
    yy, xx = np.mgrid[0:16, 0:16].astype(np.float32)
    ramp = np.stack([xx, yy, xx + 2 * yy, np.ones_like(xx)], -1)[None]
    (crop,) = tflite_custom.transform_tensor_bilinear(ramp, matrix, opts)
    py, px = np.mgrid[0:4, 0:8]
    np.testing.assert_allclose(crop[0, ..., 0], 2 + 1.5 * (px + 0.5) - 0.5, atol=1e-5)
    np.testing.assert_allclose(crop[0, ..., 1], 5 + 1.5 * (py + 0.5) - 0.5, atol=1e-5)
    far = matrix.copy()
    far[0, 0, 3] = 20.0  # every point right of the map: zeros
    assert not tflite_custom.transform_tensor_bilinear(ramp, far, opts)[0].any()
    local = np.array([[[0, 0, 7], [8, 4, 9]]], np.float32)
    (moved,) = tflite_custom.transform_landmarks(local, matrix, {})
    np.testing.assert_allclose(moved[0], [[2, 5, 7], [14, 11, 9]], atol=1e-6)
    turned = points[:, [1, 0, 3, 2]]  # right and left swapped: the crop turned by pi
    (flipped,) = tflite_custom.landmarks_to_transform_matrix(turned, {**opts, "left_rotation_idx": 0,
                                                                       "right_rotation_idx": 1})
    np.testing.assert_allclose(flipped[0, :2, :2], [[-1.5, 0], [0, -1.5]], atol=1e-6)
