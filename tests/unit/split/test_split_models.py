"""The split on small models written inline: control flow, recurrent ops, policies, outputs."""

from __future__ import annotations

import json
import os
import xml.etree.ElementTree as ET

import numpy as np
import onnx
import pytest

from npubuild import onnx_io, proofs
from npubuild.errors import BuildError
from npubuild.recipe.model import SplitSpec
from npubuild.runtime import Runner
from npubuild.split import SelectorError, check_placement, plan_split, split_model
from npubuild.split import graph_infos
from npubuild.targets import load_chip
from tests.unit.split.split_models import chain, conv_lstm_conv, fused_conv_act, if_model

GOLDEN = os.path.join(os.path.dirname(__file__), "golden")
NPU16 = load_chip("npu-16m")


def devices(report: dict) -> list[tuple[str, int]]:
    return [(g["device"], g["nodes"]) for g in report["graphs"]]


def runner_equals_original(model, out, seed=1):
    feeds = proofs.make_feeds(model, seed=seed)
    expected = onnx_io.run(model, feeds)
    got = Runner(out).run(feeds)
    assert got.keys() == expected.keys()
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=1e-5, atol=1e-6)


def test_lstm_gets_a_cpu_segment_between_two_npu_segments(tmp_path):
    model = conv_lstm_conv()
    report = split_model(model, NPU16, None, tmp_path)
    assert devices(report) == [("npu", 2), ("cpu", 1), ("npu", 2)]
    lstm = next(p for p in check_placement(model, NPU16) if p.name == "lstm")
    assert (lstm.device, lstm.graph, lstm.reasons) == ("cpu", 1, ["op LSTM is not supported by chip npu-16m"])
    for i in range(3):
        onnx.checker.check_model(onnx.load(str(tmp_path / f"graph_{i}.onnx")), full_check=True)
    runner_equals_original(model, tmp_path)


def test_if_with_outer_scope_captures_becomes_a_cpu_submodel(tmp_path):
    model = if_model()
    report = split_model(model, NPU16, None, tmp_path)
    assert devices(report) == [("npu", 1), ("cpu", 3), ("npu", 1)]
    infos = graph_infos.read(tmp_path)
    # the If's branches read conv_in_out from the outer scope: it is the CPU graph's input
    assert infos["graphs"][1]["inputs"] == ["conv_in_out"]
    cpu = onnx.load(str(tmp_path / "graph_1.onnx"))
    assert {t.name for t in cpu.graph.initializer} >= {"scale", "zero"}
    assert "shift" in {o for n in cpu.graph.node if n.op_type == "Constant" for o in n.output}
    runner_equals_original(model, tmp_path)


def test_graph_infos_golden_for_a_small_model(tmp_path):
    split_model(chain("Conv", "Sin", "Conv"), NPU16, None, tmp_path, layout="NCHW")
    got = json.loads((tmp_path / "graph_infos.json").read_text())
    path = os.path.join(GOLDEN, "graph_infos_conv_erf_conv.json")
    if os.environ.get("NPUBUILD_UPDATE_GOLDEN"):
        os.makedirs(GOLDEN, exist_ok=True)
        with open(path, "w") as fh:
            json.dump(got, fh, indent=2)
            fh.write("\n")
    with open(path) as fh:
        assert got == json.load(fh)
    assert graph_infos.problems(got) == []


def test_graph_infos_schema_is_a_valid_json_schema():
    import jsonschema

    from npubuild.schemas import load

    jsonschema.Draft202012Validator.check_schema(load("graph_infos"))


def test_submodels_keep_the_functions_and_opsets_they_need(tmp_path):
    model = fused_conv_act(3)
    report = split_model(model, NPU16, SplitSpec(force_cpu=["fused"]), tmp_path)
    assert devices(report) == [("cpu", 1)]
    sub = onnx.load(str(tmp_path / "graph_0.onnx"))
    assert [(f.domain, f.name) for f in sub.functions] == [("npubuild.fused", "ConvAct")]
    assert {o.domain for o in sub.opset_import} == {"", "npubuild.fused"}
    assert sorted(t.name for t in sub.graph.initializer) == ["b", "w"]
    runner_equals_original(model, tmp_path)


@pytest.mark.parametrize("edit,problem", [
    (lambda d: d["graphs"][0].pop("context_dir"), "graphs/0"),
    (lambda d: d["graphs"][1].update(context_dir="x"), "graphs/1"),
    (lambda d: d.update(graph_num=7), "graph_num is 7 but there are 3 graphs"),
    (lambda d: d["graphs"].reverse(), "is produced by no earlier graph"),
    (lambda d: d["tensors"]["x"].update(attr="weird"), "tensors/x/attr"),
    (lambda d: d.update(extra=1), "Additional properties are not allowed"),
])
def test_graph_infos_validation_catches_broken_files(tmp_path, edit, problem):
    split_model(chain("Conv", "Sin", "Conv"), NPU16, None, tmp_path)
    data = json.loads((tmp_path / "graph_infos.json").read_text())
    edit(data)
    assert any(problem in p for p in graph_infos.problems(data)), graph_infos.problems(data)
    with pytest.raises(BuildError, match="refusing to write an invalid"):
        graph_infos.write(tmp_path / "bad.json", data)


def test_support_json_and_picture(tmp_path):
    split_model(chain("Conv", "Sin", "Conv"), NPU16, None, tmp_path)
    support = json.loads((tmp_path / "support.json").read_text())
    assert [(n["name"], n["device"], n["graph"]) for n in support["nodes"]] == [
        ("n0", "npu", 0), ("n1", "cpu", 1), ("n2", "npu", 2)]
    assert support["nodes"][1]["reasons"] == ["op Sin is not supported by chip npu-16m"]
    svg = ET.parse(tmp_path / "segments.svg").getroot()
    texts = [t.text for t in svg.iter("{http://www.w3.org/2000/svg}text")]
    assert {"graph_0 · NPU", "graph_1 · CPU", "graph_2 · NPU"} <= set(texts)


@pytest.mark.parametrize("spec,expected", [
    (SplitSpec(), [("npu", 2), ("cpu", 1), ("npu", 2)]),
    (SplitSpec(policy="cpu_only"), [("cpu", 5)]),
    (SplitSpec(force_cpu=["Sigmoid"]), [("npu", 1), ("cpu", 2), ("npu", 2)]),
    (SplitSpec(force_cpu=["n3"]), [("npu", 2), ("cpu", 2), ("npu", 1)]),
    (SplitSpec(force_cpu=["n3_out"]), [("npu", 2), ("cpu", 2), ("npu", 1)]),
    (SplitSpec(force_cpu=["n[34]"]), [("npu", 2), ("cpu", 3)]),
    (SplitSpec(force_npu=["Sin"]), [("npu", 5)]),
    (SplitSpec(policy="manual", placement={"n0": "cpu", "n2": "npu"}), [("cpu", 1), ("npu", 4)]),
    (SplitSpec(min_npu_nodes=3), [("cpu", 5)]),
], ids=["npu_first", "cpu_only", "force op type", "force node", "force tensor", "force glob",
        "force npu", "manual", "min_npu_nodes"])
def test_policies(tmp_path, spec, expected):
    model = chain("Conv", "Sigmoid", "Sin", "Relu", "Relu")  # Sin is not on npu-16m
    report = split_model(model, NPU16, spec, tmp_path)
    assert devices(report) == expected
    runner_equals_original(model, tmp_path)


def test_forced_and_demoted_nodes_say_why():
    model = chain("Conv", "Sigmoid", "Sin", "Relu", "Relu")
    forced = {p.name: p.reasons for p in check_placement(model, NPU16, SplitSpec(force_npu=["Sin"]))}
    assert forced["n2"] == ["forced onto the NPU by split.force_npu[0] ('Sin')",
                            "(the chip check says: op Sin is not supported by chip npu-16m)"]
    small = {p.name: p.reasons for p in check_placement(model, NPU16, SplitSpec(min_npu_nodes=3))}
    assert small["n3"] == ["NPU island of 2 nodes is smaller than split.min_npu_nodes (3)"]


def test_min_cost_keeps_a_tiny_island_on_the_cpu_and_a_heavy_one_on_the_npu(tmp_path):
    shape = (1, 64, 56, 56)
    tiny = chain("Sin", "Relu", "Sin", shape=shape)
    plan = plan_split(tiny, NPU16, SplitSpec(policy="min_cost"))
    assert [s.device for s in plan.segments] == ["cpu"]
    (why,) = plan.reasons[1]
    assert why.startswith("kept on the CPU by split.policy min_cost: its NPU island of 1 node: "
                          "200,704 MACs take ~25.1 µs on the CPU")
    assert "moving its 2 boundary tensors (1,605,632 bytes)" in why
    heavy = chain("Sin", "Conv", "Sin", shape=shape)
    assert [s.device for s in plan_split(heavy, NPU16, SplitSpec(policy="min_cost")).segments] == [
        "cpu", "npu", "cpu"]
    assert [s.device for s in plan_split(tiny, NPU16, SplitSpec()).segments] == ["cpu", "npu", "cpu"]


@pytest.mark.parametrize("spec,field", [
    (SplitSpec(force_cpu=["Relu", "nope"]), "split.force_cpu[1]"),
    (SplitSpec(policy="manual", placement={"ghost": "cpu"}), "split.placement.ghost"),
])
def test_unknown_selector_is_a_user_error_naming_the_field(spec, field):
    with pytest.raises(SelectorError) as info:
        plan_split(chain("Relu"), NPU16, spec)
    assert info.value.field == field and "matches no node name, op type or output tensor" in str(info.value)


def test_a_node_forced_both_ways_is_an_error():
    with pytest.raises(SelectorError, match="matched by both split.force_cpu\\[0\\]"):
        plan_split(chain("Relu"), NPU16, SplitSpec(force_cpu=["n0"], force_npu=["Relu"]))


def test_proof_names_the_first_tensor_that_differs(tmp_path):
    from npubuild.split.outputs import prove, write_split

    model = chain("Conv", "Sin", "Conv")
    plan = plan_split(model, NPU16)
    feeds = proofs.make_feeds(model)
    _, reference = write_split(plan, tmp_path, feeds)
    reference["n0_out"] = reference["n0_out"] + 1
    with pytest.raises(BuildError, match="split: .*graph_0 output tensor 'n0_out': max abs diff 1"):
        prove(tmp_path, feeds, reference)


def test_stage_reads_upstream_and_maps_selector_errors_to_the_recipe(tmp_path):
    from npubuild.recipe import load_recipe
    from npubuild.stages import STAGES, StageContext
    from npubuild.errors import UserError

    model = chain("Conv", "Sin", "Conv")
    upstream = tmp_path / "fusion"
    onnx_io.save_model(model, upstream / "model.onnx")
    recipe = tmp_path / "r.yaml"
    body = ("version: 1\nname: t\nmodel:\n  path: fusion/model.onnx\n"
            "  inputs: [{name: x, shape: [1, 4, 8, 8], layout: NCHW}]\nsplit:\n  force_cpu: [NAME]\n")
    recipe.write_text(body.replace("NAME", "n0"))
    ctx = StageContext(load_recipe(recipe), NPU16, {"fusion": upstream}, tmp_path / "out")
    report = STAGES["split"].function()(ctx)["split"]
    assert devices(report) == [("cpu", 2), ("npu", 1)] and report["proof"]["outputs_equal"]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "graph_0.onnx", "graph_1.onnx", "graph_infos.json", "proof_inputs.npz", "segments.svg",
        "support.json"]
    recipe.write_text(body.replace("NAME", "typo"))
    ctx = StageContext(load_recipe(recipe), NPU16, {"fusion": upstream}, tmp_path / "out2")
    with pytest.raises(UserError) as info:
        STAGES["split"].function()(ctx)
    assert str(info.value).startswith(f"{recipe}:7:15: split.force_cpu[0]: 'typo' matches no node")


def test_nodes_listed_out_of_order_are_cut_in_dependency_order(tmp_path):
    model = chain("Conv", "Sin", "Relu")
    nodes = list(model.graph.node)[::-1]
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    report = split_model(model, NPU16, None, tmp_path)
    assert devices(report) == [("npu", 1), ("cpu", 1), ("npu", 1)]
    runner_equals_original(model, tmp_path)


def test_a_boundary_tensor_padded_with_minus_infinity_proves_equal(tmp_path):
    """SwiftF0 pads a log spectrum with -inf before a max over pitch bins: the CPU submodel hands
    the -inf over and the unsplit model holds it at the same places. The proof compared
    -inf - -inf = NaN and called the split a bug."""
    from tests.unit.split.split_models import Net

    net = Net()
    x = net.input("x", [1, 4, 8, 8])
    erf = net.op("Sin", [x], name="erf")
    pads = net.init("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))
    floor = net.init("floor", np.array(-np.inf, np.float32))
    padded = net.op("Pad", [erf, pads, floor], name="pad")
    pooled = net.op("MaxPool", [padded], name="pool", kernel_shape=[3, 3])
    model = net.model([net.conv(pooled, 4, 4, name="conv")])
    report = split_model(model, NPU16, SplitSpec(force_cpu=["Pad"]), tmp_path)
    assert report["proof"]["outputs_equal"]
    boundary = json.loads((tmp_path / "graph_infos.json").read_text())
    assert "pad_out" in json.dumps(boundary)


def test_a_pad_with_minus_infinity_stays_on_the_cpu_with_its_reason():
    """No integer stands for -inf: SwiftF0's Pad of its log spectrum (a mask for the softmax
    over pitch bins after it) ran on the NPU and calibration stopped on 'NaN or Inf values'."""
    from tests.unit.split.split_models import Net

    net = Net()
    x = net.input("x", [1, 4, 8, 8])
    pads = net.init("pads", np.array([0, 0, 1, 1, 0, 0, 1, 1], np.int64))
    for name, value in (("masked", -np.inf), ("zeroed", 0.0)):
        net.op("Pad", [net.conv(x, 4, 4, name=f"{name}_conv"), pads,
                       net.init(f"{name}_value", np.array(value, np.float32))], name=name)
    model = net.model([f"{name}_out" for name in ("masked", "zeroed")])
    placed = {p.name: p for p in check_placement(model, NPU16)}
    assert placed["masked"].device == "cpu"
    assert placed["masked"].reasons == ["The quantizer has no integer kernel for it: Pad value -inf: "
                                        "no integer stands for it"]
    assert placed["zeroed"].device == "npu"


def test_an_npu_island_that_only_moves_data_runs_on_the_cpu_with_its_reason(tmp_path):
    """g2p-id's LSTM encoder: the LSTM on the CPU, its states Squeezed on the NPU. That island
    computes nothing, yet costs a hand-over each way and an int8 rounding: it goes to the CPU.
    An island that computes (a Conv) keeps its data movement beside it."""
    model = chain("Sin", "Transpose", "Identity", "Sin")
    placed = {p.name: p for p in check_placement(model, NPU16)}
    assert placed["n1"].device == placed["n2"].device == "cpu"
    assert placed["n1"].reasons[0].startswith("an NPU island of 2 nodes that only move data "
                                              "(Identity, Transpose)")
    assert devices(split_model(model, NPU16, None, tmp_path)) == [("cpu", 4)]
    runner_equals_original(model, tmp_path)
    computing = {p.name: p.device for p in check_placement(chain("Sin", "Transpose", "Conv", "Sin"), NPU16)}
    assert computing["n1"] == computing["n2"] == "npu"


def test_pipeline_outputs_keep_the_models_order(tmp_path):
    """The model's first output comes from a later segment than its second (pyfrspell's
    lemmatiser: `token_logits`, then `code_logits`, which the NPU graph listed first): the
    pipeline still lists them in the model's order, which `verify.task` reads as "the first
    model output" when `task_outputs` is not set."""
    from npubuild.runtime.runner import Runner
    from tests.unit.split.split_models import Net

    net = Net()
    x = net.input("x", [1, 4, 8, 8])
    trunk = net.conv(x, 4, 4, name="trunk")
    second = net.op("Relu", [trunk], name="second")
    late = net.conv(net.op("Sin", [trunk], name="cpu_hop"), 4, 4, name="late")
    model = net.model([late, second])
    split_model(model, NPU16, None, tmp_path)
    assert Runner(tmp_path).outputs == [late, second]
    runner_equals_original(model, tmp_path)
