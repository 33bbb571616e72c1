"""`price.GraphPricer`: a choice's price is `npu_seconds` of the graph with the choice applied,
and costs what the choice changes (the precision search prices one graph hundreds of times:
GTCRN's 4,590 layers were converted, planned and estimated whole per trial)."""

from __future__ import annotations

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

BLOCKS = 6


def _quantized(tmp_path):
    """A chain of blocks (Conv, Add of the block's input, Sigmoid, a transpose there and back:
    runs of tiled layers between breakers), quantized as the stage quantizes it; its QGraph."""
    from onnx import helper, numpy_helper

    from npubuild.quant.pipeline import SplitPipeline
    from npubuild.quant.quantizer import QuantConfig
    from npubuild.quant.workflow import Options, Workflow
    from tests.conftest import one_npu_graph_split

    rng = np.random.default_rng(0)
    shape = [1, 4, 8, 8]
    inits, nodes, x = [], [], "x"
    for i in range(BLOCKS):
        inits.append(numpy_helper.from_array(
            rng.normal(0, 0.5, (4, 4, 3, 3)).astype(np.float32), f"w{i}"))
        last = i == BLOCKS - 1
        nodes += [helper.make_node("Conv", [x, f"w{i}"], [f"c{i}"], name=f"conv{i}",
                                   pads=[1, 1, 1, 1]),
                  helper.make_node("Add", [f"c{i}", x], [f"a{i}"], name=f"add{i}"),
                  helper.make_node("Sigmoid", [f"a{i}"], [f"s{i}"], name=f"sig{i}"),
                  helper.make_node("Transpose", [f"s{i}"], [f"t{i}"], name=f"tr{i}",
                                   perm=[0, 1, 3, 2]),
                  helper.make_node("Transpose", [f"t{i}"], ["y" if last else f"b{i}"],
                                   name=f"back{i}", perm=[0, 1, 3, 2])]
        x = f"b{i}"
    split = one_npu_graph_split(tmp_path, nodes, inits, shape)
    workflow = Workflow(SplitPipeline(split), Options(QuantConfig(scheme="asymmetric"),
                                                      chip_int16=True))
    workflow.calibrate([{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(3)])
    workflow.quantize()
    return workflow.states[0].qgraph


_QGRAPH = {}


def _qgraph(tmp_path_factory):
    if "g" not in _QGRAPH:
        _QGRAPH["g"] = _quantized(tmp_path_factory.mktemp("price"))
    return _QGRAPH["g"]


def _choice(qgraph, draw_bits):
    """A choice from bits: int16 on some activations, some layers on the CPU, int16 weights
    on some convs."""
    tensors = [t for t, info in qgraph.tensors.items() if not info.is_float
               and t not in qgraph.constants]
    layers = [layer.name for layer in qgraph.layers]
    convs = [layer.name for layer in qgraph.layers if layer.kind == "conv"]
    wide, cpu, weights = draw_bits
    return ({t: "int16" for t, b in zip(tensors, wide) if b},
            frozenset(n for n, b in zip(layers, cpu) if b),
            frozenset(n for n, b in zip(convs, weights) if b))


bits = st.tuples(st.lists(st.booleans(), min_size=40, max_size=40),
                 st.lists(st.sampled_from([False, False, False, True]), min_size=40, max_size=40),
                 st.lists(st.booleans(), min_size=BLOCKS, max_size=BLOCKS))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(bits, min_size=1, max_size=6))
def test_a_price_from_what_the_choice_changes_equals_the_whole_price(tmp_path_factory, trials):
    """Each of a sequence of random choices, priced by one pricer (its memo of layers, runs
    and groups carried from the earlier ones), costs exactly what a fresh conversion, plan,
    program and estimate of the graph with the choice find."""
    from npubuild.quant import price
    from npubuild.targets import load_chip

    qgraph, chip = _qgraph(tmp_path_factory), load_chip("npu-16m")
    pricer = price.GraphPricer(qgraph, chip)
    for draw in trials:
        dtypes, cpu, weights = _choice(qgraph, draw)
        whole = price.npu_seconds(price.with_choice(qgraph, dtypes, cpu, weights), chip)
        assert pricer.seconds(dtypes, cpu, weights) == whole


def test_a_price_converts_plans_and_estimates_only_what_the_choice_changes(tmp_path_factory):
    """After int8 everywhere is priced, one more int16 tensor converts the layers that read or
    write it again, plans the one run that holds them and estimates that run's groups, not
    the graph's other runs; the same choice again does no work at all."""
    from npubuild.quant import price
    from npubuild.targets import load_chip

    qgraph, chip = _qgraph(tmp_path_factory), load_chip("npu-16m")
    pricer = price.GraphPricer(qgraph, chip)
    pricer.seconds({}, frozenset())
    first = dict(pricer.work)
    assert first["layers_converted"] == len(qgraph.layers) and first["runs_planned"] > 2
    touching = [layer for layer in qgraph.layers if "a2" in (*layer.inputs, *layer.outputs)]
    pricer.seconds({"a2": "int16"}, frozenset())
    work = pricer.work
    assert work["layers_converted"] - first["layers_converted"] == len(touching)
    assert work["runs_planned"] - first["runs_planned"] == 1
    assert 1 <= work["groups_estimated"] - first["groups_estimated"] <= 2
    pricer.seconds({"a2": "int16"}, frozenset())
    assert pricer.work == work


def test_widths_come_in_name_order_so_the_searchs_price_key_sorts_in_one_pass():
    """The search keys each price by its widths' items sorted (GTCRN: 5,000 tensors, four
    sorts a budget trial): `dtypes_of` hands them in that order already."""
    from npubuild.quant.price import dtypes_of
    from npubuild.quant.schemes import choose_params

    p8, p16 = (choose_params("symmetric", -1.0, 1.0, dtype) for dtype in ("int8", "int16"))
    widths = dtypes_of({"z": p8, "a": None, "m/1": p16, "m/0": p8})
    assert widths == {"a": "float32", "m/0": "int8", "m/1": "int16", "z": "int8"}
    assert list(widths.items()) == sorted(widths.items())


def test_a_table_whose_input_the_choice_widens_is_priced_at_its_int16_size(tmp_path_factory):
    """An int16 input's lookup table has up to 65,536 entries where int8's has 256 (without
    the choice's parameters to build it, the price takes them all), and compile
    reads it whole from GMEM for every frame: the price kept the int8 table, so madmom's
    online beat tracker (16 Sigmoid and Tanh tables on int16 inputs) was priced at 1.005x
    int8's time and compiled at 51x (29,937 fps where int8 ran 1,538,462); tables of zeros
    were then priced as one table shared by all (4.1x)."""
    from npubuild.quant import price

    qgraph = _qgraph(tmp_path_factory)
    tables = [layer for layer in qgraph.layers if layer.name in ("sig0", "sig1")]
    wide = {t: "int16" for layer in tables for t in (layer.inputs[0], layer.outputs[0])}
    for graph in (price.with_choice(qgraph, wide, frozenset()),
                  price.GraphPricer(qgraph, None)._with_choice(wide, frozenset(), frozenset(),
                                                               {})):
        priced = [layer.arrays["table"] for layer in graph.layers if layer.name in ("sig0", "sig1")]
        assert [(t.shape, t.dtype) for t in priced] == [((65536,), np.int16)] * 2
        # compile stores equal weights once: two tables must not be priced as one
        assert not np.array_equal(priced[0], priced[1])
    assert tables[0].arrays["table"].size <= 256  # the graph itself is not changed


def _saturating(tmp_path):
    """x → Conv (a gain of ~25: its outputs reach ±60) → Tanh → Conv, quantized in int8 as
    the stage quantizes it; its workflow (the search's float graph, statistics and config)."""
    from onnx import helper, numpy_helper

    from npubuild.quant.pipeline import SplitPipeline
    from npubuild.quant.quantizer import QuantConfig
    from npubuild.quant.workflow import Options, Workflow
    from tests.conftest import one_npu_graph_split

    rng = np.random.default_rng(1)
    shape = [1, 4, 8, 8]
    inits = [numpy_helper.from_array(rng.normal(0, 8, (4, 4, 3, 3)).astype(np.float32), "w0"),
             numpy_helper.from_array(rng.normal(0, 0.5, (4, 4, 1, 1)).astype(np.float32), "w1")]
    nodes = [helper.make_node("Conv", ["x", "w0"], ["c0"], name="conv0", pads=[1, 1, 1, 1]),
             helper.make_node("Tanh", ["c0"], ["t0"], name="tanh0"),
             helper.make_node("Conv", ["t0", "w1"], ["y"], name="conv1")]
    split = one_npu_graph_split(tmp_path, nodes, inits, shape)
    workflow = Workflow(SplitPipeline(split), Options(QuantConfig(scheme="symmetric"),
                                                      chip_int16=True))
    workflow.calibrate([{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(3)])
    workflow.quantize()
    return workflow


def test_a_saturating_int16_table_is_priced_at_its_span(tmp_path):
    """A Tanh whose input the choice makes int16 is built and stored over the input integers
    where its output changes (`schemes.trim_lut`): the price sizes it from the choice's own
    parameters (`TableSpans`, the layer's float fragment), to the entry, and prices the graph
    exactly as compile estimates the graph quantized with that choice. (It was priced at
    65,536 entries read every frame, most of them ±1: madmom's LSTM gates at 51x int8.)"""
    from dataclasses import replace

    from npubuild.quant import price
    from npubuild.quant.quantizer import Quantizer
    from npubuild.quant.workflow import _config_for
    from npubuild.targets import load_chip

    workflow = _saturating(tmp_path)
    state, chip = workflow.states[0], load_chip("npu-16m")
    qgraph = state.qgraph
    config, _ = _config_for(workflow.options, [], state.graph.model)
    wide = replace(config, int16_tensors=frozenset({"c0", "t0"}))
    q = Quantizer(state.fg, state.observer.stats, wide)
    params, cpu = q.tensor_params()
    built = q.run(qgraph.name)
    table = next(layer for layer in built.layers if layer.name == "tanh0").arrays["table"]
    assert table.dtype == np.int16 and table.size < 65536 // 4

    tables = price.table_params(qgraph, params)
    assert [name for name, _, _ in tables] == ["tanh0"]
    entries = price.TableSpans(qgraph)(tables)
    assert entries == {"tanh0": table.size}
    widths = price.dtypes_of(params)
    chosen = price.with_choice(qgraph, widths, frozenset(cpu), frozenset(), entries)
    priced = next(layer for layer in chosen.layers if layer.name == "tanh0").arrays["table"]
    assert (priced.size, priced.dtype) == (table.size, table.dtype)
    compiled = price.npu_seconds(built, chip)
    assert price.npu_seconds(chosen, chip) == compiled
    assert price.GraphPricer(qgraph, chip).seconds(widths, frozenset(cpu), frozenset(),
                                                   entries) == compiled
    # the whole int16 table, as it was priced, costs more than the span
    assert price.npu_seconds(price.with_choice(qgraph, widths, frozenset(cpu)), chip) > compiled
