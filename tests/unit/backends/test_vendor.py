"""What the vendor backends share: the submodel as a vendor reads it, logs kept as artifacts,
proof figures, and which backend built a compile directory."""

from __future__ import annotations

import json

import numpy as np

from npubuild import backends
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
