"""rewrite_gemm_as_conv and split_gemm_slices: seed 002's UFLD head ends up 4-D only, with the
same outputs; Gemm attribute variants; the errors for Gemms that have no Conv form."""

import numpy as np
import pytest
from onnx import helper

from npubuild.surgery import SurgeryError

n = helper.make_node
SLICES = [(0, 12), (12, 20), (20, 26), (26, 30)]


def ufld_head(tiny, opset=13, relu=False):
    """Conv (1,8,5,6) -> Reshape(1,-1) -> Gemm(240->64) -> [Relu] -> Gemm(64->30) -> 4 Slices,
    seed 002's UFLD tail scaled down (the real one: (1,8,10,25) -> 2048 -> 39576)."""
    inits = {"cw": tiny.rand(8, 4, 3, 3) * 0.1, "cb": tiny.rand(8), "w1": tiny.rand(64, 240) * 0.1,
             "b1": tiny.rand(64), "w2": tiny.rand(64, 30) * 0.1, "b2": tiny.rand(30),
             "shape": np.array([1, -1], np.int64)}
    nodes = [n("Conv", ["x", "cw", "cb"], ["c"], name="/pool/Conv", kernel_shape=[3, 3], pads=[1, 1, 1, 1]),
             n("Reshape", ["c", "shape"], ["flat"], name="/Reshape"),
             n("Gemm", ["flat", "w1", "b1"], ["g1"], name="/cls/cls.1/Gemm", transB=1)]
    if relu:
        nodes.append(n("Relu", ["g1"], ["g1r"], name="/cls/cls.2/Relu"))
    nodes.append(n("Gemm", ["g1r" if relu else "g1", "w2", "b2"], ["g2"], name="/cls/cls.3/Gemm"))
    for k, (start, end) in enumerate(SLICES):
        if opset >= 10:
            inits.update({f"s{k}": np.array([start], np.int64), f"e{k}": np.array([end], np.int64),
                          f"a{k}": np.array([1], np.int64)})
            nodes.append(n("Slice", ["g2", f"s{k}", f"e{k}", f"a{k}"], [f"out{k}"], name=f"/Slice_{k}"))
        else:
            nodes.append(n("Slice", ["g2"], [f"out{k}"], name=f"/Slice_{k}", starts=[start],
                           ends=[end], axes=[1]))
    return tiny.model(nodes, {"x": [1, 4, 5, 6]}, [f"out{k}" for k in range(4)], inits, opset=opset)


@pytest.mark.parametrize("opset", [9, 13])
def test_ufld_head_becomes_4d_only_with_matching_outputs(tiny, opset):
    model = ufld_head(tiny, opset)
    step1, _ = tiny.check("rewrite_gemm_as_conv", model, nodes=["/cls/cls.1/Gemm"])
    conv = next(x for x in step1.graph.node if x.name == "/cls/cls.1/Gemm_Conv")
    kernel = next(a for a in conv.attribute if a.name == "kernel_shape")
    assert list(kernel.ints) == [5, 6]  # the whole (H, W) map
    step2, comparison = tiny.check("split_gemm_slices", step1)
    assert tiny.ops(step2) == {"Conv": 6}
    assert tiny.non_4d(step2) == {}
    assert [o.name for o in step2.graph.output] == ["out0", "out1", "out2", "out3"]
    for k, (start, end) in enumerate(SLICES):
        assert comparison.matched[f"out{k}"]["max_rel"] <= 1e-5
        assert "compared in order" in comparison.matched[f"out{k}"]["how"]


def test_ufld_head_with_relu_between_the_gemms_ends_4d_after_reshape_to_4d(tiny):
    model = ufld_head(tiny, relu=True)
    step1, _ = tiny.check("rewrite_gemm_as_conv", model, nodes=["/cls/cls.1/Gemm"])
    step2, _ = tiny.check("split_gemm_slices", step1)
    assert tiny.non_4d(step2)  # the Relu still runs on (1, 64) between two Reshapes
    step3, _ = tiny.check("reshape_to_4d", step2)
    assert tiny.non_4d(step3) == {}
    assert tiny.ops(step3) == {"Conv": 6, "Relu": 1}


def test_gemm_on_a_1x1_map_becomes_a_1x1_conv(tiny):
    model = tiny.model([n("GlobalAveragePool", ["x"], ["p"]), n("Flatten", ["p"], ["f"], axis=1),
                        n("Gemm", ["f", "w", "b"], ["y"], name="fc", alpha=0.5, beta=2.0)],
                       {"x": [2, 16, 4, 4]}, ["y"], {"w": tiny.rand(16, 10), "b": tiny.rand(1, 10)})
    conv, comparison = tiny.check("rewrite_gemm_as_conv", model)
    assert tiny.ops(conv) == {"GlobalAveragePool": 1, "Conv": 1}
    kernel = next(a for a in conv.graph.node[1].attribute if a.name == "kernel_shape")
    assert list(kernel.ints) == [1, 1]
    assert [d.dim_value for d in conv.graph.output[0].type.tensor_type.shape.dim] == [2, 10, 1, 1]


def test_gemm_graph_output_can_keep_its_2d_shape(tiny):
    model = tiny.model([n("Flatten", ["x"], ["f"]), n("Gemm", ["f", "w"], ["y"], name="fc")],
                       {"x": [1, 3, 2, 2]}, ["y"], {"w": tiny.rand(12, 5)})
    conv, comparison = tiny.check("rewrite_gemm_as_conv", model, graph_outputs="original")
    assert tiny.ops(conv) == {"Conv": 1, "Reshape": 1}
    assert comparison.matched["y"]["how"] == "same name"


def test_gemm_on_a_plain_2d_input_reads_it_as_a_1x1_map(tiny):
    model = tiny.model([n("Gemm", ["x", "w", "b"], ["y"], name="fc", transB=1)],
                       {"x": [3, 7]}, ["y"], {"w": tiny.rand(4, 7), "b": tiny.rand(4)})
    conv, _ = tiny.check("rewrite_gemm_as_conv", model)
    assert tiny.ops(conv) == {"Reshape": 1, "Conv": 1}


def test_gemm_with_transposed_input_has_no_conv_form(tiny):
    model = tiny.model([n("Gemm", ["x", "w"], ["y"], name="fc", transA=1)], {"x": [7, 1]}, ["y"],
                       {"w": tiny.rand(7, 4)})
    with pytest.raises(SurgeryError, match="Gemm 'fc' transposes its input"):
        tiny.apply("rewrite_gemm_as_conv", model)


def test_gemm_rewrite_on_a_conv_names_the_op(tiny):
    with pytest.raises(SurgeryError, match="node '/pool/Conv' is a Conv, not a Gemm"):
        tiny.apply("rewrite_gemm_as_conv", ufld_head(tiny), nodes=["/pool/Conv"])


def test_gemm_with_non_constant_weights_is_refused(tiny):
    model = tiny.model([n("Gemm", ["x", "w"], ["y"], name="fc")], {"x": [1, 3], "w": [3, 2]}, ["y"])
    with pytest.raises(SurgeryError, match="Gemm 'fc': its weights 'w' are not constant"):
        tiny.apply("rewrite_gemm_as_conv", model)


def test_split_gemm_by_a_split_node(tiny):
    model = tiny.model([n("Flatten", ["x"], ["f"]), n("Gemm", ["f", "w", "b"], ["g"], name="fc"),
                        n("Split", ["g", "sizes"], ["a", "b2"], name="split", axis=1)],
                       {"x": [1, 2, 3, 3]}, ["a", "b2"],
                       {"w": tiny.rand(18, 9), "b": tiny.rand(9), "sizes": np.array([4, 5], np.int64)})
    split, _ = tiny.check("split_gemm_slices", model)
    assert tiny.ops(split) == {"Conv": 2}
    assert tiny.non_4d(split) == {}


def test_split_gemm_whose_output_feeds_other_ops_is_refused(tiny):
    model = tiny.model([n("Gemm", ["x", "w"], ["g"], name="fc"), n("Relu", ["g"], ["y"], name="relu")],
                       {"x": [1, 3]}, ["y"], {"w": tiny.rand(3, 4)})
    with pytest.raises(SurgeryError, match="also read by Relu 'relu'"):
        tiny.apply("split_gemm_slices", model, nodes=["fc"])
    with pytest.raises(SurgeryError, match="no Gemm has an output read only by Slice or Split"):
        tiny.apply("split_gemm_slices", model)


def test_split_gemm_slice_on_the_batch_axis_is_refused(tiny):
    model = tiny.model([n("Gemm", ["x", "w"], ["g"], name="fc"),
                        n("Slice", ["g", "s", "e", "a"], ["y"], name="cut")],
                       {"x": [4, 3]}, ["y"], {"w": tiny.rand(3, 4), "s": np.array([1], np.int64),
                                              "e": np.array([3], np.int64), "a": np.array([0], np.int64)})
    with pytest.raises(SurgeryError, match="Slice 'cut' cuts the batch axis"):
        tiny.apply("split_gemm_slices", model)
