"""A graph output a point-symmetric saturating function computes (a binary classifier's Sigmoid,
a Tanh) is judged where its input crosses the centre; calibration samples all on one side
(CapSpot's icon matcher: six pairs, none the same icon, logits -9 to -0.35) gave the logit a
range ending at 0 and the output one ending at 0.41, so every verify pair of the same icon
(0.73, 0.84, 0.97) came out below 0.5. The input's range is made symmetric about the centre
and the output keeps the function's whole range."""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper, numpy_helper

from npubuild import onnx_io
from npubuild.quant.reference import run_quantized
from tests.unit.quant.helpers import model, quantize


def _classifier(act: str = "Sigmoid"):
    """A dense layer and ``act``: y = act(x · w + b), x [1, 8]."""
    rng = np.random.default_rng(7)
    return model([helper.make_node("Gemm", ["x", "w", "b"], ["z"], name="dense"),
                  helper.make_node(act, ["z"], ["y"], name="act")],
                 {"x": [1, 8]}, {"y": [1, 1]},
                 {"w": rng.normal(size=(8, 1)).astype(np.float32), "b": np.array([-0.5], np.float32)})


def _feeds(m, sign: float, n: int, seed: int):
    """Inputs from one range (uniform in [-1, 1]) whose logit x · w + b has the given sign and
    a magnitude above 1: the two classes differ in what the model computes, not in their range."""
    inits = {t.name: numpy_helper.to_array(t) for t in m.graph.initializer}
    x = np.random.default_rng(seed).uniform(-1, 1, (4000, 8)).astype(np.float32)
    z = x @ inits["w"][:, 0] + inits["b"][0]
    return [{"x": row[None]} for row in x[sign * z > 1.0][:n]]


def _outputs(m, qg, feeds):
    sess = onnx_io.session(m)
    return [(float(onnx_io.run(sess, f)["y"].ravel()[0]),
             float(np.ravel(run_quantized(qg, f, ["y"])["y"])[0])) for f in feeds]


def test_a_sigmoid_output_calibrated_on_one_class_still_tells_the_other():
    m = _classifier()
    qg, _, _ = quantize(m, _feeds(m, -1.0, 6, seed=1), scheme="asymmetric",
                        granularity="per_tensor")
    for expected, got in _outputs(m, qg, _feeds(m, +1.0, 6, seed=2)):
        assert expected > 0.7 and got > 0.6 and abs(got - expected) < 0.05, (expected, got)
    assert qg.tensors["y"].scale * 255 >= 0.99   # the output holds the function's whole range


def test_a_tanh_output_keeps_its_negative_half():
    m = _classifier("Tanh")
    qg, _, _ = quantize(m, _feeds(m, +1.0, 6, seed=3), scheme="asymmetric",
                        granularity="per_tensor")
    for expected, got in _outputs(m, qg, _feeds(m, -1.0, 6, seed=4)):
        assert expected < -0.7 and got < -0.5 and abs(got - expected) < 0.05, (expected, got)


def test_a_logit_calibration_saw_on_both_sides_keeps_its_range():
    m = _classifier()
    feeds = _feeds(m, -1.0, 3, seed=5) + _feeds(m, +1.0, 3, seed=6)
    qg, fg, probe = quantize(m, feeds, scheme="asymmetric", granularity="per_tensor")
    from npubuild.quant import calibrate, quantizer
    stats = calibrate.observe(fg, probe, feeds, "minmax")
    z = stats["z"]
    span = (max(z.max, 0) - min(z.min, 0)) / 255
    assert qg.tensors["z"].scale == pytest.approx(span, rel=1e-6)   # min/max, not widened
