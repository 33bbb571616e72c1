"""extract, update_io_shape, rename_tensors: the graph's interface changes, and the proof still
compares what can be compared (a cut output against the tensor it was, a renamed output against
its old self)."""

import numpy as np
import pytest
from onnx import helper

from npubuild.surgery import SurgeryError, origins

n = helper.make_node


def three_stage(tiny):
    """x -> Conv -> Relu (r) -> Conv -> Sigmoid (y), plus a side branch z = Neg(x)."""
    inits = {"w1": tiny.rand(4, 3, 1, 1), "w2": tiny.rand(2, 4, 1, 1)}
    return tiny.model([n("Conv", ["x", "w1"], ["c1"], name="conv1"), n("Relu", ["c1"], ["r"], name="relu"),
                       n("Conv", ["r", "w2"], ["c2"], name="conv2"), n("Sigmoid", ["c2"], ["y"], name="sig"),
                       n("Neg", ["x"], ["z"], name="neg")],
                      {"x": [1, 3, 4, 4]}, ["y", "z"], inits)


def test_extract_outputs_at_an_inner_tensor_compares_it_with_that_tensor(tiny):
    cut, comparison = tiny.check("extract", three_stage(tiny), outputs=["r"])
    assert [x.name for x in cut.graph.node] == ["conv1", "relu"]
    assert comparison.matched["r"]["how"] == "tensor of the step's input"
    assert comparison.matched["r"]["identical"]


def test_extract_inputs_at_an_inner_tensor_feeds_what_the_input_model_computed(tiny):
    cut, comparison = tiny.check("extract", three_stage(tiny), inputs=["r"], outputs=["y"])
    assert [x.name for x in cut.graph.node] == ["conv2", "sig"]
    assert [i.name for i in cut.graph.input] == ["r"]
    assert comparison.matched["y"]["identical"]


def test_extract_keeps_original_inputs_the_outputs_still_need(tiny):
    cut, comparison = tiny.check("extract", three_stage(tiny), inputs=["r"])
    assert [i.name for i in cut.graph.input] == ["r", "x"]
    assert set(comparison.matched) == {"y", "z"}


def test_extract_unknown_tensor_suggests_names(tiny):
    with pytest.raises(SurgeryError, match="tensor 'relu_out' not found"):
        tiny.apply("extract", three_stage(tiny), outputs=["relu_out"])


def test_extract_a_constant_is_refused(tiny):
    with pytest.raises(SurgeryError, match="'w1' is a constant"):
        tiny.apply("extract", three_stage(tiny), outputs=["w1"])


def test_update_io_shape_of_an_input_propagates_to_outputs(tiny):
    changed = tiny.apply("update_io_shape", three_stage(tiny), shapes={"x": [2, 3, 8, 8]})
    shapes = {o.name: [d.dim_value for d in o.type.tensor_type.shape.dim] for o in changed.graph.output}
    assert shapes == {"y": [2, 2, 8, 8], "z": [2, 3, 8, 8]}


def test_update_io_shape_of_an_output_must_be_what_the_graph_computes(tiny):
    with pytest.raises(SurgeryError, match=r"output 'y': the graph computes shape \[1, 2, 4, 4\], "
                                           r"not \[1, 32\]"):
        tiny.apply("update_io_shape", three_stage(tiny), shapes={"y": [1, 32]})


def test_update_io_shape_that_does_not_fit_the_graph_is_refused(tiny):
    model = tiny.model([n("Reshape", ["x", "s"], ["y"], name="r")], {"x": [2, 6]}, ["y"],
                       {"s": np.array([3, 4], np.int64)})
    with pytest.raises(SurgeryError, match="the new shapes do not fit the graph"):
        tiny.apply("update_io_shape", model, shapes={"x": [2, 7]})


def test_update_io_shape_of_a_non_io_tensor_is_refused(tiny):
    with pytest.raises(SurgeryError, match="'r' is not a graph input or output"):
        tiny.apply("update_io_shape", three_stage(tiny), shapes={"r": [1]})


def test_rename_tensors_maps_renamed_outputs_and_inputs(tiny):
    renamed, comparison = tiny.check("rename_tensors", three_stage(tiny),
                                     names={"y": "scores", "x": "image", "r": "features"})
    assert [o.name for o in renamed.graph.output] == ["scores", "z"]
    assert [i.name for i in renamed.graph.input] == ["image"]
    assert comparison.matched["y"] == {**comparison.matched["y"], "how": "renamed", "identical": True}


def test_rename_tensors_can_swap_two_names(tiny):
    swapped, comparison = tiny.check("rename_tensors", three_stage(tiny), names={"y": "z", "z": "y"})
    assert [o.name for o in swapped.graph.output] == ["z", "y"]
    assert comparison.matched["y"]["from"] == "z" and comparison.matched["y"]["identical"]


def test_rename_to_a_name_in_use_is_refused(tiny):
    with pytest.raises(SurgeryError, match="cannot rename 'r' to 'c1': that name is already used"):
        tiny.apply("rename_tensors", three_stage(tiny), names={"r": "c1"})


def test_origins_compose_across_steps_and_rebuild_the_first_models_output():
    split = {"outputs": {"out": origins.parts(["a", "b"], 1, [1, 6])}, "inputs": {}}
    rename = {"outputs": {"a": "first"}, "inputs": {"img": "x"}}
    composed = origins.compose(split, rename)
    assert composed == {"outputs": {"out": origins.parts(["first", "b"], 1, [1, 6])},
                        "inputs": {"img": "x"}}
    values = {"first": np.arange(2).reshape(1, 2, 1), "b": np.arange(2, 6).reshape(1, 4, 1)}
    np.testing.assert_array_equal(origins.rebuild(composed["outputs"]["out"], values),
                                  np.arange(6).reshape(1, 6))


def test_update_io_shape_that_resizes_the_input_says_why_nothing_is_compared(tiny):
    from npubuild.surgery import proof

    model = three_stage(tiny)
    changed = tiny.apply("update_io_shape", model, shapes={"x": [1, 3, 8, 8]})
    comparison = proof.compare(model, changed, origins.pop(changed), exact=True, rtol=0)
    assert comparison.not_comparable == {
        "y": "input 'x' changed size (shape [1, 3, 8, 8], was [1, 3, 4, 4])",
        "z": "input 'x' changed size (shape [1, 3, 8, 8], was [1, 3, 4, 4])"}
