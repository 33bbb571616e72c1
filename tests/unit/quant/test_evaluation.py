"""The quantize stage (and `auto`) judge outputs as verify does: over all samples together and
on the samples where a cosine means something, so a near-zero sample (a text map of an image
without text) does not turn a good quantization into a bad figure."""

from __future__ import annotations

import numpy as np

from npubuild.quant.workflow import Evaluation


def test_a_near_zero_sample_does_not_decide_the_output_figure():
    rng = np.random.default_rng(0)
    loud = rng.uniform(0, 1, (1, 1, 16, 16))
    quiet = np.full((1, 1, 16, 16), 1e-4)
    ev = Evaluation({}, {})
    ev.add_outputs({"map": loud}, {"map": loud + rng.normal(0, 0.01, loud.shape)}, ["map"])
    ev.add_outputs({"map": quiet}, {"map": quiet + rng.normal(0, 0.01, quiet.shape)}, ["map"])
    out = ev.outputs()["map"]
    assert out["samples"] == 2 and out["cosine"] > 0.999
    assert out["min_sample_cosine"] > 0.999              # the quiet sample is not judged alone
    assert ev.figure() == min(out["cosine"], out["min_sample_cosine"])


def test_the_figure_is_the_worst_output():
    ev = Evaluation({}, {})
    a, b = np.arange(1.0, 9.0), np.arange(1.0, 9.0)
    ev.add_outputs({"a": a, "b": b}, {"a": a, "b": b[::-1]}, ["a", "b"])
    assert ev.figure() == ev.outputs()["b"]["cosine"] < 1.0
