"""The quantize workflow runs the integer reference over the verify samples once per
quantization: the stage judges verify's tensors, then compares the outputs among them, and a
cache keyed on the list's spelling ran the reference twice (on DNSMOS, a full pass of 19 GMAC
per sample)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from npubuild.quant.workflow import Workflow
from tests.unit.quant.test_search import _conv_middle_conv_search


def _conv_workflow(tmp_path) -> Workflow:
    """Conv → Relu → Conv, calibrated and quantized (the search tests' toy)."""
    return _conv_middle_conv_search(
        tmp_path, helper.make_node("Relu", ["c"], ["p"], name="relu")).workflow


def _counted_reference_runs(monkeypatch) -> list:
    """Each run of the integer reference from now on (`Workflow._run_deployed`), listed."""
    runs = []
    original = Workflow._run_deployed

    def counted(self, *args):
        runs.append(args[-1])
        return original(self, *args)

    monkeypatch.setattr(Workflow, "_run_deployed", counted)
    return runs


def test_the_reference_runs_once_for_any_tensors_kept_by_the_first_run(tmp_path, monkeypatch):
    from npubuild.quant.workflow import OverrideSpec

    workflow = _conv_workflow(tmp_path)
    rng = np.random.default_rng(1)
    samples = [{"x": rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)} for _ in range(2)]
    runs = _counted_reference_runs(monkeypatch)
    first = workflow.deployed_values(samples, ["y"])
    again = workflow.deployed_values(samples, ["y", "y"])  # the outputs listed twice
    assert len(runs) == 1
    assert all(np.array_equal(a["y"], b["y"]) for a, b in zip(first, again))
    # the same quantization again (a search that keeps int8 adopts the recipe's own): known
    workflow.quantize()
    workflow.adopt([])
    assert all(np.array_equal(a["y"], b["y"])
               for a, b in zip(first, workflow.deployed_values(samples, ["y"])))
    assert len(runs) == 1
    workflow.adopt([OverrideSpec(tensors=("p",), precision="int16")])  # another: runs again
    workflow.deployed_values(samples, ["y"])
    assert len(runs) == 2
    workflow.adopt([])                                      # and back: a graph changed again
    fresh = workflow.deployed_values(samples, ["y"])
    assert len(runs) == 3
    assert all(np.array_equal(a["y"], b["y"]) for a, b in zip(first, fresh))


def _two_npu_graphs(tmp_path) -> Workflow:
    """Conv (NPU) → Relu (CPU) → Conv (NPU): two NPU graphs, calibrated and quantized."""
    import onnx
    from onnx import numpy_helper

    from npubuild.quant.pipeline import SplitPipeline
    from npubuild.quant.quantizer import QuantConfig
    from npubuild.quant.workflow import Options
    from npubuild.split import graph_infos

    rng = np.random.default_rng(0)
    shape = [1, 4, 8, 8]
    split = tmp_path / "split"
    split.mkdir(parents=True)
    parts = [("npu", "x", "c", helper.make_node("Conv", ["x", "w1"], ["c"], name="conv1",
                                                pads=[1, 1, 1, 1])),
             ("cpu", "c", "p", helper.make_node("Relu", ["c"], ["p"], name="relu")),
             ("npu", "p", "y", helper.make_node("Conv", ["p", "w2"], ["y"], name="conv2",
                                                pads=[1, 1, 1, 1]))]
    for i, (_, x, y, node) in enumerate(parts):
        inits = [numpy_helper.from_array(rng.normal(0, 0.5, (4, 4, 3, 3)).astype(np.float32), w)
                 for w in node.input[1:]]
        graph = helper.make_graph([node], f"g{i}", [helper.make_tensor_value_info(x, 1, shape)],
                                  [helper.make_tensor_value_info(y, 1, shape)], inits)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
        model.ir_version = 8
        onnx.save(model, split / f"graph_{i}.onnx")
    graph_infos.write(split / "graph_infos.json", graph_infos.build(
        [(d, [x], [y]) for d, x, y, _ in parts], {t: shape for t in "xcpy"}, ["x"], ["y"]))
    workflow = Workflow(SplitPipeline(split), Options(QuantConfig(scheme="asymmetric",
                                                                  granularity="per_channel"),
                                                      chip_int16=True))
    workflow.calibrate([{"x": rng.normal(0, 1, shape).astype(np.float32)} for _ in range(3)])
    workflow.quantize()
    return workflow


def _saved(qgraph, directory) -> tuple[str, dict]:
    json_path, npz_path = qgraph.save(directory / f"{qgraph.name}.qgraph.json")
    with np.load(npz_path) as arrays:
        return json_path.read_text(), {k: arrays[k] for k in arrays.files}


def test_an_adopted_choice_quantizes_again_only_the_graphs_it_changes(tmp_path, monkeypatch):
    """The search's confirmations adopt a choice (`Workflow.adopt`): a graph whose own
    configuration the choice leaves as an earlier quantization had it is that quantization
    (not quantized again), and every graph equals what quantizing from scratch gives."""
    from npubuild.quant import quantizer
    from npubuild.quant.workflow import OverrideSpec

    workflow = _two_npu_graphs(tmp_path)
    first, second = (s.qgraph for s in workflow.states)
    quantized = []
    original = quantizer.quantize_graph

    def counted(fg, stats, config, name, *shared):
        quantized.append(name)
        return original(fg, stats, config, name, *shared)

    monkeypatch.setattr(quantizer, "quantize_graph", counted)
    wide_p = [OverrideSpec(tensors=("p",), precision="int16")]
    workflow.adopt(wide_p)                       # p is graph 2's input: graph 1 unchanged
    assert quantized == ["graph_2"]
    assert workflow.states[0].qgraph is first and workflow.states[1].qgraph is not second
    chosen = workflow.states[1].qgraph
    workflow.adopt([])                           # back to int8: both known
    assert quantized == ["graph_2"] and workflow.states[1].qgraph is second
    workflow.adopt(wide_p)
    assert quantized == ["graph_2"] and workflow.states[1].qgraph is chosen
    fresh = _two_npu_graphs(tmp_path / "fresh")  # the same choice quantized from scratch
    fresh.adopt(wide_p)
    for i, (cached, state) in enumerate(zip(workflow.states, fresh.states)):
        (tmp_path / f"a{i}").mkdir()
        (tmp_path / f"b{i}").mkdir()
        text, arrays = _saved(cached.qgraph, tmp_path / f"a{i}")
        want_text, want_arrays = _saved(state.qgraph, tmp_path / f"b{i}")
        assert text == want_text and arrays.keys() == want_arrays.keys()
        assert all(np.array_equal(arrays[k], want_arrays[k]) for k in arrays)


def test_int16_everywhere_is_judged_once_per_quantization_across_the_gram_pass(tmp_path,
                                                                               monkeypatch):
    """Measured equalisation judges the workflow it keeps at int16 everywhere, then the
    weight-rounding choice gathers GPTQ's Gram matrices and judges nearest rounding there
    again: the same quantization (only GPTQ reads the matrices), so the same values, now not
    computed twice; GPTQ's are its own, and new statistics forget them all."""
    workflow = _conv_workflow(tmp_path)
    rng = np.random.default_rng(2)
    samples = [{"x": rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)} for _ in range(2)]
    runs = _counted_reference_runs(monkeypatch)
    first = workflow.widest_integer_values(samples, ["y"])
    workflow.gather_weight_grams(samples)
    again = workflow.widest_integer_values(samples, ["y"])
    assert len(runs) == 1
    assert all(np.array_equal(a["y"], b["y"]) for a, b in zip(first, again))
    (tmp_path / "fresh").mkdir()
    fresh = _conv_workflow(tmp_path / "fresh")  # the same, judged without the gram pass
    assert all(np.array_equal(a["y"], b["y"]) for a, b in
               zip(first, fresh.widest_integer_values(samples, ["y"])))
    workflow.use_weight_rounding("gptq")
    workflow.widest_integer_values(samples, ["y"])
    assert len(runs) == 3  # fresh's, then GPTQ's own
    workflow.use_weight_rounding("nearest")
    workflow.widest_integer_values(samples, ["y"])
    assert len(runs) == 3
    workflow.calibrate(samples)                             # other statistics: judged again
    workflow.widest_integer_values(samples, ["y"])
    assert len(runs) == 4


def test_the_late_gram_pass_observes_the_grams_alone_and_gathers_the_same_matrices(
        tmp_path, monkeypatch):
    """`Workflow.gather_weight_grams` observes only the tensors a conv's Gram matrix is
    gathered on (the first pass's histograms, ranges and channel figures stay as they were):
    its matrices are bit for bit the ones a first pass gathering them too gives, and the
    statistics it leaves are the first pass's."""
    import pickle
    from dataclasses import replace

    from npubuild.quant import calibrators

    workflow = _conv_workflow(tmp_path)
    rng = np.random.default_rng(3)
    samples = [{"x": rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)} for _ in range(3)]
    updated = []
    original = calibrators.TensorStats.update

    def counted(self, x):
        updated.append(self)
        return original(self, x)

    before = {t: pickle.dumps(s) for t, s in workflow.states[0].observer.stats.items()}
    monkeypatch.setattr(calibrators.TensorStats, "update", counted)
    workflow.gather_weight_grams(samples)
    monkeypatch.undo()
    stats = workflow.states[0].observer.stats
    with_grams = {t for t, s in stats.items() if s.patch_grams}
    assert with_grams and len(updated) == len(samples) * len(with_grams) < len(samples) * len(stats)
    assert not workflow.options.grams_only
    one_pass = Workflow(workflow.pipeline, replace(workflow.options, weight_grams=True))
    one_pass.calibrate(samples)
    for t, s in stats.items():
        want = one_pass.states[0].observer.stats[t].patch_grams
        assert s.patch_grams.keys() == want.keys()
        for geometry, gram in s.patch_grams.items():
            assert gram.patches == want[geometry].patches
            assert all(np.array_equal(a, b) for a, b in zip(gram.grams, want[geometry].grams))
        grams, s.patch_grams = s.patch_grams, {}
        assert pickle.dumps(s) == before[t]  # the first pass's statistics, untouched
        s.patch_grams = grams


def test_the_gram_pass_on_workers_merges_what_it_gathers_in_this_process(tmp_path):
    """Dask workers build their workflow from the pass's options (`quant.fanout`): that
    workflow's batches observe the same tensors, and the Gram pass merging them gathers the
    matrices it gathers in this process."""
    from dataclasses import replace

    workflow = _conv_workflow(tmp_path)
    rng = np.random.default_rng(4)
    samples = [{"x": rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)} for _ in range(3)]
    (tmp_path / "local").mkdir()
    local = _conv_workflow(tmp_path / "local")
    local.gather_weight_grams(samples)
    seen = []

    def on_workers(w: Workflow):
        worker = Workflow(w.pipeline, replace(w.options))  # as fanout.observe_batch builds it
        seen.append(w.options.grams_only)
        return lambda batches: map(worker.observe_batch, batches)

    workflow.gather_weight_grams(samples, mapper=on_workers)
    assert seen == [True]
    for t, s in workflow.states[0].observer.stats.items():
        want = local.states[0].observer.stats[t].patch_grams
        assert s.patch_grams.keys() == want.keys()
        for geometry, gram in s.patch_grams.items():
            assert all(np.array_equal(a, b) for a, b in zip(gram.grams, want[geometry].grams))


def test_every_run_of_the_integer_reference_reads_the_cpu_submodels_in_one_session(
        tmp_path, monkeypatch):
    """The integer reference's runs (int8, int16 everywhere, each measured choice) run the
    pipeline's CPU submodels in the float pipeline's sessions, opened once per file: each run
    opened them anew. The values are those of a pipeline that opens its own."""
    from npubuild import onnx_io

    workflow = _two_npu_graphs(tmp_path)
    rng = np.random.default_rng(2)
    samples = [{"x": rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)} for _ in range(2)]
    workflow.pipeline.float_values(samples[0])  # the float runner's CPU session, opened
    opened = []
    real = onnx_io.session
    monkeypatch.setattr(onnx_io, "session", lambda *a, **k: opened.append(a[0]) or real(*a, **k))
    first = workflow.deployed_values(samples, ["y"])
    wide = workflow.widest_integer_values(samples, ["y"])
    assert opened == []

    monkeypatch.setattr(onnx_io, "session", real)
    fresh = _two_npu_graphs(tmp_path / "fresh")
    for mine, theirs in ((first, fresh.deployed_values(samples, ["y"])),
                         (wide, fresh.widest_integer_values(samples, ["y"]))):
        for a, b in zip(mine, theirs):
            np.testing.assert_array_equal(a["y"], b["y"])


def _held_bytes(value) -> int:
    """The bytes of every array inside ``value`` (dicts, lists, tuples)."""
    if isinstance(value, np.ndarray):
        return value.nbytes
    if isinstance(value, dict):
        return sum(_held_bytes(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return sum(_held_bytes(v) for v in value)
    return 0


def test_the_deployed_run_holds_only_what_a_later_step_reads(tmp_path, monkeypatch):
    """Across the stage, the integer run over the verify samples holds each sample's kept
    tensors and, for the per-layer comparison, the integer tensors of the NPU graphs it can
    reuse there (those no NPU graph feeds), never the float inputs nor the tensors of a graph
    fed by an NPU graph (its inputs differ from float's: recomputed anyway). deepbrain's 3-D
    U-Net held 0.4 GB per sample that way and ran out of memory at 9 GB. The per-layer
    comparison and the crosscheck stay what running every graph afresh gives."""
    from npubuild.quant.reference import quantize_inputs, run_reference

    workflow = _two_npu_graphs(tmp_path)
    rng = np.random.default_rng(2)
    samples = [{"x": rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)} for _ in range(4)]
    workflow.deployed_values(samples, ["y"])
    first = workflow.states[0].qgraph
    own = sum(_held_bytes(run_reference(first, quantize_inputs(first, s))) for s in samples)
    outputs = sum(4 * 8 * 8 * 4 for _ in samples)
    assert _held_bytes(workflow._deployed) == outputs + own
    assert all(set(env) == {0} for env in workflow._deployed["envs"])
    kept = workflow.evaluate(samples, (), 4)

    def fresh(self, k, state, inputs):
        return run_reference(state.qgraph, quantize_inputs(state.qgraph, inputs))

    monkeypatch.setattr(Workflow, "_reference_env", fresh)
    again = workflow.evaluate(samples, (), 4)
    assert kept.per_layer() == again.per_layer()
    assert kept.crosscheck_summary() == again.crosscheck_summary()


def test_the_stage_judge_keeps_only_the_hand_over_tensors_it_judges(tmp_path):
    """The quantize stage's judge holds per sample the model outputs and the hand-over tensors
    a threshold, a slice or a selection reads; an unjudged hand-over tensor (no
    ``verify.handover`` threshold) is held by no one, yet a recipe may still name it."""
    from npubuild.recipe.model import VerifySpec
    from npubuild.verify.verdict import SampleJudge, check_names

    workflow = _two_npu_graphs(tmp_path)
    rng = np.random.default_rng(3)
    samples = [{"x": rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)} for _ in range(2)]
    plain = SampleJudge(VerifySpec(), {}, workflow.pipeline, samples)
    assert plain.kept == ["y"] and all(set(f) == {"y"} for f in plain.floats)
    assert plain.names["c"].shape == (1, 4, 8, 8)
    sliced = VerifySpec(slices=[{"tensor": "c", "axis": 1, "end": 2}])
    check_names(None, sliced, ["y"], {**plain.names, **plain.refs[0]})  # c may be named
    assert SampleJudge(sliced, {}, workflow.pipeline, samples).kept == ["y", "c"]
    judged = SampleJudge(VerifySpec(handover={"min_cosine": 0.9}), {}, workflow.pipeline, samples)
    assert judged.kept == ["y", "c"]
    verdict = judged(workflow.deployed_values(samples, judged.kept))
    assert set(verdict.npu_outputs) == {"c"}
