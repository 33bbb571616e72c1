"""One weight read by several layers, and the precision search's choices that leave a weight's
integers as they were, hold one set of its arrays: float values, integers, fake-quant deltas.

rxnmap (chython's mapper) applies each of its two encoder layers eight times; each
application's fully connected layers read the one weight and add their bias (PyTorch's
MatMul + Add). Its quantize stage peaked at 15.2 GB: the bias fold copied every application's
float64 weights (1.2 GB per workflow), each application rounded its own integers, the search's
fake-quant model held each application's float values and deltas (1.8 GB), and every
calibration method the search scored added a copy of every weight's integers, float values
and deltas (1.4 GB each). Checked by identity: the arrays handed on are the same objects,
and their values are what an unshared computation gives."""

from __future__ import annotations

import numpy as np
from onnx import helper

from npubuild.quant import calibrate, fakequant, quantizer
from npubuild.quant.lower import lower
from tests.unit.quant.helpers import model, samples

RNG = np.random.default_rng(11)
# an encoder layer's fully connected part applied twice with one weight, each with its bias
TWICE = model([helper.make_node("MatMul", ["x", "w"], ["m0"], name="fc0"),
               helper.make_node("Add", ["m0", "b0"], ["h0"], name="bias0"),
               helper.make_node("Relu", ["h0"], ["r0"], name="relu0"),
               helper.make_node("MatMul", ["r0", "w"], ["m1"], name="fc1"),
               helper.make_node("Add", ["m1", "b1"], ["y"], name="bias1")],
              {"x": [1, 6, 8]}, {"y": [1, 6, 8]},
              {"w": RNG.normal(0, 0.5, (8, 8)), "b0": RNG.normal(0, 0.1, 8),
               "b1": RNG.normal(0, 0.1, 8)})
CONFIG = quantizer.QuantConfig(scheme="asymmetric", granularity="per_channel", method="minmax")


def _lowered():
    fg, probe = lower(TWICE)
    feeds = samples({"x": [1, 6, 8]}, n=4)
    feeds[0]["x"][0, 0, 0] = 40.0  # an outlier KL clips: other input scales
    return fg, calibrate.observe(fg, probe, feeds, "percentile")


def _fc_layers(graph) -> list:
    return [layer for layer in graph.layers if layer.kind == "conv"]


def test_a_bias_add_folded_into_layers_reading_one_weight_keeps_their_one_weight_array():
    fg, _ = _lowered()
    first, second = _fc_layers(fg)
    assert first.weights["weight"] is second.weights["weight"]
    np.testing.assert_array_equal(first.weights["weight"][:, :, 0, 0],
                                  numpy_weight().T.astype(np.float64))
    assert not np.array_equal(first.weights["bias"], second.weights["bias"])  # each its own


def numpy_weight() -> np.ndarray:
    return next(np.frombuffer(i.raw_data, np.float32).reshape(8, 8)
                for i in TWICE.graph.initializer if i.name == "w")


def test_layers_reading_one_weight_share_its_integers_and_its_fake_quant_arrays():
    fg, stats = _lowered()
    qg = quantizer.Quantizer(fg, stats, CONFIG).run("g")
    first, second = _fc_layers(qg)
    assert first.arrays["weight"] is second.arrays["weight"]
    assert not first.arrays["weight"].flags.writeable
    wide = quantizer.wide_weight_values(fg, stats, CONFIG, qg)
    assert wide[first.name][0] is wide[second.name][0]
    exported = fakequant.export_graphs({0: (qg, fg, wide)})[0]
    weights = [w for w in exported.weights if w.name.endswith("::w")]
    assert len(weights) == 2
    for part in ("real", "delta", "wide"):
        assert getattr(weights[0], part) is getattr(weights[1], part), part
    # the values an export without sharing computes (each layer its own arrays)
    fresh = fakequant._builder(qg, fg, wide_weights=wide, weights_as_inputs=True)
    fresh.value_of.update({t: t for t in qg.tensors})  # names only: nothing runs
    fakequant.qdq._layers(fresh)
    for shared, own in zip(exported.weights, fresh.weight_inputs):
        for part in ("real", "delta", "wide"):
            np.testing.assert_array_equal(getattr(shared, part), getattr(own, part))
    # the pipeline computes the shared weight's value once per state of its switches
    pipeline = fakequant.FakeQuantPipeline.__new__(fakequant.FakeQuantPipeline)
    pipeline.exported, pipeline._weights = {0: exported}, {}
    params, cpu = quantizer.Quantizer(fg, stats, CONFIG).tensor_params()
    feed = fakequant.params_feed(exported.tensors, params, exported.layers, cpu, exported.wide)
    values = pipeline.weight_feeds(0, feed)
    assert values[weights[0].name] is values[weights[1].name]


def test_a_calibration_method_that_leaves_the_weights_integers_hands_their_deltas_again():
    """The search scores every calibration method on every tensor: the inputs' scales move,
    so each layer's bias is quantized again, but per-channel weight scales come from the
    weights alone, so the deltas are the arrays the earlier method's choice handed."""
    fg, stats = _lowered()
    qg = quantizer.Quantizer(fg, stats, CONFIG).run("g")
    pipeline = fakequant.FakeQuantPipeline.__new__(fakequant.FakeQuantPipeline)
    pipeline.exported = fakequant.export_graphs({0: (qg, fg)})
    memo, ranges, inputs = {}, {}, {}
    for method in ("minmax", "kl", "mse"):
        config = quantizer.QuantConfig(scheme="asymmetric", granularity="per_channel",
                                       method=method)
        q = quantizer.Quantizer(fg, stats, config, ranges=ranges, memo=memo)
        inputs[method] = fakequant.quantizer_inputs(q, 0, fg, pipeline)
        fresh = fakequant.quantizer_inputs(quantizer.Quantizer(fg, stats, config), 0, fg,
                                           pipeline)
        assert inputs[method].keys() == fresh.keys()
        for name, value in fresh.items():
            np.testing.assert_array_equal(inputs[method][name], value)
    deltas = sorted(n for n in inputs["minmax"] if n.endswith(f"::w{fakequant.CHOICE_DELTA_SUFFIX}"))
    assert len(deltas) == 2
    assert inputs["minmax"][deltas[0]] is inputs["minmax"][deltas[1]]  # one weight
    for method in ("kl", "mse"):
        assert inputs[method][deltas[0]] is inputs["minmax"][deltas[0]], method
    # the biases follow their inputs' scales (a layer exported again): their own per method
    biases = [n for n in inputs["minmax"] if n.endswith(f"::b{fakequant.CHOICE_DELTA_SUFFIX}")]
    assert all(not np.array_equal(inputs["minmax"][n], inputs["kl"][n]) for n in biases)



def test_the_graphs_a_workflow_keeps_per_configuration_share_their_weights_integers(tmp_path):
    """The quantize stage keeps a graph per configuration (the recipe's, int16 everywhere's,
    each choice the search confirmed): where a weight's scales stay, one integer array."""
    from npubuild.quant.pipeline import SplitPipeline
    from npubuild.quant.workflow import Options, OverrideSpec, Workflow
    from tests.conftest import one_npu_graph_split

    split = one_npu_graph_split(tmp_path, list(TWICE.graph.node), list(TWICE.graph.initializer),
                                [1, 6, 8])
    workflow = Workflow(SplitPipeline(split), Options(CONFIG, chip_int16=True))
    workflow.calibrate(samples({"x": [1, 6, 8]}, n=3))
    workflow.quantize()
    plain = _fc_layers(workflow.qgraphs()[0])
    workflow.adopt([OverrideSpec((), ("r0",), "int16")])  # fc1's input in int16: its bias moves
    wide = _fc_layers(workflow.qgraphs()[0])
    assert wide[1].arrays["bias"].dtype == plain[1].arrays["bias"].dtype
    assert not np.array_equal(wide[1].arrays["bias"], plain[1].arrays["bias"])
    weights = {id(layer.arrays["weight"]) for layer in (*plain, *wide)}
    assert len(weights) == 1
    fresh = quantizer.quantize_graph(workflow.states[0].fg, workflow.states[0].observer.stats,
                                     CONFIG, "g")[0]
    np.testing.assert_array_equal(_fc_layers(fresh)[0].arrays["weight"], plain[0].arrays["weight"])
