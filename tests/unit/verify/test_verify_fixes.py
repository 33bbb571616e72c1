"""verify's measured hints (`npubuild.verify.fixes`): a trial scores what adopting it builds."""

from __future__ import annotations

import numpy as np
import pytest

from tests.unit.quant.helpers import adopted_fake_quant_values, biased_conv_mul_conv

SHAPE = [1, 4, 6, 6]


def _quantized(pipeline, samples, config, overrides=(), histograms=False):
    """The quantize path: a workflow calibrated on ``samples`` and quantized."""
    from npubuild.quant.workflow import Options, Workflow

    workflow = Workflow(pipeline, Options(config, tuple(overrides), chip_int16=True,
                                          histograms=histograms))
    workflow.calibrate(samples)
    workflow.quantize()
    return workflow


@pytest.mark.parametrize("kind", ["int16", "method", "scheme", "float"])
def test_a_trial_scores_what_adopting_its_recipe_line_builds(tmp_path, kind):
    """Each trial's values and verdict are those of the graph quantized with the change
    adopted through the quantize path (its override, method or scheme in the options), to
    float rounding. The trials used to change only the tensor's scale and zero point in the
    deployed graph's fake-quant model: int16 on conv2's input kept int8's bias and weight
    scale, kl kept every other tensor at min/max, and the asymmetric scheme kept the
    symmetric graph's biases; a hint promised what the user did not get."""
    from npubuild.quant.pipeline import SplitPipeline
    from npubuild.quant.quantizer import QuantConfig
    from npubuild.quant.workflow import OverrideSpec
    from npubuild.recipe.model import VerifySpec
    from npubuild.verify import fixes
    from npubuild.verify.verdict import SampleJudge
    from tests.conftest import one_npu_graph_split

    nodes, inits = biased_conv_mul_conv()
    pipeline = SplitPipeline(one_npu_graph_split(tmp_path, nodes, inits, SHAPE))
    rng = np.random.default_rng(0)
    samples = [{"x": rng.uniform(-1.0, 1.0, SHAPE).astype(np.float32)} for _ in range(3)]
    config = QuantConfig(scheme="symmetric", granularity="per_channel")
    deployed = _quantized(pipeline, samples, config)
    judge = SampleJudge(VerifySpec(), {}, pipeline, samples)
    # verify's bench: the deployment calibrated again with every histogram
    bench_workflow = _quantized(pipeline, samples, config, histograms=True)
    bench_workflow.options = deployed.options
    bench = fixes.FixBench(bench_workflow, deployed.qgraphs(), samples, judge, judge.kept)
    assert bench.differences() == []

    change, adopted = {
        "int16": (bench.int16("m"), lambda: _quantized(
            pipeline, samples, config, [OverrideSpec(tensors=("m",), precision="int16")])),
        "float": (bench.cpu("m"), lambda: _quantized(
            pipeline, samples, config, [OverrideSpec(tensors=("m",), precision="float")])),
        "method": (bench.method("kl"), lambda: _quantized(
            pipeline, samples, QuantConfig(scheme="symmetric", granularity="per_channel",
                                           method="kl"))),
        "scheme": (bench.asymmetric(), lambda: _quantized(
            pipeline, samples, QuantConfig(scheme="asymmetric", granularity="per_channel"))),
    }[kind]
    workflow = adopted()
    built = adopted_fake_quant_values(workflow, samples, judge.kept)
    tried = bench.values(change)
    assert len(tried) == len(built) == len(samples)
    for mine, theirs in zip(tried, built):
        assert mine.keys() == theirs.keys()
        for name in mine:
            np.testing.assert_allclose(mine[name], theirs[name], rtol=1e-5, atol=1e-5)
    failing = list(judge.outputs)
    assert fixes.figure(bench.verdict(change), failing) == pytest.approx(
        fixes.figure(judge(built), failing), abs=1e-6)
    # and the change moved the figure: a trial that scored the deployment again proves nothing
    assert fixes.figure(bench.verdict(change), failing) != pytest.approx(
        fixes.figure(bench.verdict(), failing), abs=1e-6)
    # confirmed on the integer reference, it is the adopted deployment's verdict, bit for bit
    reference = judge(workflow.deployed_values(samples, judge.kept))
    assert fixes.figure(bench.reference_verdict(change), failing) == fixes.figure(reference,
                                                                                 failing)


def test_a_deployment_quantizing_again_does_not_reproduce_is_named(tmp_path):
    """Where the graphs quantized again differ from the deployed ones (the stage chose
    something verify cannot read back), the hint says its figures are of the re-quantized
    graphs and where they differ."""
    from npubuild.quant.pipeline import SplitPipeline
    from npubuild.quant.quantizer import QuantConfig
    from npubuild.recipe.model import VerifySpec
    from npubuild.verify import fixes
    from npubuild.verify.verdict import SampleJudge
    from tests.conftest import one_npu_graph_split

    nodes, inits = biased_conv_mul_conv()
    pipeline = SplitPipeline(one_npu_graph_split(tmp_path, nodes, inits, SHAPE))
    samples = [{"x": np.full(SHAPE, v, np.float32)} for v in (-1.0, 0.5, 1.0)]
    deployed = _quantized(pipeline, samples, QuantConfig(scheme="symmetric"))
    other = _quantized(pipeline, samples, QuantConfig(scheme="asymmetric"), histograms=True)
    judge = SampleJudge(VerifySpec(), {}, pipeline, samples)
    bench = fixes.FixBench(other, deployed.qgraphs(), samples, judge, judge.kept)
    differences = bench.differences()
    assert differences and differences[0].startswith("graph_0: tensor ")
    trial = fixes.Trial("int16 on 'm'", "...", 0.9, 0.95, False)
    text = fixes.hint([trial], "worst cosine", None, differences=differences)
    assert "quantized again from the calibration data, which differ from the deployed" in text


def test_a_recipe_line_pins_what_the_quantize_stage_would_measure_again():
    """A recipe that leaves cross-layer equalisation and the weight rounding unset has the
    quantize stage measure them, and a rebuild with the change measures them again: on
    face-detection (int8 as written) neither was kept, with 'activation_5' in float both
    were, and the rebuild reached 0.9731 where the trial, holding them as deployed, measured
    0.9656. Each change's recipe line holds them as the trial did; a setting the recipe
    makes is its own."""
    from types import SimpleNamespace

    from npubuild.quant.quantizer import QuantConfig
    from npubuild.quant.workflow import Options
    from npubuild.verify import fixes

    deployed = Options(QuantConfig(weight_rounding="gptq"), equalize=False)
    unset = SimpleNamespace(cross_layer_equalization=None, weight_rounding=None)
    assert fixes.pins(unset, deployed) == ["quantization.cross_layer_equalization: false",
                                           "quantization.weight_rounding: gptq"]
    written = SimpleNamespace(cross_layer_equalization=True, weight_rounding="nearest")
    assert fixes.pins(written, deployed) == []


def test_an_override_line_adds_to_the_recipe_s_overrides_it_was_measured_with():
    """The trial keeps the recipe's overrides; a line that wrote the list alone would drop
    them (face-detection with 'activation_5' in float: 'depthwise_conv2d_10' measured beside
    it, 0.9816, rebuilt beside it 0.9816)."""
    from npubuild.verify import fixes
    from npubuild.verify.bisect import RecipeFixes

    assert fixes.override_line("x", "int16", RecipeFixes()) == \
        "quantization.overrides: [{tensors: ['x'], precision: int16}]"
    written = RecipeFixes(overridden=frozenset({"a"}))
    assert fixes.override_line("x", "float", written) == \
        "quantization.overrides: {tensors: ['x'], precision: float} added to the recipe's"
