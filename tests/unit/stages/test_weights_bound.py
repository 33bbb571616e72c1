"""quantize's note where the precision search finds nothing: whether int8 weights alone (every
activation in float) already miss verify's thresholds, so no activation precision can pass."""

from __future__ import annotations

import numpy as np
from onnx import helper, numpy_helper

from npubuild.quant.pipeline import SplitPipeline
from npubuild.quant.quantizer import QuantConfig
from npubuild.quant.search import PrecisionSearch, SearchSpec
from npubuild.quant.workflow import Options, Workflow
from npubuild.recipe.model import VerifySpec
from npubuild.stages.quantize import weights_bound
from npubuild.verify.verdict import SampleJudge
from tests.conftest import one_npu_graph_split

SHAPE = [1, 1, 4, 4]


def _search(tmp_path, head: np.ndarray, bias: float):
    """x → Conv (1 → 8 channels, each a copy of x) → Conv (8 → 1, weights ``head``): the
    output is x times the sum of ``head``, plus ``bias``."""
    inits = [numpy_helper.from_array(np.ones((8, 1, 1, 1), np.float32), "w1"),
             numpy_helper.from_array(head.reshape(1, 8, 1, 1).astype(np.float32), "w2"),
             numpy_helper.from_array(np.array([bias], np.float32), "b2")]
    nodes = [helper.make_node("Conv", ["x", "w1"], ["c"], name="spread"),
             helper.make_node("Conv", ["c", "w2", "b2"], ["y"], name="head")]
    return _search_on(tmp_path, nodes, inits)


def _search_on(tmp_path, nodes: list, inits: list):
    """The precision search, its judge and samples for one NPU graph of ``nodes``, x in
    [0.5, 1], calibrated and verified on the same 3 samples."""
    pipeline = SplitPipeline(one_npu_graph_split(tmp_path, nodes, inits, SHAPE))
    workflow = Workflow(pipeline, Options(QuantConfig(scheme="asymmetric",
                                                      granularity="per_channel",
                                                      bias_correction=False), chip_int16=True))
    rng = np.random.default_rng(0)
    samples = [{"x": rng.uniform(0.5, 1.0, SHAPE).astype(np.float32)} for _ in range(3)]
    workflow.calibrate(samples)
    workflow.quantize()
    judge = SampleJudge(VerifySpec(), {}, pipeline, samples)
    search = PrecisionSearch(workflow, samples, judge, judge.kept, SearchSpec(), chip_int16=True,
                             npu_macs_per_second=1e12)
    return search, judge, samples


def test_weights_that_cancel_bound_the_model_and_the_note_says_so(tmp_path):
    # eight large weights summing to 0.2, whose int8 rounding (a step of 40 / 127) adds 0.12:
    # the output 0.2·x - 0.15 crosses zero, what int8 weights make of it does not
    head = np.array([40.0, -39.9, 13.1, -13.0, 7.3, -7.3, 2.2, -2.2])
    note = weights_bound(*_search(tmp_path, head, -0.15))
    assert note.startswith("int8 weights bound this model: with every activation in float and "
                           "only the weights in int8 it still misses (output 'y' at cosine ")


def test_weights_int8_represents_well_are_not_blamed(tmp_path):
    assert weights_bound(*_search(tmp_path, np.linspace(0.1, 0.8, 8), -0.15)) == ""


def _constant_search(tmp_path):
    """x · [1, 1, 1, 1] − x · [0.9975, 1, 0.9975, 1] (along the last axis, as BirdNET's Hann
    window multiplies its frames) − 0.001875: columns 0 and 2 are 0.0025·x − 0.001875, which
    cross zero. The second constant's int8 rounding (a step of 1/255) makes their slope 0.0039:
    only a choice that widens the constant reaches it."""
    inits = [numpy_helper.from_array(np.ones(4, np.float32), "ones"),
             numpy_helper.from_array(np.array([0.9975, 1.0, 0.9975, 1.0], np.float32), "c"),
             numpy_helper.from_array(np.array(-0.001875, np.float32), "k")]
    nodes = [helper.make_node("Mul", ["x", "ones"], ["a"], name="whole"),
             helper.make_node("Mul", ["x", "c"], ["b"], name="window"),
             helper.make_node("Sub", ["a", "b"], ["d"], name="difference"),
             helper.make_node("Add", ["d", "k"], ["y"], name="offset")]
    return _search_on(tmp_path, nodes, inits)


def test_a_window_constant_is_a_candidate_the_search_widens_not_a_weight(tmp_path):
    """The window constant int8 cannot hold is a candidate (the scalar offset, held exactly,
    is not): with it in float beside every activation the model passes, so int8 weights are
    not blamed, and the search reaches verify's thresholds by widening it."""
    search, judge, samples = _constant_search(tmp_path)
    assert "c" in search.candidates and "k" not in search.candidates
    assert weights_bound(search, judge, samples) == ""
    result = search.run()
    assert result.reached and result.chosen.get("c") in ("int16", "float")
