"""Where int8 loses a model and what the quantizer does about it: ties rounded as ONNX Runtime
rounds them, int16 for tensors that underflow int8 and for steep lookup tables, and an output
concat of unlike slices kept at its inputs' scales."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from npubuild import metrics, onnx_io
from npubuild.quant.reference import quantize_inputs, run_quantized, run_reference
from tests.unit.quant.helpers import check_against_ort, model, quantize


def _resize_x2():
    return model([helper.make_node("Resize", ["x", "", "sc"], ["y"], mode="linear",
                                   coordinate_transformation_mode="asymmetric")],
                 {"x": [1, 2, 6, 6]}, {"y": None},
                 {"sc": np.array([1, 1, 2, 2], np.float32)})


@pytest.mark.parametrize("scheme", ["symmetric", "asymmetric"])
def test_ties_differ_from_onnxruntime_only_by_float32_and_are_counted_apart(scheme):
    """A ×2 resize keeps its input's range, so ``(3a + b) / 4`` ties are everywhere. With a
    float scale ORT's float32 lands a hair either side of each tie: every difference is one
    step on a tie, which the cross-check counts apart (it passes), never a real error."""
    m = _resize_x2()
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.integers(-60, 60, (1, 2, 6, 6)).astype(np.float32) / 16} for _ in range(3)]
    qg, cc, _ = check_against_ort(m, feeds, scheme=scheme)
    assert cc.tie_fraction > 0.01, cc.summary()
    assert cc.identical_fraction + cc.tie_fraction == 1.0 and cc.max_lsb == 1 and cc.ok


def test_pow2_ties_agree_with_onnxruntime_exactly():
    """Power-of-two scales: float32 is exact, every tie is a tie for ORT too (the export
    nudges them up), so nothing differs."""
    m = _resize_x2()
    rng = np.random.default_rng(1)
    feeds = [{"x": rng.integers(-60, 60, (1, 2, 6, 6)).astype(np.float32) / 16} for _ in range(3)]
    qg, cc, _ = check_against_ort(m, feeds, scheme="pow2_symmetric")
    assert cc.elements > 0 and cc.identical_fraction == 1.0, cc.summary()


def _cosine(m, qg, feeds, name="y", skip: int = 0):
    """Mean cosine of ``name`` against float, over the elements after the first ``skip``."""
    sess = onnx_io.session(m)
    cos = []
    for f in feeds:
        env = run_reference(qg, quantize_inputs(qg, f))
        t = qg.tensors[name]
        got = env[name] if t.is_float else (env[name].astype(np.float64) - t.zero_point) * t.scale
        ref = onnx_io.run(sess, f)[name]
        cos.append(metrics.similarity(ref.ravel()[skip:], np.ravel(got)[skip:]).cosine)
    return float(np.mean(cos))


def _tiny_with_outlier(shape, n=4, seed=0):
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        x = rng.normal(0, 0.01, shape).astype(np.float32)
        x.flat[0] = 6.0
        out.append({"x": x})
    return out


def test_a_tensor_that_underflows_int8_becomes_int16_on_int16_chips():
    """Squeeze-excite-like: values ~0.01 beside one 6.0 are 0 or 1 step in int8."""
    m = model([helper.make_node("Mul", ["x", "k"], ["h"]), helper.make_node("Relu", ["h"], ["y"])],
              {"x": [1, 4, 8, 8]}, {"y": None}, {"k": np.array(1.5, np.float32)})
    feeds = _tiny_with_outlier([1, 4, 8, 8])
    narrow, _, _ = quantize(m, feeds)
    wide, _, _ = quantize(m, feeds, int16_underflow=True)
    assert narrow.tensors["h"].dtype == "int8" and wide.tensors["h"].dtype == "int16"
    assert _cosine(m, wide, feeds, skip=1) > 0.999 > _cosine(m, narrow, feeds, skip=1)


def test_a_score_map_of_tiny_scores_beside_rare_detections_becomes_int16():
    """A detector's Sigmoid score map: 99 % of the scores near 1e-3, 1 % near 0.9. Their mean
    (0.01) is above two int8 steps of [0, 0.9], so the old mean-based rule kept the map in int8
    and every small score rounded to 0 or 1 step; the median (1e-3) is under half a step."""
    m = model([helper.make_node("Sigmoid", ["x"], ["y"])], {"x": [1, 1, 40, 40]}, {"y": None})
    rng = np.random.default_rng(3)
    feeds = []
    for _ in range(3):
        x = rng.normal(-7.0, 0.4, (1, 1, 40, 40)).astype(np.float32)
        x.flat[rng.choice(x.size, 16, replace=False)] = 2.5
        feeds.append({"x": x})
    wide, _, _ = quantize(m, feeds, scheme="asymmetric", int16_underflow=True)
    assert wide.tensors["y"].dtype == "int16"
    narrow, _, _ = quantize(m, feeds, scheme="asymmetric")
    background = [f["x"] < 0 for f in feeds]
    err = lambda qg: max(np.abs(run_quantized(qg, f)["y"] - 1 / (1 + np.exp(-f["x"])))[b].max()  # noqa: E731
                         / 1e-3 for f, b in zip(feeds, background))
    assert err(wide) < 0.1 < 0.5 < err(narrow)  # relative to a typical background score


def test_a_steep_lookup_table_reads_int16():
    """Sigmoid of logits around -14: an int8 input step of ~0.16 is a 16 % output error."""
    m = model([helper.make_node("Sigmoid", ["x"], ["y"])], {"x": [1, 64]}, {"y": None})
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.uniform(-20, -8, (1, 64)).astype(np.float32)} for _ in range(4)]
    narrow, _, _ = quantize(m, feeds)
    wide, _, _ = quantize(m, feeds, int16_underflow=True)
    assert narrow.tensors["x"].dtype == "int8" and wide.tensors["x"].dtype == "int16"
    # an int16 table, over the span of input integers where its output changes
    table, lo = wide.layers[0].arrays["table"], wide.layers[0].params["table_lo"]
    assert 256 < table.size <= 65536 and -32768 <= lo and lo + table.size - 1 <= 32767
    assert _cosine(m, wide, feeds) > 0.9999 > _cosine(m, narrow, feeds)


def test_output_concat_of_unlike_slices_keeps_each_slice_at_its_own_scale():
    """YOLO's output: boxes in pixels beside scores in [0, 1]. One scale zeroes the scores."""
    m = model([helper.make_node("Mul", ["x", "k"], ["box"]), helper.make_node("Sigmoid", ["x"], ["s"]),
               helper.make_node("Concat", ["box", "s"], ["y"], axis=1)],
              {"x": [1, 4, 16]}, {"y": [1, 8, 16]}, {"k": np.array(300.0, np.float32)})
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.uniform(-1, 1, (1, 4, 16)).astype(np.float32)} for _ in range(3)]
    qg, _, _ = quantize(m, feeds)
    concat = next(layer for layer in qg.layers if "Concat" in layer.name)
    assert concat.device == "cpu" and "own scale" in concat.attrs["reason"]
    assert [qg.tensors[t].dtype for t in ("box", "s")] == ["int8", "int8"]
    sess = onnx_io.session(m)
    for f in feeds:
        ref = onnx_io.run(sess, f)["y"]
        got = run_reference(qg, quantize_inputs(qg, f))["y"]
        assert metrics.similarity(ref[:, 4:], got[:, 4:]).cosine > 0.999


def test_int16_qdq_export_converts_old_opset_cpu_fragments():
    """int16 Q/DQ needs opset 21; an opset-13 ReduceMean (axes as an attribute) on the CPU
    must be rewritten to that opset, or ONNX Runtime refuses the QDQ model."""
    from npubuild.quant import qdq

    m = model([helper.make_node("Mul", ["x", "k"], ["h"]),
               helper.make_node("ReduceMean", ["h"], ["y"], axes=[2], keepdims=1)],
              {"x": [1, 4, 8, 8]}, {"y": None}, {"k": np.array(1.5, np.float32)}, opset=13)
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.uniform(-1, 1, (1, 4, 8, 8)).astype(np.float32)} for _ in range(2)]
    qg, _, _ = quantize(m, feeds, int16_tensors=frozenset({"h"}))
    assert qg.tensors["h"].dtype == "int16" and qg.layers[-1].kind == "float"
    onnx_io.session(qdq.export_qdq(qg))
    onnx_io.session(qdq.layerwise_qdq(qg)[0])


def test_an_output_channel_int8_would_hand_on_as_a_constant_becomes_int16():
    """PP-OCRv4 rec's AveragePool hand-over: most channels span ~2, a few only ~0.01 (between a
    quarter step and a step of int8): int8 makes those constant (dead), int16 keeps them."""
    m = model([helper.make_node("AveragePool", ["x"], ["y"], kernel_shape=[2, 2], strides=[2, 2])],
              {"x": [1, 4, 8, 8]}, {"y": [1, 4, 4, 4]})
    rng = np.random.default_rng(2)
    feeds = []
    for _ in range(3):
        x = rng.uniform(-2, 2, (1, 4, 8, 8)).astype(np.float32)
        checker = np.indices((8, 8)).sum(axis=0) % 2 * 0.2 - 0.1   # cancels in every window
        x[0, 3] = 0.5 + checker + rng.uniform(0, 0.01, (8, 8))  # pooled: ~half an int8 step
        feeds.append({"x": x})
    narrow, _, _ = quantize(m, feeds)
    wide, _, _ = quantize(m, feeds, int16_underflow=True)
    assert narrow.tensors["y"].dtype == "int8" and wide.tensors["y"].dtype == "int16"
    got = [run_reference(wide, quantize_inputs(wide, f))["y"][0, 3] for f in feeds]
    assert all(np.ptp(g) > 0 for g in got)               # the quiet channel still varies


def test_int16_product_of_offset_ranges_stays_inside_int64():
    """An asymmetric int16 tensor of positive values has its zero point at qmin, so
    ``q - zp`` spans 65535 steps, not 32767: the multiplier width must allow for the product
    of two such spans. Calibrated where the factors never peak together, a sample where they
    do used to overflow int64 in the integer reference; now it saturates at the range."""
    m = model([helper.make_node("Mul", ["a", "b"], ["y"])], {"a": [1, 2], "b": [1, 2]},
              {"y": [1, 2]})
    calibration = [{"a": np.array([[3.0, 1.0]], np.float32), "b": np.array([[1.0, 1.7]], np.float32)}]
    qg, _, _ = quantize(m, calibration, scheme="asymmetric",
                        int16_tensors=frozenset({"a", "b", "y"}))
    assert qg.tensors["a"].zero_point == qg.tensors["b"].zero_point == -32768
    both_high = {"a": np.array([[3.0, 1.0]], np.float32), "b": np.array([[1.7, 1.0]], np.float32)}
    y = run_quantized(qg, both_high, ["y"])["y"]
    np.testing.assert_allclose(y, [[3.0, 1.0]], rtol=1e-3)  # 5.1 saturates at y's range, 3.0


def test_the_tie_band_widens_for_int16_as_float32_resolution_does():
    """ORT sums float32 terms as large as the tensor's range: for an int16 tensor that is
    resolved only to ~0.008 step per ulp (Keras MobileNetV3Small's int16 input rescaling had
    1.6 % of its elements one step off, all within 2e-3 steps of a tie); int8 keeps 1e-3."""
    from npubuild.quant.check import TIE_TOLERANCE, tie_band

    assert tie_band(255) == TIE_TOLERANCE
    assert 1.91e-3 < tie_band(65535) < 0.05


def test_a_square_kept_in_float_reads_its_one_input_once():
    """``x · x`` (a Pow 2 written as Mul) moved to the CPU by a float override: its one-node
    model takes ``x`` once (twice was a duplicate graph input ONNX Runtime refuses), and the
    QDQ export and the reference both run it."""
    m = model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Mul", ["r", "r"], ["sq"]),
               helper.make_node("Add", ["sq", "x"], ["y"])], {"x": [1, 2, 4, 4]}, {"y": None})
    feeds = [{"x": np.random.default_rng(k).normal(0, 1, (1, 2, 4, 4)).astype(np.float32)}
             for k in range(2)]
    qg, _, _ = quantize(m, feeds, float_tensors=frozenset({"sq"}))
    assert [layer.kind for layer in qg.layers if layer.outputs == ["sq"]] == ["float"]
    from npubuild.quant.qdq import export_qdq

    session = onnx_io.session(export_qdq(qg))
    ref = onnx_io.run(onnx_io.session(m), feeds[0])["y"]
    got = run_quantized(qg, feeds[0])["y"]
    assert metrics.similarity(ref, got).cosine > 0.99
    assert metrics.similarity(ref, onnx_io.run(session, feeds[0])["y"]).cosine > 0.99


@pytest.mark.parametrize("scheme", ["symmetric", "asymmetric", "pow2_symmetric"])
@pytest.mark.parametrize("granularity", ["per_channel", "per_tensor"])
def test_a_large_bias_beside_an_int16_input_fits_int32(scheme, granularity):
    """An int16 input's scale is 256 times finer than int8's, so ``b / (s_x · s_w)`` of a bias
    that fits beside int8 activations leaves int32 beside int16 ones (MediaPipe's pose
    detector saturated two channels to 2^31 - 1). The weight scale widens where the bias needs
    it: the bias stays exact and the output keeps the float model's values."""
    w = np.full((2, 4, 1, 1), 1e-3, np.float32)
    m = model([helper.make_node("Conv", ["x", "w", "b"], ["y"])], {"x": [1, 4, 4, 4]},
              {"y": None}, {"w": w, "b": np.array([400.0, -0.5], np.float32)})
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.uniform(-2, 2, (1, 4, 4, 4)).astype(np.float32)} for _ in range(3)]
    qg, _, _ = quantize(m, feeds, scheme=scheme, granularity=granularity,
                        int16_tensors=frozenset({"x", "y"}))
    assert qg.tensors["x"].dtype == "int16"
    conv = next(layer for layer in qg.layers if layer.kind == "conv")
    assert np.abs(conv.arrays["bias"].astype(np.int64)).max() < 2**31 - 1
    assert _cosine(m, qg, feeds) > 0.9999


def _squeeze_excite(seed=0):
    """Conv → Relu → Conv → Sigmoid (a squeeze-excite block's tail), random weights."""
    rng = np.random.default_rng(seed)
    return model([helper.make_node("Conv", ["x", "w1", "b1"], ["c"]),
                  helper.make_node("Relu", ["c"], ["h"]),
                  helper.make_node("Conv", ["h", "w2", "b2"], ["z"]),
                  helper.make_node("Sigmoid", ["z"], ["y"])],
                 {"x": [1, 4, 6, 6]}, {"z": None, "y": None},
                 {"w1": rng.normal(0, 0.5, (8, 4, 1, 1)), "b1": rng.normal(0, 0.1, 8),
                  "w2": rng.normal(0, 0.5, (4, 8, 1, 1)), "b2": rng.normal(0, 0.1, 4)})


def test_int16_keeps_headroom_for_an_image_past_every_calibration_image():
    """MediaPipe's landscape selfie model on coins.png: calibration photos whose extremes
    differ, a verify photo past all of them (a squeeze-excite conv at -10.8 where calibration
    saw -6.1). int16 took int8's observed range and saturated exactly where int8 does, so
    int16 everywhere could not pass (0.798, ONNX Runtime's int16 QDQ too); now int16 reaches
    past the range as far as the calibration samples' extremes spread."""
    m = _squeeze_excite()
    rng = np.random.default_rng(1)
    calibration = [{"x": rng.uniform(-s, s, (1, 4, 6, 6)).astype(np.float32)}
                   for s in (0.5, 0.7, 0.85, 1.0)]
    unseen = [{"x": rng.uniform(-1.2, 1.2, (1, 4, 6, 6)).astype(np.float32)} for _ in range(2)]
    everything = frozenset({"x", "c", "h", "z", "y"})
    qg, _, _ = quantize(m, calibration, scheme="asymmetric", int16_tensors=everything)
    assert {qg.tensors[t].dtype for t in ("x", "h", "z", "y")} == {"int16"}
    assert _cosine(m, qg, unseen, name="z") > 0.99995         # was 0.9973: saturated
    assert _cosine(m, qg, calibration, name="z") > 0.99999  # one bit of 16 spent on headroom


def test_int16_headroom_stops_where_the_function_does():
    """A Sigmoid's int16 output range never reaches past (0, 1), a Relu6's past 6, however far
    the samples' extremes spread: a value the layer cannot produce is a waste of steps."""
    m = model([helper.make_node("Sigmoid", ["x"], ["s"]),
               helper.make_node("Clip", ["x", "lo", "hi"], ["r"]),
               helper.make_node("Add", ["s", "r"], ["y"])],
              {"x": [1, 64]}, {"y": None}, {"lo": np.float32(0.0), "hi": np.float32(6.0)})
    rng = np.random.default_rng(0)
    calibration = [{"x": rng.uniform(-8, s, (1, 64)).astype(np.float32)} for s in (1.0, 7.0)]
    qg, _, _ = quantize(m, calibration, scheme="asymmetric",
                        int16_tensors=frozenset({"x", "s", "r", "y"}))
    top = {t: (qg.tensors[t].params.qmax - qg.tensors[t].zero_point) * qg.tensors[t].scale
           for t in ("x", "s", "r")}
    assert top["x"] > 12.0                            # the input reaches past 7 (to 13)
    assert 0.99 < top["s"] <= 1.0 + 1e-4 and 5.99 < top["r"] <= 6.0 + 1e-3


def test_a_tensor_int16_holds_on_loud_samples_but_not_on_a_quiet_one_is_quiet_in_int16():
    """``Quantizer.quiet_in_int16``: the quietest calibration sample's median |x| under two
    int16 steps of the range the loudest sample needs, the loudest's over. A square of
    Gaussian noise (a power spectrum's bins) at amplitudes 1 and 1/500 is; the same at 1 and
    1/2 is not, nor a ReLU's output (its zeros are no sample's typical value)."""
    from npubuild.quant import calibrate, quantizer

    m = model([helper.make_node("Mul", ["x", "x"], ["power"]),
               helper.make_node("Relu", ["x"], ["h"]),
               helper.make_node("Add", ["power", "h"], ["y"])], {"x": [1, 4, 16, 16]},
              {"y": None})
    rng = np.random.default_rng(0)

    def named(loudness):
        feeds = [{"x": (a * rng.standard_normal((1, 4, 16, 16))).astype(np.float32)}
                 for a in loudness]
        _, fg, probe = quantize(m, feeds, scheme="asymmetric")
        stats = calibrate.observe(fg, probe, feeds, "minmax")
        q = quantizer.Quantizer(fg, stats, quantizer.QuantConfig(scheme="asymmetric"))
        return {t for t in ("power", "h") if q.quiet_in_int16(t)}

    assert named((1.0, 1.0 / 500, 0.5)) == {"power"}
    assert named((1.0, 0.5, 0.7)) == set()


def test_a_tensor_whose_few_loud_channels_set_its_range_is_coarse_in_int16():
    """``Quantizer.coarse_in_int16``: the loudest calibration sample's median |x| under 16
    int16 steps. A stream of 64 channels one of which is 30,000 times louder (a transformer's
    residual stream with an outlier channel; flan-t5's reach 1e5 where half its values sit
    under 50) is, on every sample alike (no quiet sample: `quiet_in_int16` does not name
    it); the same stream with that channel 30 times louder is not, nor a ReLU's output."""
    from npubuild.quant import calibrate, quantizer

    rng = np.random.default_rng(0)

    def named(loud):
        gain = np.ones(64, np.float32)
        gain[5] = loud
        m = model([helper.make_node("Mul", ["x", "gain"], ["stream"]),
                   helper.make_node("Relu", ["x"], ["h"]),
                   helper.make_node("Add", ["stream", "h"], ["y"])], {"x": [1, 16, 64]},
                  {"y": None}, {"gain": gain})
        feeds = [{"x": rng.standard_normal((1, 16, 64)).astype(np.float32)} for _ in range(4)]
        _, fg, probe = quantize(m, feeds, scheme="asymmetric")
        stats = calibrate.observe(fg, probe, feeds, "minmax")
        q = quantizer.Quantizer(fg, stats, quantizer.QuantConfig(scheme="asymmetric"))
        return ({t for t in ("stream", "h") if q.coarse_in_int16(t)},
                {t for t in ("stream", "h") if q.quiet_in_int16(t)})

    assert named(30000.0) == ({"stream"}, set())
    assert named(30.0) == (set(), set())
