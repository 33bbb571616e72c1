"""GPTQ weight rounding (`npubuild.quant.rounding`): the Gram matrix it reads is the conv's own
patches, it lowers a layer's output error below nearest rounding on inputs it never saw, and
it changes nothing else about the quantized graph."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from npubuild import onnx_io
from npubuild.quant import calibrators, rounding
from tests.unit.quant.helpers import check_against_ort, model, quantize

GEOMETRIES = [  # (kernel, stride, dilation, ONNX pads [top, left, bottom, right], group)
    ([3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 1),
    ([3, 3], [2, 2], [1, 1], [0, 1, 1, 0], 1),
    ([3, 2], [1, 2], [2, 1], [2, 0, 1, 1], 2),
    ([3, 3], [1, 1], [1, 1], [1, 1, 1, 1], 4),   # depthwise
]


@pytest.mark.parametrize("kernel,stride,dilation,pads,group", GEOMETRIES)
def test_patch_gram_is_the_gram_of_what_the_conv_multiplies(kernel, stride, dilation, pads, group):
    """Σ over output positions of (w · patch)² equals w H wᵀ for every output channel: the
    patches are gathered in the weight's own (cin, kh, kw) order, with the conv's padding."""
    rng = np.random.default_rng(1)
    cin, cout = 4, 4
    w = rng.normal(0, 1, (cout, cin // group, *kernel)).astype(np.float32)
    x = rng.normal(0, 1, (2, cin, 9, 8)).astype(np.float32)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], kernel_shape=kernel, strides=stride,
                            dilations=dilation, pads=pads, group=group)
    y = onnx_io.run(onnx_io.session(model([conv], {"x": list(x.shape)}, {"y": None}, {"w": w})),
                    {"x": x})["y"].astype(np.float64)
    geometry = rounding.Geometry(False, tuple(kernel), tuple(stride), tuple(dilation),
                                 (pads[0], pads[2], pads[1], pads[3]), group)
    gram = rounding.PatchGram(geometry)
    gram.update(x)
    per_group = cout // group
    for o in range(cout):
        flat = w[o].reshape(-1).astype(np.float64)
        h = gram.grams[o // per_group]
        assert flat @ h @ flat == pytest.approx(float((y[:, o] ** 2).sum()), rel=1e-5)


def correlated_inputs(n, rng):
    """Smooth images (neighbouring pixels alike), as trained features are."""
    noise = rng.normal(0, 1, (n, 3, 20, 20))
    kernel = np.ones(5) / 5
    smooth = np.apply_along_axis(lambda r: np.convolve(r, kernel, "same"), 3, noise)
    smooth = np.apply_along_axis(lambda r: np.convolve(r, kernel, "same"), 2, smooth)
    return (smooth * 3 + 0.5).astype(np.float32)


def test_gptq_keeps_a_conv_output_closer_to_float_than_nearest_on_unseen_inputs():
    rng = np.random.default_rng(2)
    w = rng.normal(0, 0.2, (8, 3, 3, 3))
    w[:, :, 1, 1] *= 6    # a few large weights set the per-channel step for all
    calibration, unseen = correlated_inputs(16, rng), correlated_inputs(8, rng)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])
    m = model([conv], {"x": [1, 3, 20, 20]}, {"y": [1, 8, 20, 20]}, {"w": w})
    feeds = [{"x": x[None]} for x in calibration]
    errors = {}
    for method in ("nearest", "gptq"):
        qg, _, _ = quantize(m, feeds, weight_rounding=method)
        layer = qg.layers[0]
        wq = layer.arrays["weight"] * np.asarray(layer.params["weight_scale"])[:, None, None, None]
        assert np.abs(layer.arrays["weight"]).max() <= rounding.WEIGHT_BOUND
        sess = onnx_io.session(model([conv], {"x": [1, 3, 20, 20]}, {"y": None}, {"w": wq}))
        errors[method] = sum(
            float(((onnx_io.run(sess, {"x": x[None]})["y"] - onnx_io.run(onnx_io.session(m), {"x": x[None]})["y"]) ** 2).sum())
            for x in unseen)
    assert errors["gptq"] < 0.7 * errors["nearest"], errors


def test_gptq_rounded_graph_still_matches_onnx_runtime_bit_for_bit():
    """Only the integers of the weights change: the integer reference and ORT's QDQ model
    still agree, and the deployed graph stays close to float."""
    rng = np.random.default_rng(3)
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], name="conv", pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["r"], name="relu"),
             helper.make_node("Conv", ["r", "w2"], ["y"], name="conv2", group=2)]
    m = model(nodes, {"x": [1, 3, 20, 20]}, {"y": [1, 4, 20, 20]},
              {"w": rng.normal(0, 0.3, (4, 3, 3, 3)), "b": rng.normal(0, 0.1, 4),
               "w2": rng.normal(0, 0.3, (4, 2, 1, 1))})
    feeds = [{"x": x[None]} for x in correlated_inputs(4, rng)]
    qg, cc, cos = check_against_ort(m, feeds, scheme="asymmetric", weight_rounding="gptq")
    nearest, _, _ = quantize(m, feeds, scheme="asymmetric", weight_rounding="nearest")
    assert any(not np.array_equal(a.arrays["weight"], b.arrays["weight"])
               for a, b in zip(qg.layers, nearest.layers) if a.kind == "conv")
    assert cc.ok, cc
    assert cos > 0.99


def test_batches_merged_in_order_add_up_to_one_pass():
    """Calibration's batches (on Dask workers or not) merge into the Gram matrix of all their
    samples."""
    rng = np.random.default_rng(4)
    geometry = rounding.Geometry(False, (3, 3), (1, 1), (1, 1), (1, 1, 1, 1), 1)
    xs = [rng.normal(0, 1, (1, 2, 6, 6)).astype(np.float32) for _ in range(4)]

    def stats_of(samples):
        stats = calibrators.TensorStats(channel_axis=1)
        stats.patch_grams[geometry] = rounding.PatchGram(geometry)
        for x in samples:
            stats.update(x)
        return stats

    batches = [stats_of(xs[:2]), stats_of(xs[2:])]
    merged = stats_of([])
    for batch in batches:
        merged.merge(batch)
    np.testing.assert_allclose(merged.patch_grams[geometry].grams[0],
                               stats_of(xs).patch_grams[geometry].grams[0], rtol=1e-12)


def test_inputs_that_were_always_zero_leave_nearest_rounding():
    rng = np.random.default_rng(5)
    w = rng.normal(0, 1, (3, 12))
    scale = np.abs(w).max(axis=1) / 127
    np.testing.assert_array_equal(rounding.gptq(w, np.zeros((12, 12)), scale),
                                  rounding.nearest(w, scale))


def test_large_layers_keep_nearest_rounding_without_a_gram_matrix():
    """A fully connected layer past MAX_GRAM_INPUTS inputs gathers no K² matrix."""
    class Layer:
        weights = {"weight": np.zeros((2, rounding.MAX_GRAM_INPUTS + 1, 1, 1))}
    assert not rounding.wants_gram(Layer)
    Layer.weights = {"weight": np.zeros((2, 8, 3, 3))}
    assert rounding.wants_gram(Layer)


def test_a_layer_calibrated_on_too_few_patches_keeps_nearest_rounding():
    """A 3x3 conv with stride 3 on a 3x3 map sees one patch per sample: four samples cannot
    tell GPTQ which of its 18 inputs' directions matter, so it rounds to nearest."""
    rng = np.random.default_rng(6)
    conv = helper.make_node("Conv", ["x", "w"], ["y"], strides=[3, 3])
    m = model([conv], {"x": [1, 2, 3, 3]}, {"y": [1, 5, 1, 1]}, {"w": rng.normal(0, 1, (5, 2, 3, 3))})
    feeds = [{"x": rng.normal(0, 1, (1, 2, 3, 3)).astype(np.float32)} for _ in range(4)]
    gptq, _, _ = quantize(m, feeds, weight_rounding="gptq")
    nearest, _, _ = quantize(m, feeds, weight_rounding="nearest")
    np.testing.assert_array_equal(gptq.layers[0].arrays["weight"], nearest.layers[0].arrays["weight"])
    many = [{"x": rng.normal(0, 1, (1, 2, 3, 3)).astype(np.float32)}
            for _ in range(rounding.MIN_PATCHES_PER_INPUT * 18)]
    gptq, _, _ = quantize(m, many, weight_rounding="gptq")
    assert not np.array_equal(gptq.layers[0].arrays["weight"], nearest.layers[0].arrays["weight"])


@pytest.mark.parametrize("k,rows,groups", [(9, 1, 96), (25, 3, 7), (128, 2, 4), (129, 2, 3)])
def test_groups_rounded_together_get_the_integers_each_gets_alone(k, rows, groups):
    """A depthwise conv's hundreds of groups are rounded in one stacked sweep: each group's
    integers are bit for bit what `gptq` gives it alone (stacked LAPACK factorisations per
    matrix, element-wise column updates), past one column block too (each on its own)."""
    rng = np.random.default_rng(7)
    grams = []
    for _ in range(groups):
        x = rng.normal(0, 1, (4 * k + 9, k)) @ rng.normal(0, 1, (k, k))
        grams.append(x.T @ x)
    weights = rng.normal(0, 0.3, (groups, rows, k))
    scales = np.abs(weights).max(axis=2) / 127
    alone = np.stack([rounding.gptq(w, h, s) for w, h, s in zip(weights, grams, scales)])
    together = rounding.grouped_gptq(weights, grams, scales)
    assert together.dtype == alone.dtype
    np.testing.assert_array_equal(together, alone)
    assert not np.array_equal(alone, np.stack([rounding.nearest(w, s)
                                               for w, s in zip(weights, scales)]))


def test_a_group_never_excited_keeps_nearest_rounding_beside_groups_rounded_together():
    rng = np.random.default_rng(8)
    x = rng.normal(0, 1, (50, 9))
    grams = [x.T @ x, np.zeros((9, 9)), x.T @ x]
    weights = rng.normal(0, 0.3, (3, 1, 9))
    scales = np.abs(weights).max(axis=2) / 127
    together = rounding.grouped_gptq(weights, grams, scales)
    np.testing.assert_array_equal(together[1], rounding.nearest(weights[1], scales[1]))
    np.testing.assert_array_equal(together[0], rounding.gptq(weights[0], grams[0], scales[0]))


def test_a_layer_gptq_cannot_round_is_rounded_to_nearest_once_per_scale():
    """The search quantizes every layer again under each choice: a layer whose Gram matrix
    saw too few patches gets the integers it got the first time (nearest rounding's), not a
    new rounding; other scales are rounded anew."""
    class Layer:
        name = "conv"

    rng = np.random.default_rng(9)
    w = rng.normal(0, 0.3, (4, 2, 3, 3))
    scale = np.abs(w).reshape(4, -1).max(axis=1) / 127
    gram = rounding.PatchGram(rounding.Geometry(False, (3, 3), (1, 1), (1, 1), (0, 0, 0, 0), 1))
    gram.update(rng.normal(0, 1, (1, 2, 3, 3)))  # one patch: too few for 18 inputs
    first = rounding.rounded_weights(Layer, w, scale, gram)
    np.testing.assert_array_equal(first, rounding.nearest(w, scale))
    assert rounding.rounded_weights(Layer, w, scale.copy(), gram) is first
    wider = rounding.rounded_weights(Layer, w, scale * 2, gram)
    np.testing.assert_array_equal(wider, rounding.nearest(w, scale * 2))


@pytest.mark.parametrize("k", [144, 576])
def test_gptq_factors_do_not_depend_on_the_blas_thread_count(k):
    """From K = 144 LAPACK's blocked factorisations on two BLAS threads gave other last bits
    than on one, so GPTQ's integers could depend on the cores of the machine that built."""
    threadpoolctl = pytest.importorskip("threadpoolctl")
    rows = np.random.default_rng(0).standard_normal((4 * k, k))
    gram = rows.T @ rows + 0.01 * np.eye(k)
    factors = []
    for threads in (1, 2):
        with threadpoolctl.threadpool_limits(threads, "blas"):
            factors.append(rounding._inverse_upper_factors(gram))
    np.testing.assert_array_equal(factors[0], factors[1])
