"""The fake-quant model (`npubuild.quant.fakequant`): a tensor switched on is quantized with
the parameters fed in, one switched off passes through untouched, whatever its values."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import helper

from npubuild import onnx_io
from npubuild.quant import calibrate, fakequant, quantizer
from npubuild.quant.lower import lower
from tests.unit.quant.helpers import model, samples

RNG = np.random.default_rng(3)
CONV = model([helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
              helper.make_node("Relu", ["c"], ["y"])],
             {"x": [1, 2, 5, 5]}, {"y": [1, 3, 5, 5]},
             {"w": RNG.normal(0, 0.5, (3, 2, 3, 3)), "b": RNG.normal(0, 0.1, 3)})
CONV_ONLY = model([helper.make_node("Conv", ["x", "w", "b"], ["y"], pads=[1, 1, 1, 1])],
                  {"x": [1, 2, 5, 5]}, {"y": [1, 3, 5, 5]},
                  {"w": RNG.normal(0, 0.5, (3, 2, 3, 3)), "b": RNG.normal(0, 0.1, 3)})


def fake_quant_session(m, scheme="asymmetric"):
    feeds = samples({"x": [1, 2, 5, 5]}, n=4)
    fg, probe = lower(m)
    stats = calibrate.observe(fg, probe, feeds, "minmax")
    config = quantizer.QuantConfig(scheme=scheme, granularity="per_tensor", method="minmax")
    q = quantizer.Quantizer(fg, stats, config)
    qg = q.run("g")
    params, cpu = quantizer.Quantizer(fg, stats, config).tensor_params()
    exported, tensors, layers, _ = fakequant.export_fake_quant(qg, fg)
    return onnx_io.session(exported), tensors, layers, params, cpu, qg, feeds


def test_a_tensor_switched_on_lands_on_its_quantization_grid():
    session, tensors, layers, params, cpu, _, feeds = fake_quant_session(CONV)
    out = params["y"]
    for feed in feeds:
        run = {**feed, **fakequant.params_feed(tensors, params, layers, cpu)}
        y = session.run(["y"], run)[0]
        levels = y / np.float32(out.scale) + out.zero_point  # within float rounding of integers
        assert np.allclose(levels, np.round(levels), atol=1e-3)
        assert levels.min() >= out.qmin - 1e-3 and levels.max() <= out.qmax + 1e-3
        assert len(np.unique(np.round(levels))) > 4  # not everything clipped to one level


def test_every_tensor_switched_off_and_every_layer_on_the_cpu_is_the_float_model():
    session, tensors, layers, params, _, _, feeds = fake_quant_session(CONV)
    float_session = onnx_io.session(CONV)
    for feed in feeds:
        off = fakequant.params_feed(tensors, {}, layers, set(layers))
        got = session.run(["y"], {**feed, **off})[0]
        np.testing.assert_allclose(got, onnx_io.run(float_session, feed)["y"], rtol=1e-6,
                                   atol=1e-6)


def test_a_value_switched_off_passes_through_even_when_infinite():
    session, tensors, layers, params, cpu, _, _ = fake_quant_session(CONV_ONLY)
    x = samples({"x": [1, 2, 5, 5]}, n=1)[0]["x"]
    x[0, 0, 2, 2], x[0, 1, 0, 0] = np.inf, -np.inf
    off = fakequant.params_feed(tensors, {}, layers, set(layers))
    want = onnx_io.run(onnx_io.session(CONV_ONLY), {"x": x})["y"]
    assert not np.isfinite(want).all()
    np.testing.assert_array_equal(session.run(["y"], {"x": x, **off})[0], want)
    on = fakequant.params_feed(tensors, params, layers, cpu)
    assert np.isfinite(session.run(["y"], {"x": x, **on})[0]).all()  # clipped to the range


TWO_CONVS = model([helper.make_node("Conv", ["x", "w1", "b1"], ["c"], pads=[1, 1, 1, 1]),
                   helper.make_node("Relu", ["c"], ["r"]),
                   helper.make_node("Conv", ["r", "w2", "b2"], ["y"])],
                  {"x": [1, 2, 5, 5]}, {"y": [1, 4, 5, 5]},
                  {"w1": RNG.normal(0, 0.5, (3, 2, 3, 3)), "b1": RNG.normal(0, 0.1, 3),
                   "w2": RNG.normal(0, 0.5, (4, 3, 1, 1)), "b2": RNG.normal(0, 0.1, 4)})


def test_switched_weights_fed_as_inputs_give_the_in_model_switching_bit_for_bit():
    """The search's fake-quant models take each switched weight as an input that
    `FakeQuantPipeline` computes once per state of its layer's switches (on the NPU or not,
    int16 weights or not) instead of in the model on every run: the same outputs, bit for
    bit, for every state, in any order of choices (the second time a state comes back its
    weights come from the cache); and no node of the model computes a weight any more."""
    feeds = samples({"x": [1, 2, 5, 5]}, n=3)
    fg, probe = lower(TWO_CONVS)
    stats = calibrate.observe(fg, probe, feeds, "minmax")
    config = quantizer.QuantConfig(scheme="asymmetric", granularity="per_channel",
                                   method="minmax")
    qg = quantizer.Quantizer(fg, stats, config).run("g")
    params, _ = quantizer.Quantizer(fg, stats, config).tensor_params()
    wide = quantizer.wide_weight_values(fg, stats, config, qg)
    in_model, tensors, layers, switched = fakequant.export_fake_quant(qg, fg, wide_weights=wide)
    exported = fakequant.export_graphs({0: (qg, fg, wide)})[0]
    assert (exported.tensors, exported.layers, exported.wide) == (
        tuple(tensors), tuple(layers), tuple(switched))
    assert len(layers) == 2 and len(switched) == 2 and len(exported.weights) == 4
    computed = lambda m: sorted(i.name for i in m.graph.initializer  # noqa: E731
                                if i.name.endswith(("::wd", "::wf", "::bd", "::bf")))
    assert len(computed(in_model)) == 8 and computed(exported.model) == []
    reference, fed = onnx_io.session(in_model), onnx_io.session(exported.model)
    pipeline = fakequant.FakeQuantPipeline.__new__(fakequant.FakeQuantPipeline)
    pipeline.exported, pipeline._weights = {0: exported}, {}
    states = [(cpu, w16) for cpu in (set(), {layers[0]}, set(layers))
              for w16 in (set(), {switched[1]}, set(switched))]
    for cpu, w16 in [*states, *states[::-1]]:
        feed = fakequant.params_feed(tensors, params, layers, cpu, switched, w16)
        for x in feeds:
            want = reference.run(["y"], {**x, **feed})[0]
            got = fed.run(["y"], {**x, **feed, **pipeline.weight_feeds(0, feed)})[0]
            np.testing.assert_array_equal(got, want)
    assert len(pipeline._weights) == 4 * 3  # each weight in its three states, computed once


def test_a_graph_run_in_parts_reruns_only_the_parts_after_a_changed_parameter(tmp_path,
                                                                               monkeypatch):
    """A large fake-quant model runs in parts (`fakequant.model_parts`), each part's values
    kept (`fakequant.KeptParts`): a choice reruns the parts from the first
    one whose parameters differ from the kept run's, and every output equals the whole
    model's run bit for bit, whichever choices came before (CRAFT's one-graph U-Net: the
    ranking's blocks in pipeline order reran its whole backbone for each block); the
    switched weights are computed once per run, not per sample."""
    whole, parted, base, tensors, feeds = _eight_convs(tmp_path, monkeypatch)
    parts = parted.parts[0]
    assert len(whole.parts[0]) == 1 and len(parts) == fakequant.MAX_PARTS
    calls = {"weight_feeds": 0}
    weight_feeds = parted.weight_feeds

    def counted(*args):
        calls["weight_feeds"] += 1
        return weight_feeds(*args)
    monkeypatch.setattr(parted, "weight_feeds", counted)

    def off(*names):
        return {0: {**base, **{f"{t}{fakequant.PARAMS_SUFFIX}": fakequant.OFF for t in names}}}

    # each run reuses the parts before its first change from an earlier run
    for choice, reruns in ((off(), len(parts)), (off(tensors[-1]), 1),
                           (off(tensors[-2]), 1), (off(tensors[0]), len(parts)),
                           (off(tensors[0], tensors[-1]), 1), (off(tensors[-1]), 1),
                           (off(), 0)):
        runs, weighed = parted.part_runs, calls["weight_feeds"]
        got = parted.run(feeds, choice, ["y"])
        assert parted.part_runs - runs == reruns * len(feeds)
        assert calls["weight_feeds"] - weighed == 1  # the switched weights: once a run
        want = whole.run(feeds, choice, ["y"])
        assert all(np.array_equal(g["y"], w["y"]) for g, w in zip(got, want))


def _eight_convs(tmp_path, monkeypatch, budget=None):
    """Eight Conv → Relu pairs as one NPU graph's fake-quant model, run whole and in parts
    (`fakequant.MAX_PARTS`, at most ``budget`` bytes of part values kept), with int8
    everywhere's inputs, its tensors and two samples."""
    from onnx import numpy_helper

    from npubuild.quant.pipeline import SplitPipeline
    from npubuild.quant.quantizer import QuantConfig, Quantizer, wide_weight_values
    from npubuild.quant.workflow import Options, Workflow
    from tests.conftest import one_npu_graph_split

    rng = np.random.default_rng(5)
    shape, convs = [1, 4, 6, 6], 8
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (4, 4, 3, 3)).astype(np.float32),
                                     f"w{i}") for i in range(convs)]
    names = ["x", *(f"r{i}" for i in range(convs - 1)), "y"]
    nodes = []
    for i in range(convs):
        nodes += [helper.make_node("Conv", [names[i], f"w{i}"], [f"c{i}"], name=f"conv{i}",
                                   pads=[1, 1, 1, 1]),
                  helper.make_node("Relu", [f"c{i}"], [names[i + 1]], name=f"relu{i}")]
    split = one_npu_graph_split(tmp_path, nodes, inits, shape)
    workflow = Workflow(SplitPipeline(split), Options(QuantConfig(scheme="asymmetric",
                                                                  granularity="per_channel"),
                                                      chip_int16=True))
    feeds = [{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(2)]
    workflow.calibrate(feeds)
    workflow.quantize()
    state = workflow.states[0]
    config = workflow.options.config
    exported = fakequant.export_graphs({0: (state.qgraph, state.fg, wide_weight_values(
        state.fg, state.observer.stats, config, state.qgraph))})
    with monkeypatch.context() as m:
        m.setattr(fakequant, "NODES_PER_PART", 10 ** 6)
        whole = fakequant.FakeQuantPipeline(split, exported)
        m.setattr(fakequant, "NODES_PER_PART", 8)
        if budget is not None:
            m.setattr(fakequant, "KEPT_BYTES", budget)
        parted = fakequant.FakeQuantPipeline(split, exported)
    base = fakequant.quantizer_inputs(Quantizer(state.fg, state.observer.stats, config), 0,
                                      state.fg, whole)
    return whole, parted, base, whole.tensors(0), feeds


def test_a_choice_reuses_the_parts_of_any_earlier_run_that_computed_them_alike(
        tmp_path, monkeypatch):
    """A choice reruns a graph from its first part no earlier run computed on the same
    inputs and parameters, not only the last run or the first (int8 everywhere): the budget
    path's and the mixed reach's choices share their early parts with runs scored long
    before. Every output equals the whole model's bit for bit."""
    whole, parted, base, tensors, feeds = _eight_convs(tmp_path, monkeypatch)
    parts = len(parted.parts[0])

    def off(*names):
        return {0: {**base, **{f"{t}{fakequant.PARAMS_SUFFIX}": fakequant.OFF for t in names}}}

    middle = tensors[len(tensors) // 2]
    after = parts - next(k for k, part in enumerate(parted.parts[0])  # from middle's part on
                         if f"{middle}{fakequant.PARAMS_SUFFIX}" in part.keys)
    assert 1 < after < parts
    for choice, reruns in ((off(), parts), (off(tensors[0]), parts), (off(middle), after),
                           (off(tensors[0], tensors[-1]), 1),  # the second run's but the last
                           (off(tensors[0], middle), after)):
        runs = parted.part_runs
        got = parted.run(feeds, choice, ["y"])
        assert parted.part_runs - runs == reruns * len(feeds)
        want = whole.run(feeds, choice, ["y"])
        assert all(np.array_equal(g["y"], w["y"]) for g, w in zip(got, want))


@settings(max_examples=25, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(choices=st.lists(st.sets(st.integers(0, 40), max_size=3), min_size=1, max_size=8),
       budget=st.sampled_from([0, 3000, 20000, 2 << 30]))
def test_kept_part_values_stay_within_their_budget_and_give_the_whole_models_bits(
        tmp_path_factory, monkeypatch, choices, budget):
    """Whatever the choices and the byte budget of the kept part values
    (`fakequant.KEPT_BYTES`): what is kept never exceeds the budget, a value past it is
    computed again, and every output equals the whole model's bit for bit."""
    tmp_path = tmp_path_factory.mktemp("parts")
    whole, parted, base, tensors, feeds = _eight_convs(tmp_path, monkeypatch, budget)
    for picked in [set(), *choices]:
        choice = {0: {**base, **{f"{tensors[i % len(tensors)]}{fakequant.PARAMS_SUFFIX}":
                                 fakequant.OFF for i in picked}}}
        got = parted.run(feeds, choice, ["y"])
        want = whole.run(feeds, choice, ["y"])
        assert all(np.array_equal(g["y"], w["y"]) for g, w in zip(got, want))
        assert parted.kept.bytes <= budget and parted.kept.peak <= budget


def test_a_model_cut_into_parts_types_its_crossings_without_inferring_the_switches(
        tmp_path, monkeypatch):
    """`fakequant.model_parts` types the values crossing its cuts from ONNX's inference with
    each switch's If taken out (its outputs typed as its branches declare them): ONNX infers
    each If branch with a copy of every outer value's type, quadratic in a large model's
    switches (GTCRN: 26,342 nodes, 5,361 Ifs, 89 s of inference). The parts' types are those
    the whole model's inference gives."""
    import onnx
    from onnx import numpy_helper

    from npubuild.quant.pipeline import SplitPipeline
    from npubuild.quant.quantizer import QuantConfig
    from npubuild.quant.workflow import Options, Workflow
    from tests.conftest import one_npu_graph_split

    rng = np.random.default_rng(7)
    shape, convs = [1, 3, 5, 5], 6
    inits = [numpy_helper.from_array(rng.normal(0, 0.5, (3, 3, 3, 3)).astype(np.float32),
                                     f"w{i}") for i in range(convs)]
    names = ["x", *(f"r{i}" for i in range(convs - 1)), "y"]
    nodes = [helper.make_node("Conv", [names[i], f"w{i}"], [names[i + 1]], name=f"conv{i}",
                              pads=[1, 1, 1, 1]) for i in range(convs)]
    split = one_npu_graph_split(tmp_path, nodes, inits, shape)
    workflow = Workflow(SplitPipeline(split), Options(QuantConfig(scheme="asymmetric")))
    workflow.calibrate([{"x": rng.normal(0, 1, shape).astype(np.float32)}])
    workflow.quantize()
    state = workflow.states[0]
    exported = fakequant.export_graphs({0: (state.qgraph, state.fg)})[0]
    whole = onnx.shape_inference.infer_shapes(exported.model).graph
    want = {v.name: v.type.tensor_type.elem_type
            for v in [*whole.value_info, *whole.input, *whole.output]}
    given = []
    infer = onnx.shape_inference.infer_shapes

    def recorded(model, *args, **kwargs):
        given.append(model)
        return infer(model, *args, **kwargs)
    monkeypatch.setattr(onnx.shape_inference, "infer_shapes", recorded)
    monkeypatch.setattr(fakequant, "NODES_PER_PART", 8)
    parts = fakequant.model_parts(exported)
    assert len(parts) > 1 and given
    assert not any(n.op_type == "If" for m in given for n in m.graph.node)
    crossing = [v for m, *_ in parts for v in [*m.graph.input, *m.graph.output]]
    assert crossing and all(v.type.tensor_type.elem_type == want[v.name] for v in crossing)


def test_a_scalar_tensor_stays_a_scalar():
    """madmom's online beat tracker squeezes its one activation of one frame to a scalar: its
    parameters, split from one vector, are of shape [1], so the fake quantization broadcast
    the scalar to [1] and the precision search read "shape [1] deployed where the reference
    has []" for every choice (margin -1), int16 everywhere included."""
    m = model([helper.make_node("Conv", ["x", "w", "b"], ["c"]),
               helper.make_node("Sigmoid", ["c"], ["s"]),
               helper.make_node("Squeeze", ["s"], ["y"])],
              {"x": [1, 2, 1, 1]}, {"y": []},
              {"w": RNG.normal(0, 0.5, (1, 2, 1, 1)), "b": RNG.normal(0, 0.1, 1)})
    feeds = samples({"x": [1, 2, 1, 1]}, n=4)
    fg, probe = lower(m)
    stats = calibrate.observe(fg, probe, feeds, "minmax")
    config = quantizer.QuantConfig(scheme="asymmetric", granularity="per_tensor", method="minmax")
    qg = quantizer.Quantizer(fg, stats, config).run("g")
    params, cpu = quantizer.Quantizer(fg, stats, config).tensor_params()
    exported, tensors, layers, _ = fakequant.export_fake_quant(qg, fg)
    session = onnx_io.session(exported)
    for feed in feeds:
        run = {**feed, **fakequant.params_feed(tensors, params, layers, cpu)}
        y = session.run(["y"], run)[0]
        assert y.shape == () and onnx_io.run(onnx_io.session(m), feed)["y"].shape == ()


def test_an_rms_normalization_exports_at_its_opset_and_switched_off_is_the_float_model():
    """T5's RMS norms import as RMSNormalization (opset 23): the fake-quant model was written
    at opset 18 and ONNX Runtime refused it ("No Op registered for RMSNormalization with
    domain_version of 18"), stopping the encoder's quantize stage."""
    from tests.unit.quant.test_kernels_vs_ort import as_one_op, rms_norm

    m = as_one_op(rms_norm([1, 2, 5, 5], "Div"))
    session, tensors, layers, params, _, qg, feeds = fake_quant_session(m)
    assert [layer.kind for layer in qg.layers] == ["layernorm"]
    for feed in feeds:
        off = fakequant.params_feed(tensors, {}, layers, set(layers))
        np.testing.assert_allclose(session.run(["y"], {**feed, **off})[0],
                                   onnx_io.run(onnx_io.session(m), feed)["y"], rtol=1e-6, atol=1e-6)


def test_a_feed_array_an_earlier_run_was_fed_is_not_hashed_again(tmp_path, monkeypatch):
    """The kept parts are found by prints of the feeds (`fakequant.KeptParts`); an array an
    earlier run was fed (a graph's parameters a choice leaves as they were, a layer's
    weights, a sample's input) keeps its print instead of being hashed again every run,
    while an equal array that is another object is still found by its content; every output
    equals the whole model's bit for bit."""
    whole, parted, base, tensors, feeds = _eight_convs(tmp_path, monkeypatch)
    parts = len(parted.parts[0])
    hashed = []
    digest = fakequant._digest
    monkeypatch.setattr(fakequant, "_digest", lambda items: hashed.extend(
        name for name, v in items if not isinstance(v, bytes)) or digest(items))
    switched_off = {**base, f"{tensors[-1]}{fakequant.PARAMS_SUFFIX}": fakequant.OFF}
    copied = {k: np.array(v, copy=True) for k, v in base.items()}
    for choice, hashes, reruns in (
            (base, len(base) + len(feeds), parts),  # every array once, the samples' too
            (base, 0, 0),  # the same arrays: no hash, nothing run
            (switched_off, 1, 1),  # one new feed: it alone hashed, the last part run
            (copied, len(base), 0)):  # equal arrays, new objects: hashed, found by content
        del hashed[:]
        runs = parted.part_runs
        got = parted.run(feeds, {0: choice}, ["y"])
        assert len(hashed) == hashes and parted.part_runs - runs == reruns * len(feeds)
        want = whole.run(feeds, {0: choice}, ["y"])
        assert all(np.array_equal(g["y"], w["y"]) for g, w in zip(got, want))
