"""conv_bn and pad_conv: rewrites that fold an op into the Conv (no function is made)."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from onnx import helper, numpy_helper

X = {"x": [1, 3, 6, 6]}


def bn_inits(tiny, channels=4, bias=True):
    inits = {"w": tiny.rand(channels, 3, 3, 3), "scale": tiny.rand(channels),
             "beta": tiny.rand(channels), "mean": tiny.rand(channels),
             "var": tiny.rand(channels, low=0.1)}
    if bias:
        inits["b"] = tiny.rand(channels)
    return inits


def conv_bn_nodes(node, bias=True, bn_out="y"):
    return [node("Conv", ["x", "w", "b"] if bias else ["x", "w"], ["c"], pads=[1, 1, 1, 1]),
            node("BatchNormalization", ["c", "scale", "beta", "mean", "var"], [bn_out],
                 epsilon=1e-3)]


@pytest.mark.parametrize("bias", [True, False], ids=["bias", "no-bias"])
def test_conv_bn_folds_batch_norm_into_a_plain_conv(tiny, make_node, bias):
    model = tiny.model(conv_bn_nodes(make_node, bias), X, ["y"], bn_inits(tiny, bias=bias))
    fused, report = tiny.fuse_and_check("conv_bn", model, exact=False)
    assert report.fired == 1 and tiny.ops(fused) == {"Conv": 1}
    (conv,) = fused.graph.node
    assert conv.output[0] == "y" and len(conv.input) == 3
    assert {t.name for t in fused.graph.initializer} == set(conv.input[1:]), "old weights pruned"
    assert not fused.functions


def test_conv_bn_leaves_a_weight_shared_with_another_conv_intact(tiny, make_node):
    nodes = [*conv_bn_nodes(make_node), make_node("Conv", ["x", "w", "b"], ["y2"], pads=[1, 1, 1, 1]),
             make_node("Add", ["y", "y2"], ["z"])]
    fused, report = tiny.fuse_and_check("conv_bn", tiny.model(nodes, X, ["z"], bn_inits(tiny)),
                                        exact=False)
    assert report.fired == 1
    assert {"w", "b"} <= {t.name for t in fused.graph.initializer}


def test_conv_bn_does_not_fold_when_the_conv_output_has_another_consumer(tiny, make_node):
    nodes = [*conv_bn_nodes(make_node), make_node("Add", ["c", "y"], ["z"])]
    fused, report = tiny.fuse_and_check("conv_bn", tiny.model(nodes, X, ["z"], bn_inits(tiny)))
    assert report.fired == 0 and tiny.ops(fused)["BatchNormalization"] == 1
    assert "also feeds Add" in report.near_misses[0]


def test_conv_bn_does_not_fold_when_the_conv_output_is_a_graph_output(tiny, make_node):
    model = tiny.model(conv_bn_nodes(make_node), X, ["y", "c"], bn_inits(tiny))
    _, report = tiny.fuse_and_check("conv_bn", model)
    assert report.fired == 0 and "graph output" in report.near_misses[0]


def test_conv_bn_does_not_fold_statistics_computed_at_run_time(tiny, make_node):
    inits = bn_inits(tiny)
    inits.pop("mean")
    nodes = conv_bn_nodes(make_node)
    nodes[-1].input[3] = "running_mean"
    model = tiny.model(nodes, {**X, "running_mean": [4]}, ["y"], inits)
    _, report = tiny.fuse_and_check("conv_bn", model)
    assert report.fired == 0 and "input 3 of BatchNormalization" in report.near_misses[0]


def test_conv_bn_reads_weights_made_by_constant_of_shape(tiny, make_node):
    inits = bn_inits(tiny)
    inits["w_shape"] = np.array([4, 3, 3, 3], np.int64)
    del inits["w"]
    fill = numpy_helper.from_array(np.array([0.25], np.float32))
    nodes = [make_node("ConstantOfShape", ["w_shape"], ["w"], value=fill), *conv_bn_nodes(make_node)]
    fused, report = tiny.fuse_and_check("conv_bn", tiny.model(nodes, X, ["y"], inits), exact=False)
    assert report.fired == 1 and tiny.ops(fused) == {"Conv": 1}


@settings(max_examples=12, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.integers(1, 6), st.floats(1e-5, 1e-1), st.integers(0, 2**16))
def test_conv_bn_fold_matches_within_1e5_for_random_statistics(tiny, make_node, channels, epsilon,
                                                               seed):
    tiny.rng = np.random.default_rng(seed)
    nodes = conv_bn_nodes(make_node)
    nodes[1].attribute[0].f = epsilon
    model = tiny.model(nodes, X, ["y"], bn_inits(tiny, channels))
    tiny.fuse_and_check("conv_bn", model, exact=False)


PADS = np.array([0, 0, 1, 2, 0, 0, 2, 1], np.int64)


def pad_conv_model(tiny, node, mode="constant", fill=None, extra=(), outputs=("y",)):
    pad_inputs = ["x", "pads"] + (["fill"] if fill is not None else [])
    nodes = [node("Pad", pad_inputs, ["p"], mode=mode),
             node("Conv", ["p", "w"], ["y"], pads=[1, 0, 1, 0]), *extra]
    inits = {"w": tiny.rand(2, 3, 3, 3), "pads": PADS}
    if fill is not None:
        inits["fill"] = np.float32(fill)
    return tiny.model(nodes, X, list(outputs), inits)


def test_pad_conv_folds_a_zero_pad_into_the_conv_pads_bit_identically(tiny, make_node):
    fused, report = tiny.fuse_and_check("pad_conv", pad_conv_model(tiny, make_node, fill=0.0))
    assert report.fired == 1 and tiny.ops(fused) == {"Conv": 1}
    assert tiny.attrs(fused.graph.node[0])["pads"] == [2, 2, 3, 1]
    assert fused.graph.node[0].input[0] == "x"


def test_pad_conv_folds_the_attribute_form_of_opset_10(tiny, make_node):
    nodes = [make_node("Pad", ["x"], ["p"], pads=[0, 0, 1, 1, 0, 0, 1, 1]),
             make_node("Conv", ["p", "w"], ["y"])]
    model = tiny.model(nodes, X, ["y"], {"w": tiny.rand(2, 3, 3, 3)}, opset=10)
    fused, report = tiny.fuse_and_check("pad_conv", model)
    assert report.fired == 1 and tiny.attrs(fused.graph.node[0])["pads"] == [1, 1, 1, 1]


@pytest.mark.parametrize("mode, fill, reason", [("reflect", None, "mode='reflect'"),
                                                ("constant", 1.5, "fills with 1.5")])
def test_pad_conv_keeps_a_pad_the_conv_cannot_do(tiny, make_node, mode, fill, reason):
    _, report = tiny.fuse_and_check("pad_conv", pad_conv_model(tiny, make_node, mode, fill))
    assert report.fired == 0 and reason in report.near_misses[0]


def test_pad_conv_does_not_fold_when_the_pad_output_has_another_consumer(tiny, make_node):
    extra = [make_node("ReduceSum", ["p"], ["s"], keepdims=1), make_node("Add", ["y", "s"], ["z"])]
    _, report = tiny.fuse_and_check("pad_conv", pad_conv_model(tiny, make_node, extra=extra,
                                                               outputs=("z",)))
    assert report.fired == 0 and "also feeds ReduceSum" in report.near_misses[0]


def test_conv_bn_on_an_ir3_model_lists_its_new_weights_as_graph_inputs(tiny, make_node):
    model = tiny.model(conv_bn_nodes(make_node), X, ["y"], bn_inits(tiny))
    model.ir_version = 3
    model.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                             for t in model.graph.initializer)
    fused, report = tiny.fuse_and_check("conv_bn", model, exact=False)
    assert report.fired == 1 and fused.ir_version == 3
    assert {i.name for i in fused.graph.input} == {"x"} | {t.name for t in fused.graph.initializer}
