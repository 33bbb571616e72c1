"""What the vendor backends share: the submodel as a vendor reads it, logs kept as artifacts,
proof figures, and which backend built a compile directory."""

from __future__ import annotations

import json

import numpy as np
import pytest

from npubuild import backends, onnx_io
from npubuild.backends import vendor
from tests.unit.split.split_models import Net


def fused_model():
    from npubuild.fusions import load_builtins

    net = Net()
    x = net.conv(net.input("x", [1, 3, 8, 8]), 3, 4)
    model = net.model([net.op("Mul", [x, net.op("Sigmoid", [x])])])
    fused, report = load_builtins()["conv_silu"].apply(model)
    assert report.fired == 1
    return fused


def test_a_vendor_gets_standard_onnx_at_an_ir_it_reads():
    model = vendor.vendor_model(fused_model())
    assert not model.functions and model.ir_version <= vendor.VENDOR_IR
    assert {n.op_type for n in model.graph.node} == {"Conv", "Sigmoid", "Mul"}
    assert [o.domain for o in model.opset_import] == [""]


def test_a_kept_log_has_no_colours_times_or_machine_paths(tmp_path):
    work = tmp_path / "npubuild-rknn-x"
    text = f"\x1b[1;33mW\x1b[0m D RKNN: [12:36:56.948] Export RKNN model to {work}/a.rknn\n"
    assert vendor.clean_log(text, work) == "W D RKNN: Export RKNN model to <work>/a.rknn\n"


def test_proof_figures_compare_every_sample_of_every_output():
    floats = [{"y": np.array([1.0, 2.0])}, {"y": np.array([3.0, 4.0])}]
    got = {"0:y": np.array([1.0, 2.0]), "1:y": np.array([3.0, 4.5])}
    m = vendor.against_float(["y"], got, floats)["y"]
    assert 0.99 < m["cosine"] < 1 and m["max_abs"] == 0.5


def test_a_compile_dir_names_its_backend_and_defaults_to_the_simulated_one(tmp_path):
    assert backends.built_by(tmp_path) == "simulated"
    (tmp_path / backends.BACKEND_FILE).write_text(json.dumps({"backend": "vela"}))
    assert backends.built_by(tmp_path) == "vela"


def test_every_chip_names_a_registered_backend_and_its_toolchain():
    from npubuild import toolchains
    from npubuild.targets import load_chip, preset_names

    for name in preset_names():
        backend = backends.of(load_chip(name))
        assert backend.name in backends.names()
        if backend.toolchain is not None:
            assert backend.toolchain in toolchains.TOOLCHAINS


def test_a_chip_file_naming_an_unknown_backend_is_refused_at_its_line(tmp_path):
    import pytest

    from npubuild.errors import UserError
    from npubuild.targets import load_chip, preset_file

    text = preset_file("npu-tiny").read_text().replace("name: npu-tiny", "name: x\nbackend: nope")
    path = tmp_path / "x.yaml"
    path.write_text(text)
    with pytest.raises(UserError, match=r"x.yaml:\d+.*backend.*unknown backend 'nope'"):
        load_chip(str(path))


def test_calls_to_an_overloaded_function_of_another_opset_are_inlined_too():
    import onnx
    from onnx import helper

    body = helper.make_function("npubuild.fused", "HardSwish", ["x"], ["y"],
                                [helper.make_node("HardSwish", ["x"], ["y"])],
                                [helper.make_opsetid("", 13)], overload="Relu6Div")
    node = helper.make_node("HardSwish", ["a"], ["b"], domain="npubuild.fused", overload="Relu6Div")
    graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("a", 1, [1, 2])],
                              [helper.make_tensor_value_info("b", 1, [1, 2])])
    model = helper.make_model(graph, functions=[body], opset_imports=[
        helper.make_opsetid("", 17), helper.make_opsetid("npubuild.fused", 1)])
    model.ir_version = 10
    out = vendor.vendor_model(model)
    assert [(n.domain, n.op_type) for n in out.graph.node] == [("", "HardSwish")]
    onnx.checker.check_model(out)


def fused_net_recipe(tmp_path, target: str) -> object:
    """A tiny model whose NPU graph holds a HardSwish (a fused element-wise function, one table
    in npubuild's graph), fused convs (Conv+Relu, Conv+SiLU) and a conv with a bias Add
    npubuild folds into it: tensors inside npubuild's layers, numbered by the inliner."""
    from tests.conftest import TINY_MODEL, TINY_RECIPE, write_recipe

    net = Net()
    h = net.conv(net.input("x", [1, 3, 8, 8]), 3, 3, name="c0")
    three, six = net.init("three", np.array(3.0, np.float32)), net.init("six", np.array(6.0, np.float32))
    clip = net.op("Clip", [net.op("Add", [h, three]), net.init("zero", np.array(0.0, np.float32)), six])
    h = net.op("Div", [net.op("Mul", [h, clip]), six])
    x = net.op("Relu", [net.conv(h, 3, 4, name="c1")])
    y = net.conv(x, 4, 4, name="c2")
    y = net.op("Mul", [y, net.op("Sigmoid", [y])])
    z = net.op("Add", [net.conv(y, 4, 4, name="c3"), net.init("bias", np.full((1, 4, 1, 1), 0.25, np.float32))])
    model = net.model([net.op("Relu", [z])])
    onnx_path = tmp_path / "fused.onnx"
    onnx_io.save_model(model, onnx_path)
    body = TINY_RECIPE.replace("name: tiny", f"name: fused-{target}").replace(
        str(TINY_MODEL), str(onnx_path))
    return write_recipe(tmp_path, body + f"target: {target}\n"
                        "fusion: [hard_swish, conv_act, conv_silu]\n"
                        "verify: {data: 'pkg:skimage/data/[d-h]*.png', samples: 2, min_cosine: 0.98}\n")


def test_every_tensor_a_vendor_sees_has_npubuilds_calibrated_range(cli, tmp_path):
    """The vendor's ONNX names its tensors as quantize did (inlined the same way), and
    calibration.json has a range for each, those inside npubuild's layers (a conv's output
    before its Relu, SiLU or bias Add) included: none falls back to the vendor's own but the
    inside of an element-wise function, one table in npubuild's graph (which TPU-MLIR
    converts to one op too)."""
    from npubuild.runtime import Runner

    recipe = fused_net_recipe(tmp_path, "bm1684x")
    result = cli("run", str(recipe), "quantize", "--build-dir", str(tmp_path / "build"),
                 "--cache", str(tmp_path / "cache"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    root = tmp_path / "build" / "fused-bm1684x"
    ranges = vendor.calibrated_ranges(root / "quantize")
    npu = [g for g in Runner(root / "split").graphs if g.device == "npu"]
    assert npu
    for graph in npu:
        split_model = onnx_io.load_model(graph.model_path)
        model = vendor.vendor_model(split_model)
        tensors = [o for n in model.graph.node if n.op_type != "Constant" for o in n.output]
        tables = {f.name: [o for n in f.node for o in n.output] for f in split_model.functions
                  if f.name == "HardSwish"}
        assert tables, "the hard_swish fusion fired"
        missing = [t for t in tensors if ranges[graph.name].get(t) is None
                   and t.rsplit("__", 1)[0] not in tables["HardSwish"]]
        assert tensors and not missing, f"{graph.name}: no npubuild range for {missing}"
        assert any(ranges[graph.name].get(t) and ranges[graph.name].get(t)[0] == "inner"
                   for t in tensors)



def test_a_vendor_scratch_folder_is_removed_and_a_failed_runs_log_kept_in_the_build(tmp_path, monkeypatch):
    import tempfile

    from npubuild.errors import BuildError

    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    with vendor.workdir("rknn", tmp_path / "logs", "compile.graph_0.npubuild") as work:
        (work / "rknn_worker.log").write_text("fine\n")
    assert list(scratch.iterdir()) == []
    assert not (tmp_path / "logs").exists()  # nothing kept when the vendor succeeded
    with pytest.raises(BuildError) as err:
        with vendor.workdir("rknn", tmp_path / "logs", "compile.graph_0.vendor") as work:
            log = work / "rknn_worker.log"
            log.write_text("E build: boom\n")
            raise BuildError(f"graph_0: rknn failed: boom (log: {log})", stage="compile",
                             hint=f"the whole log: {log}")
    kept = tmp_path / "logs" / "compile.graph_0.vendor.rknn_worker.log"
    assert list(scratch.iterdir()) == [] and kept.read_text() == "E build: boom\n"
    assert err.value.hint == f"the whole log: {kept}" and f"(log: {kept})" in str(err.value)


def test_a_vendors_outputs_are_read_in_npubuilds_integer_steps_against_its_reference():
    from npubuild.backends.vela import converter_qgraph
    from npubuild.quant.reference import dequantize_tensor, quantize_inputs, run_reference

    net = Net()
    model = net.model([net.op("Relu", [net.conv(net.input("x", [1, 3, 8, 8]), 3, 4)])])
    rng = np.random.default_rng(0)
    feeds = [{"x": rng.standard_normal((1, 3, 8, 8)).astype(np.float32)} for _ in range(2)]
    qgraph = converter_qgraph(model, feeds, "g")
    out = qgraph.outputs[0]
    ints = [run_reference(qgraph, quantize_inputs(qgraph, f))[out] for f in feeds]
    same = {f"{k}:{out}": dequantize_tensor(qgraph, out, v) for k, v in enumerate(ints)}
    agreement = vendor.reference_agreement(qgraph, [out], same, feeds)
    assert agreement["bit_exact"] == 1 and agreement["outputs"][out]["whole_steps"]
    moved = dict(same)
    first = ints[0].astype(np.int32)
    first.flat[3] += 2  # one element two steps off
    moved[f"0:{out}"] = dequantize_tensor(qgraph, out, first)
    row = vendor.reference_agreement(qgraph, [out], moved, feeds)["outputs"][out]
    assert (row["max_steps"], row["differing_fraction"]) == (2, round(1 / (2 * first.size), 6))
    half = {**same, f"0:{out}": same[f"0:{out}"] + 0.5 * qgraph.tensors[out].scale}
    assert not vendor.reference_agreement(qgraph, [out], half, feeds)["outputs"][out]["whole_steps"]
