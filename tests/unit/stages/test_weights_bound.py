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
