"""reshape_to_4d: non-4-D chains carried as 4-D, concats pushed to the outputs (seed 002's
YOLOv8 head), bit-identical throughout; the errors for what has no 4-D form."""

import numpy as np
import pytest
from onnx import helper

from npubuild.surgery import SurgeryError

n = helper.make_node


def head_3d(tiny, opset=17):
    """x (1,8,2,3) -> Reshape (1,8,6) -> Transpose (1,6,8) -> Softmax -> Slice [..., :4] -> Mul."""
    inits = {"shape": np.array([1, 8, 6], np.int64), "s": np.array([0], np.int64),
             "e": np.array([4], np.int64), "a": np.array([2], np.int64), "k": tiny.rand(4)}
    if opset < 10:
        slice_node = n("Slice", ["sm"], ["cut"], name="slice", starts=[0], ends=[4], axes=[2])
    else:
        slice_node = n("Slice", ["sm", "s", "e", "a"], ["cut"], name="slice")
    nodes = [n("Reshape", ["x", "shape"], ["r"], name="reshape"),
             n("Transpose", ["r"], ["t"], name="transpose", perm=[0, 2, 1]),
             n("Softmax", ["t"], ["sm"], name="softmax", axis=2), slice_node,
             n("Mul", ["cut", "k"], ["y"], name="mul")]
    return tiny.model(nodes, {"x": [1, 8, 2, 3]}, ["y"], inits, opset=opset)


@pytest.mark.parametrize("opset", [9, 11, 17])
def test_3d_chain_is_carried_as_4d_bit_identically(tiny, opset):
    lifted, comparison = tiny.check("reshape_to_4d", head_3d(tiny, opset))
    assert tiny.non_4d(lifted) == {}
    assert comparison.matched["y"]["identical"]
    assert [d.dim_value for d in lifted.graph.output[0].type.tensor_type.shape.dim] == [1, 1, 6, 4]


def test_original_graph_outputs_keep_their_shape_through_one_reshape(tiny):
    lifted, comparison = tiny.check("reshape_to_4d", head_3d(tiny), graph_outputs="original")
    assert tiny.non_4d(lifted) == {"y": [1, 6, 4]}
    assert lifted.graph.node[-1].op_type == "Reshape" and lifted.graph.node[-1].output[0] == "y"
    assert comparison.matched["y"]["how"] == "same name"


def test_squeeze_unsqueeze_and_reduce_without_keepdims_become_4d(tiny):
    nodes = [n("ReduceMean", ["x"], ["m"], name="mean", axes=[2], keepdims=0),
             n("Unsqueeze", ["m", "ax"], ["u"], name="unsq"),
             n("Squeeze", ["u", "ax"], ["s"], name="sq"), n("Relu", ["s"], ["y"], name="relu")]
    model = tiny.model(nodes, {"x": [2, 3, 5]}, ["y"], {"ax": np.array([1], np.int64)}, opset=17)
    lifted, comparison = tiny.check("reshape_to_4d", model)
    assert tiny.non_4d(lifted) == {"x": [2, 3, 5]}  # the graph input itself stays as given
    assert comparison.matched["y"]["identical"]


def test_only_the_named_nodes_are_rewritten(tiny):
    model = tiny.model([n("Gemm", ["x", "w"], ["g"], name="fc"), n("Softmax", ["g"], ["y"], name="sm")],
                       {"x": [1, 3]}, ["y"], {"w": tiny.rand(3, 5)})
    with pytest.raises(SurgeryError, match="Gemm node 'fc' reads or writes a tensor of rank"):
        tiny.apply("reshape_to_4d", model)
    lifted, _ = tiny.check("reshape_to_4d", model, nodes=["sm"])
    assert tiny.ops(lifted) == {"Gemm": 1, "Reshape": 1, "Softmax": 1}


def test_rank_5_tensors_are_refused_with_the_node(tiny):
    model = tiny.model([n("Reshape", ["x", "shape"], ["y"], name="to5d")], {"x": [2, 3, 4, 5]}, ["y"],
                       {"shape": np.array([1, 2, 3, 4, 5], np.int64)})
    with pytest.raises(SurgeryError, match=r"Reshape node 'to5d': tensor 'y' has shape \[1, 2, 3, 4, 5\]"):
        tiny.apply("reshape_to_4d", model)


def two_scale_head(tiny, softmax_axis=1):
    """YOLOv8's head in miniature: two maps flattened, joined on the anchor axis, split into
    box and class channels, boxes offset by constant anchors, classes through a sigmoid."""
    inits = {"s4": np.array([1, 5, 16], np.int64), "s2": np.array([1, 5, 4], np.int64),
             "sizes": np.array([2, 3], np.int64), "anchors": tiny.rand(1, 2, 20),
             "stride": tiny.rand(1, 20)}
    nodes = [n("Reshape", ["p4", "s4"], ["f4"], name="/head/Reshape"),
             n("Reshape", ["p2", "s2"], ["f2"], name="/head/Reshape_1"),
             n("Concat", ["f4", "f2"], ["cat"], name="/head/Concat", axis=2),
             n("Split", ["cat", "sizes"], ["box", "cls"], name="/head/Split", axis=1),
             n("Softmax", ["box"], ["boxs"], name="/head/Softmax", axis=softmax_axis),
             n("Add", ["boxs", "anchors"], ["xy"], name="/head/Add"),
             n("Mul", ["xy", "stride"], ["xys"], name="/head/Mul"),
             n("Sigmoid", ["cls"], ["prob"], name="/head/Sigmoid"),
             n("Concat", ["xys", "prob"], ["out"], name="/head/Concat_out", axis=1)]
    return tiny.model(nodes, {"p4": [1, 5, 4, 4], "p2": [1, 5, 2, 2]}, ["out"], inits)


def test_split_concat_exposes_one_4d_output_per_scale(tiny):
    model = two_scale_head(tiny)
    split, comparison = tiny.check("reshape_to_4d", model, split_concats=["/head/Concat"])
    assert [o.name for o in split.graph.output] == ["out_0", "out_1"]
    shapes = [[d.dim_value for d in o.type.tensor_type.shape.dim] for o in split.graph.output]
    assert shapes == [[1, 1, 5, 16], [1, 1, 5, 4]]
    assert tiny.non_4d(split) == {}
    assert comparison.matched["out"]["how"] == "recombined"
    assert comparison.matched["out"]["identical"]
    assert comparison.matched["out"]["from"] == {"parts": ["out_0", "out_1"], "axis": 3,
                                                 "shape": [1, 5, 20]}


def test_split_concat_with_output_names_and_original_outputs(tiny):
    model = two_scale_head(tiny)
    named, _ = tiny.check("reshape_to_4d", model, split_concats=["/head/Concat"],
                          output_names={"out": ["p4_out", "p2_out"]})
    assert [o.name for o in named.graph.output] == ["p4_out", "p2_out"]
    kept, comparison = tiny.check("reshape_to_4d", model, split_concats=["/head/Concat"],
                                  graph_outputs="original")
    assert [o.name for o in kept.graph.output] == ["out"]
    assert comparison.matched["out"]["identical"]


def test_split_concat_refuses_a_softmax_over_the_joined_axis(tiny):
    model = two_scale_head(tiny, softmax_axis=2)
    with pytest.raises(SurgeryError, match="Softmax node '/head/Softmax' normalises over the "
                                           "distributed axis 2"):
        tiny.apply("reshape_to_4d", model, split_concats=["/head/Concat"])


def test_split_concats_must_name_a_concat(tiny):
    with pytest.raises(SurgeryError, match="node '/head/Split' is a Split, not a Concat"):
        tiny.apply("reshape_to_4d", two_scale_head(tiny), split_concats=["/head/Split"])


def test_wrong_number_of_output_names_is_refused(tiny):
    with pytest.raises(SurgeryError, match="output_names gives 1 names for 'out', which is split "
                                           "into 2 parts"):
        tiny.apply("reshape_to_4d", two_scale_head(tiny), split_concats=["/head/Concat"],
                   output_names={"out": ["only_one"]})


@pytest.mark.slow
def test_yolov8n_head_becomes_4d_per_scale_bit_identically(tiny, yolov8n):
    folded = tiny.apply("fold_constants", yolov8n)
    split, comparison = tiny.check("reshape_to_4d", folded, split_concats=["/model.22/Concat_6"])
    assert tiny.non_4d(split) == {}
    shapes = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in split.graph.output}
    assert shapes == {"output0_0": [1, 1, 22, 1600], "output0_1": [1, 1, 22, 400],
                      "output0_2": [1, 1, 22, 100]}
    assert comparison.matched["output0"]["identical"]


def test_output_names_for_an_output_that_is_not_split_is_refused(tiny):
    with pytest.raises(SurgeryError, match="output_names names 'y', which split_concats does not split"):
        tiny.apply("reshape_to_4d", two_scale_head(tiny), split_concats=["/head/Concat"],
                   output_names={"y": ["a", "b"]})
