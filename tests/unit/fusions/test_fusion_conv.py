"""conv_act and conv_silu: Conv + activation fused into one npubuild.fused function node."""

import numpy as np
import pytest

X = {"x": [1, 3, 8, 8]}


BOUNDS = {"lo": np.float32(0), "six": np.float32(6), "m1": np.float32(-1), "p1": np.float32(1)}


def conv_model(tiny, node, tail, outputs=("y",), bias=True, **conv_attrs):
    inits = {"w": tiny.rand(4, 3, 3, 3)}
    if bias:
        inits["b"] = tiny.rand(4)
    used = {t for n in tail for t in n.input}
    inits.update({k: v for k, v in BOUNDS.items() if k in used})
    conv = node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["c"], **conv_attrs)
    return tiny.model([conv, *tail], X, list(outputs), inits)


ACTIVATIONS = [
    ("Relu", [], {}, "Relu", {}),
    ("Clip", ["lo", "six"], {}, "Relu6", {"activation_min": 0.0, "activation_max": 6.0}),
    ("Clip", ["m1", "p1"], {}, "Clip", {"activation_min": -1.0, "activation_max": 1.0}),
    ("Sigmoid", [], {}, "Sigmoid", {}),
    ("HardSigmoid", [], {"alpha": 0.3}, "HardSigmoid", {"activation_alpha": 0.3, "activation_beta": 0.5}),
    ("LeakyRelu", [], {"alpha": 0.2}, "LeakyRelu", {"activation_alpha": 0.2}),
]


@pytest.mark.parametrize("op, extra, attrs, activation, params", ACTIVATIONS,
                         ids=[a[3] for a in ACTIVATIONS])
def test_conv_act_fuses_each_activation_with_explicit_conv_attributes(tiny, make_node, op, extra,
                                                                      attrs, activation, params):
    model = conv_model(tiny, make_node, [make_node(op, ["c", *extra], ["y"], **attrs)],
                       kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1])
    fused, report = tiny.fuse_and_check("conv_act", model)
    assert report.fired == 1
    assert tiny.ops(fused) == {f"ConvAct:{activation}": 1}
    got = tiny.attrs(tiny.fused(fused)[0])
    assert got["activation"] == activation
    assert {k: got[k] for k in ("kernel_shape", "strides", "pads", "dilations", "group")} == {
        "kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1], "dilations": [1, 1],
        "group": 1}
    for key, value in params.items():
        assert got[key] == pytest.approx(value)


def test_conv_act_fills_kernel_shape_from_the_weight_and_tags_missing_bias(tiny, make_node):
    model = conv_model(tiny, make_node, [make_node("Relu", ["c"], ["y"])], bias=False)
    fused, _ = tiny.fuse_and_check("conv_act", model)
    node = tiny.fused(fused)[0]
    assert node.overload == "ReluNoBias"
    assert tiny.attrs(node)["kernel_shape"] == [3, 3]
    assert tiny.attrs(node)["pads"] == [0, 0, 0, 0]
    assert fused.ir_version >= 10
    assert any(o.domain == "npubuild.fused" and o.version == 1 for o in fused.opset_import)


def test_conv_act_instances_share_one_function_per_activation(tiny, make_node):
    nodes = [make_node("Conv", ["x", "w"], ["c1"], pads=[1, 1, 1, 1]), make_node("Relu", ["c1"], ["r1"]),
             make_node("Conv", ["r1", "w2"], ["c2"]), make_node("Relu", ["c2"], ["r2"]),
             make_node("Conv", ["r2", "w2"], ["c3"]), make_node("LeakyRelu", ["c3"], ["y"])]
    model = tiny.model(nodes, X, ["y"], {"w": tiny.rand(3, 3, 3, 3), "w2": tiny.rand(3, 3, 1, 1)})
    fused, report = tiny.fuse_and_check("conv_act", model)
    assert report.fired == 3
    assert sorted((f.name, f.overload) for f in fused.functions) == [
        ("ConvAct", "LeakyReluNoBias"), ("ConvAct", "ReluNoBias")]


def test_conv_act_does_not_fuse_when_the_conv_output_has_another_consumer(tiny, make_node):
    tail = [make_node("Relu", ["c"], ["y"]), make_node("Add", ["c", "y"], ["z"])]
    fused, report = tiny.fuse_and_check("conv_act", conv_model(tiny, make_node, tail, ("z",)))
    assert report.fired == 0 and tiny.ops(fused)["Conv"] == 1
    assert "also feeds Add" in report.near_misses[0]


def test_conv_act_does_not_fuse_when_the_conv_output_is_a_graph_output(tiny, make_node):
    model = conv_model(tiny, make_node, [make_node("Relu", ["c"], ["y"])], ("y", "c"))
    fused, report = tiny.fuse_and_check("conv_act", model)
    assert report.fired == 0
    assert "'c'" in report.near_misses[0] and "graph output" in report.near_misses[0]


def test_conv_act_refuses_a_clip_with_computed_bounds(tiny, make_node):
    tail = [make_node("Relu", ["x"], ["rx"]), make_node("ReduceMax", ["rx"], ["hi"], keepdims=0),
            make_node("Clip", ["c", "", "hi"], ["y"])]
    fused, report = tiny.fuse_and_check("conv_act", conv_model(tiny, make_node, tail))
    assert report.fired == 0 and "not a constant" in report.near_misses[0]


def silu_tail(node, source="c"):
    return [node("Sigmoid", [source], ["s"]), node("Mul", [source, "s"], ["y"])]


def test_conv_silu_fuses_conv_sigmoid_mul(tiny, make_node):
    fused, report = tiny.fuse_and_check("conv_silu", conv_model(tiny, make_node, silu_tail(make_node),
                                                                kernel_shape=[3, 3]))
    assert report.fired == 1 and tiny.ops(fused) == {"ConvSilu:Silu": 1}
    node = tiny.fused(fused)[0]
    assert tiny.attrs(node)["activation"] == "Silu"
    assert node.name == "/c/ConvSilu"
    assert {p.key: p.value for p in node.metadata_props} == {
        "npubuild.rule": "conv_silu", "npubuild.fused_nodes": "/c,/s,/y"}


def test_conv_silu_does_not_fuse_when_the_sigmoid_output_has_another_consumer(tiny, make_node):
    tail = [*silu_tail(make_node), make_node("Add", ["s", "y"], ["z"])]
    fused, report = tiny.fuse_and_check("conv_silu", conv_model(tiny, make_node, tail, ("z",)))
    assert report.fired == 0 and "also feeds Add" in report.near_misses[0]


def test_conv_silu_does_not_fuse_when_the_conv_output_is_a_graph_output(tiny, make_node):
    fused, report = tiny.fuse_and_check("conv_silu",
                                        conv_model(tiny, make_node, silu_tail(make_node), ("y", "c")))
    assert report.fired == 0 and "graph output" in report.near_misses[0]


def test_conv_silu_after_silu_fires_nowhere_and_says_why(tiny, make_node):
    model = conv_model(tiny, make_node, silu_tail(make_node))
    after_silu, _ = tiny.apply("silu", model)
    _, report = tiny.apply("conv_silu", after_silu)
    assert report.fired == 0
    assert report.near_misses == ["the graph has no Mul node"]
