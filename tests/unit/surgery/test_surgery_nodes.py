"""remove_nodes, replace_op, set_attribute, insert_op: equivalence on tiny models, and the
error text for arguments that do not fit."""

import numpy as np
import onnx
import pytest
from onnx import helper

from npubuild.onnx_io import run
from npubuild.surgery import SurgeryError

n = helper.make_node


def chain(tiny, opset=17):
    """x -> Relu -> Dropout -> Reshape(2,6) -> Softmax -> y."""
    return tiny.model([n("Relu", ["x"], ["r"], name="relu"),
                       n("Dropout", ["r"], ["d"], name="drop"),
                       n("Reshape", ["d", "shape"], ["f"], name="flat"),
                       n("Softmax", ["f"], ["y"], name="softmax", axis=-1)],
                      {"x": [2, 3, 2]}, ["y"], {"shape": np.array([2, 6], np.int64)}, opset=opset)


def test_remove_nodes_by_name_rewires_consumers_to_the_producer(tiny):
    removed, _ = tiny.check("remove_nodes", chain(tiny), nodes=["drop"])
    assert [x.name for x in removed.graph.node] == ["relu", "flat", "softmax"]


def test_remove_nodes_by_op_type(tiny):
    removed, _ = tiny.check("remove_nodes", chain(tiny), op_types=["Dropout"])
    assert "Dropout" not in tiny.ops(removed)


def test_remove_nodes_of_a_graph_output_keeps_the_output_name(tiny):
    removed = tiny.apply("remove_nodes", chain(tiny), nodes=["softmax"], expect_change=True)
    assert [o.name for o in removed.graph.output] == ["y"]
    assert removed.graph.node[-1].op_type == "Reshape" and removed.graph.node[-1].output[0] == "y"
    x = np.ones((2, 3, 2), np.float32)
    np.testing.assert_array_equal(run(removed, {"x": x})["y"], np.ones((2, 6), np.float32))


def test_remove_nodes_with_two_data_inputs_is_ambiguous(tiny):
    model = tiny.model([n("Add", ["x", "x2"], ["a"], name="add"), n("Neg", ["a"], ["y"])],
                       {"x": [2], "x2": [2]}, ["y"])
    with pytest.raises(SurgeryError, match="cannot remove node 'add': it has 2 non-constant inputs"):
        tiny.apply("remove_nodes", model, nodes=["add"])
    kept, comparison = tiny.check("remove_nodes", model, nodes=["add"], keep_input=0,
                                  expect_change=True)
    assert tiny.ops(kept) == {"Neg": 1} and comparison.failures


def test_remove_nodes_with_two_used_outputs_is_ambiguous(tiny):
    model = tiny.model([n("Split", ["x"], ["a", "b"], name="split", axis=0, num_outputs=2),
                        n("Add", ["a", "b"], ["y"])], {"x": [4]}, ["y"], opset=18)
    with pytest.raises(SurgeryError, match="2 of its outputs are used"):
        tiny.apply("remove_nodes", model, nodes=["split"])


def test_unknown_node_name_suggests_the_closest(tiny):
    with pytest.raises(SurgeryError, match="node not found: 'dropp'; did you mean 'drop'"):
        tiny.apply("remove_nodes", chain(tiny), nodes=["dropp"])


def test_glob_that_matches_nothing_is_an_error(tiny):
    with pytest.raises(SurgeryError, match=r"no node matches '/model\.22/\*'"):
        tiny.apply("remove_nodes", chain(tiny), nodes=["/model.22/*"])


def test_replace_op_sum_with_add(tiny):
    model = tiny.model([n("Sum", ["x", "x2"], ["y"], name="sum")], {"x": [3], "x2": [3]}, ["y"])
    replaced, comparison = tiny.check("replace_op", model, op_types=["Sum"], op_type="Add")
    assert tiny.ops(replaced) == {"Add": 1} and replaced.graph.node[0].name == "sum"
    assert comparison.matched["y"]["identical"]


def test_replace_op_drops_inputs_the_new_op_does_not_take(tiny):
    model = tiny.model([n("Clip", ["x", "lo", ""], ["y"], name="clip")], {"x": [5]}, ["y"],
                       {"lo": np.array(0, np.float32)})
    replaced, _ = tiny.check("replace_op", model, nodes=["clip"], op_type="Relu", inputs=[0])
    assert tiny.ops(replaced) == {"Relu": 1}


def test_replace_op_with_an_unknown_op_names_it(tiny):
    with pytest.raises(SurgeryError, match="'Relu6' is not an ONNX op at opset 17; did you mean 'Relu'"):
        tiny.apply("replace_op", chain(tiny), nodes=["relu"], op_type="Relu6")


def test_replace_op_with_too_few_inputs_is_refused(tiny):
    with pytest.raises(SurgeryError, match="Add takes 2..2 inputs; node 'relu' would get 1"):
        tiny.apply("replace_op", chain(tiny), nodes=["relu"], op_type="Add")


def test_replace_op_hard_sigmoid_is_an_expected_change(tiny):
    model = tiny.model([n("Sigmoid", ["x"], ["y"], name="sig")], {"x": [16]}, ["y"])
    replaced = tiny.apply("replace_op", model, nodes=["sig"], op_type="HardSigmoid",
                          attributes={"alpha": 0.2, "beta": 0.5}, expect_change=True)
    attrs = {a.name: helper.get_attribute_value(a) for a in replaced.graph.node[0].attribute}
    assert attrs == pytest.approx({"alpha": 0.2, "beta": 0.5})


def test_set_attribute_converts_to_the_schema_type(tiny):
    model = tiny.model([n("LeakyRelu", ["x"], ["y"], name="lrelu", alpha=0.1)], {"x": [8]}, ["y"])
    changed = tiny.apply("set_attribute", model, nodes=["lrelu"], attributes={"alpha": 1},
                         expect_change=True)
    (attr,) = changed.graph.node[0].attribute
    assert attr.type == onnx.AttributeProto.FLOAT and attr.f == 1.0
    x = np.linspace(-2, 2, 8).astype(np.float32)
    np.testing.assert_array_equal(run(changed, {"x": x})["y"], x)


def test_set_attribute_that_became_an_input_says_so(tiny):
    model = tiny.model([n("Squeeze", ["x", "axes"], ["y"], name="squeeze")], {"x": [1, 3]}, ["y"],
                       {"axes": np.array([0], np.int64)}, opset=13)
    with pytest.raises(SurgeryError, match=r"Squeeze \(opset 13\) has no attribute 'axes'") as err:
        tiny.apply("set_attribute", model, nodes=["squeeze"], attributes={"axes": [0]})
    assert "became inputs" in err.value.hint


def test_set_attribute_removes_an_attribute(tiny):
    model = tiny.model([n("Softmax", ["x"], ["y"], name="sm", axis=-1)], {"x": [2, 3]}, ["y"])
    changed, _ = tiny.check("set_attribute", model, nodes=["sm"], remove=["axis"])
    assert not changed.graph.node[0].attribute


def test_insert_op_between_a_tensor_and_its_consumers(tiny):
    model = tiny.model([n("Neg", ["x"], ["a"], name="neg"), n("Exp", ["a"], ["y"], name="exp")],
                       {"x": [4]}, ["y"])
    inserted = tiny.apply("insert_op", model, tensor="a", op_type="Clip", name="clip6",
                          inputs=[{"value": 0.0}, {"value": 6.0}], expect_change=True)
    assert [x.op_type for x in inserted.graph.node] == ["Neg", "Clip", "Exp"]
    x = np.array([-8, -1, 1, 8], np.float32)
    np.testing.assert_allclose(run(inserted, {"x": x})["y"], np.exp(np.clip(-x, 0, 6)), rtol=1e-6)


def test_insert_op_on_a_graph_output_keeps_its_name(tiny):
    model = tiny.model([n("Neg", ["x"], ["y"], name="neg")], {"x": [4]}, ["y"])
    inserted, comparison = tiny.check("insert_op", model, tensor="y", op_type="Identity")
    assert inserted.graph.node[-1].op_type == "Identity" and inserted.graph.node[-1].output[0] == "y"
    assert comparison.matched["y"]["identical"]


def test_insert_op_reshape_pair_with_int64_constant_is_exact(tiny):
    model = tiny.model([n("Relu", ["x"], ["a"], name="relu"), n("Neg", ["a"], ["y"], name="neg")],
                       {"x": [2, 6]}, ["y"])
    step = tiny.apply("insert_op", model, tensor="a", op_type="Reshape", name="to4d",
                      inputs=[{"value": [2, 6, 1, 1], "dtype": "int64"}])
    back, comparison = tiny.check("insert_op", step, tensor="a_Reshape", op_type="Reshape",
                                  consumers=["neg"], inputs=[{"value": [2, 6], "dtype": "int64"}])
    assert tiny.ops(back) == {"Relu": 1, "Reshape": 2, "Neg": 1}
    assert comparison.matched["y"]["identical"]


def test_insert_op_on_an_unknown_tensor_suggests(tiny):
    with pytest.raises(SurgeryError, match="tensor 'rr' not found; did you mean 'r'"):
        tiny.apply("insert_op", chain(tiny), tensor="rr", op_type="Relu")


def test_node_selection_requires_nodes_or_op_types(tiny):
    with pytest.raises(ValueError, match="give nodes or op_types"):
        tiny.registry["remove_nodes"].args()
