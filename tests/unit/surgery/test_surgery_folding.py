"""fold_constants: shape arithmetic and constant subgraphs become initializers; no-ops and dead
nodes go; real models (YOLOv8n, ONNX's light models) keep their outputs."""

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from npubuild import onnx_io

SHAPE_OPS = {"Shape", "Gather", "Range", "Expand", "ConstantOfShape"}


def shape_arithmetic(tiny):
    """x (1,3,4,4) reshaped to (N, C, H*W) with the target computed from Shape at run time,
    plus an anchor grid built with Range/Expand/ConstantOfShape, added to the result."""
    n = helper.make_node
    nodes = [
        n("Shape", ["x"], ["s"], name="shape"),
        n("Gather", ["s", "i01"], ["nc"], name="gather_nc", axis=0),
        n("Gather", ["s", "i2"], ["h"], name="gather_h", axis=0),
        n("Gather", ["s", "i3"], ["w"], name="gather_w", axis=0),
        n("Mul", ["h", "w"], ["hw"], name="hw"),
        n("Unsqueeze", ["hw", "ax0"], ["hw1"], name="unsq"),
        n("Concat", ["nc", "hw1"], ["target"], name="target", axis=0),
        n("Reshape", ["x", "target"], ["flat"], name="reshape"),
        n("Cast", ["hw"], ["hwf"], name="cast", to=onnx.TensorProto.FLOAT),
        n("Range", ["zero", "hwf", "one"], ["grid"], name="range"),
        n("Expand", ["grid", "target"], ["grid3"], name="expand"),
        n("ConstantOfShape", ["target"], ["ones"], name="cos",
          value=numpy_helper.from_array(np.array([0.5], np.float32))),
        n("Add", ["flat", "grid3"], ["a"], name="add"),
        n("Mul", ["a", "ones"], ["y"], name="mul"),
        n("Identity", ["y"], ["z"], name="identity"),
    ]
    inits = {"i01": np.array([0, 1], np.int64), "i2": np.array(2, np.int64),
             "i3": np.array(3, np.int64), "ax0": np.array([0], np.int64),
             "zero": np.array(0, np.float32), "one": np.array(1, np.float32)}
    return tiny.model(nodes, {"x": [1, 3, 4, 4]}, ["z"], inits)


def test_fold_constants_turns_shape_arithmetic_into_initializers(tiny):
    model = shape_arithmetic(tiny)
    folded, comparison = tiny.check("fold_constants", model)
    assert tiny.ops(folded) == {"Reshape": 1, "Add": 1, "Mul": 1}
    assert comparison.matched["z"]["max_rel"] <= 1e-6


def test_fold_constants_removes_identity_and_dead_nodes(tiny):
    n = helper.make_node
    model = tiny.model([n("Relu", ["x"], ["r"]), n("Identity", ["r"], ["i"]),
                        n("Dropout", ["i"], ["d"]), n("Sigmoid", ["x"], ["unused"]),
                        n("Neg", ["d"], ["y"])], {"x": [2, 3]}, ["y"])
    folded, _ = tiny.check("fold_constants", model)
    assert tiny.ops(folded) == {"Relu": 1, "Neg": 1}


def test_a_transpose_of_size_one_axes_and_the_reshape_back_go(tiny):
    """tf2onnx's leftover before a squeeze-and-excite conv: [1, 8, 1, 1] -> [1, 1, 1, 8] ->
    [1, 8, 1, 1] moves no data; a Transpose that does move data stays."""
    n = helper.make_node
    model = tiny.model([n("Relu", ["x"], ["r"]),
                        n("Transpose", ["r"], ["t"], perm=[0, 2, 3, 1]),
                        n("Reshape", ["t", "back"], ["b"]), n("Neg", ["b"], ["y"]),
                        n("Transpose", ["z"], ["moved"], perm=[0, 2, 3, 1])],
                       {"x": [1, 8, 1, 1], "z": [1, 2, 3, 3]}, ["y", "moved"],
                       {"back": np.array([1, 8, 1, 1], np.int64)})
    folded, comparison = tiny.check("fold_constants", model)
    assert tiny.ops(folded) == {"Relu": 1, "Neg": 1, "Transpose": 1}
    assert comparison.matched["y"]["max_rel"] == 0


def test_a_concat_drops_its_inputs_of_no_elements(tiny):
    """OpenSpindleNet's head concatenates its segmentation with an empty [1, 0, 1] product
    of an unused branch: the chip has no place for a tensor of no elements, so the Concat
    ran on the CPU alone between NPU parts. The empty input goes; a Concat left with one
    input goes too; one of two inputs with elements stays."""
    n = helper.make_node
    model = tiny.model([n("Relu", ["x"], ["r"]),
                        n("Mul", ["nothing", "two"], ["empty"]),
                        n("Concat", ["r", "empty"], ["c"], axis=1),
                        n("Concat", ["empty", "r", "x"], ["d"], axis=1),
                        n("Neg", ["c"], ["y"]), n("Neg", ["d"], ["z"])],
                       {"x": [1, 5, 1]}, ["y", "z"],
                       {"nothing": np.zeros([1, 0, 1], np.float32),
                        "two": np.array(2, np.float32)})
    folded, comparison = tiny.check("fold_constants", model)
    assert tiny.ops(folded) == {"Relu": 1, "Concat": 1, "Neg": 2}
    concat = next(node for node in folded.graph.node if node.op_type == "Concat")
    assert len(concat.input) == 2
    assert comparison.matched["y"]["max_rel"] == 0 and comparison.matched["z"]["max_rel"] == 0


def test_fold_constants_keeps_noops_when_asked(tiny):
    model = tiny.model([helper.make_node("Identity", ["x"], ["i"]), helper.make_node("Neg", ["i"], ["y"])],
                       {"x": [2]}, ["y"])
    folded, _ = tiny.check("fold_constants", model, remove_noops=False)
    assert tiny.ops(folded) == {"Identity": 1, "Neg": 1}


def test_fold_constants_leaves_random_ops_alone(tiny):
    n = helper.make_node
    model = tiny.model([n("RandomUniform", [], ["noise"], shape=[2], seed=1.0),
                        n("Mul", ["noise", "zero"], ["z"]), n("Add", ["x", "z"], ["y"])],
                       {"x": [2]}, ["y"], {"zero": np.zeros(2, np.float32)})
    folded = tiny.apply("fold_constants", model)
    assert "RandomUniform" in tiny.ops(folded)


def test_fold_constants_size_limit_keeps_large_tensors_computed(tiny):
    n = helper.make_node
    model = tiny.model([n("ConstantOfShape", ["shape"], ["big"],
                          value=numpy_helper.from_array(np.array([2.0], np.float32))),
                        n("Mul", ["x", "big"], ["y"])], {"x": [512, 1024]}, ["y"],
                       {"shape": np.array([512, 1024], np.int64)})
    kept, _ = tiny.check("fold_constants", model, size_limit_mb=1)
    assert "ConstantOfShape" in tiny.ops(kept)
    folded, _ = tiny.check("fold_constants", model)
    assert "ConstantOfShape" not in tiny.ops(folded)


def test_a_transposed_weight_folds_whatever_its_size_when_it_replaces_its_source(tiny):
    """VGG-19's Gemm weights, transposed by a node: the folded value replaces the weight only
    the Transpose read, so the model does not grow and the size limit does not keep it
    computed (import warned that the CPU computed 392 MiB on every inference). Read by
    another node too, the source stays and the transpose is growth."""
    n = helper.make_node
    weight = {"w": np.arange(512 * 1024, dtype=np.float32).reshape(512, 1024)}  # 2 MiB
    alone = tiny.model([n("Transpose", ["w"], ["wt"], perm=[1, 0]),
                        n("MatMul", ["x", "wt"], ["y"])], {"x": [2, 1024]}, ["y"], weight)
    folded, _ = tiny.check("fold_constants", alone, size_limit_mb=1)
    assert tiny.ops(folded) == {"MatMul": 1}
    shared = tiny.model([n("Transpose", ["w"], ["wt"], perm=[1, 0]),
                         n("MatMul", ["x", "wt"], ["y"]), n("MatMul", ["y", "w"], ["z"])],
                        {"x": [2, 1024]}, ["z"], weight)
    kept, _ = tiny.check("fold_constants", shared, size_limit_mb=1)
    assert "Transpose" in tiny.ops(kept)


def test_a_large_value_kept_computed_still_reads_the_values_folded_before_it(tiny):
    """A kept node whose inputs are computed by folded nodes (Cos and Sin before the Concat of
    a basis): the size limit used to drop them without storing what the kept node reads, and
    the model referred to tensors nothing produced."""
    n = helper.make_node
    model = tiny.model([n("Cos", ["angle"], ["cos"]), n("Sin", ["angle"], ["sin"]),
                        n("Concat", ["cos", "sin", "cos", "sin"], ["basis"], axis=0),
                        n("MatMul", ["x", "basis"], ["y"])], {"x": [4, 2048]}, ["y"],
                       {"angle": np.linspace(0, 3, 512 * 512).astype(np.float32).reshape(512, 512)})
    # cos 1 MiB (angle stays: Sin reads it too); the basis, 4 MiB, replaces cos and sin: +2 MiB
    kept, _ = tiny.check("fold_constants", model, size_limit_mb=1.5)
    assert tiny.ops(kept) == {"Concat": 1, "MatMul": 1}
    assert {t.name for t in kept.graph.initializer} >= {"cos", "sin"}


def test_fold_constants_on_an_ir3_model_lists_new_initializers_as_inputs(tiny):
    n = helper.make_node
    model = tiny.model([n("ConstantOfShape", ["shape"], ["w"],
                          value=numpy_helper.from_array(np.array([0.5], np.float32))),
                        n("Mul", ["x", "w"], ["y"])], {"x": [2, 3]}, ["y"],
                       {"shape": np.array([2, 3], np.int64)}, opset=9, ir_version=3)
    model.graph.input.append(helper.make_tensor_value_info("shape", onnx.TensorProto.INT64, [2]))
    folded, _ = tiny.check("fold_constants", model)
    assert folded.ir_version == 3
    assert {t.name for t in folded.graph.initializer} <= {i.name for i in folded.graph.input}


def test_fold_constants_folds_int64_scalars_and_constant_nodes(tiny):
    n = helper.make_node
    model = tiny.model([n("Constant", [], ["c"], value=numpy_helper.from_array(np.array(3, np.int64))),
                        n("Add", ["c", "c"], ["six"]), n("Add", ["x", "six"], ["y"])],
                       {"x": [4]}, ["y"], elem=onnx.TensorProto.INT64)
    folded, comparison = tiny.check("fold_constants", model)
    assert tiny.ops(folded) == {"Add": 1}
    assert int(numpy_helper.to_array(folded.graph.initializer[0])) == 6
    assert comparison.matched["y"]["identical"]


@pytest.mark.slow
def test_yolov8n_fold_constants_leaves_no_shape_ops_and_matches(tiny, yolov8n):
    folded, comparison = tiny.check("fold_constants", yolov8n)
    assert not SHAPE_OPS & set(tiny.ops(folded)), tiny.ops(folded)
    assert len(folded.graph.node) < len(yolov8n.graph.node) - 80
    assert comparison.matched["output0"]["max_rel"] <= 1e-5


LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"


def light_case(name: str):
    """A light model, the input onnx's backend test feeds it (arange / size, see
    onnx.backend.test.runner.Runner.generate_dummy_data) and the stored reference output."""
    model = onnx.load(str(LIGHT / f"light_{name}.onnx"))
    reference = numpy_helper.to_array(onnx.load_tensor(str(LIGHT / f"light_{name}_output_0.pb")))
    (value,) = onnx_io.graph_inputs(model)
    shape = [d.dim_value for d in value.type.tensor_type.shape.dim]
    size = int(np.prod(shape))
    feeds = {value.name: (np.arange(size).reshape(shape) / size).astype(np.float32)}
    return model, feeds, reference


@pytest.mark.slow
@pytest.mark.parametrize("name", ["resnet50", "squeezenet", "shufflenet", "inception_v1"])
def test_light_model_after_fold_constants_reproduces_reference_output(tiny, name):
    model, feeds, reference = light_case(name)
    folded = tiny.apply("fold_constants", model)
    assert "ConstantOfShape" not in tiny.ops(folded)
    (output,) = onnx_io.run(folded, feeds).values()
    np.testing.assert_allclose(output, reference, rtol=1e-3, atol=1e-7)  # onnx's own tolerance


def test_fold_constants_keeps_what_a_subgraph_reads(tiny):
    then = helper.make_graph([helper.make_node("Identity", ["outer"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Neg", ["outer"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, [2])])
    model = tiny.model([helper.make_node("Relu", ["x"], ["outer"], name="relu"),
                        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                        helper.make_node("Greater", ["s", "zero"], ["cond"]),
                        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
                       {"x": [2]}, ["y"], {"zero": np.array(0, np.float32)})
    folded, _ = tiny.check("fold_constants", model)
    assert "Relu" in tiny.ops(folded) and "If" in tiny.ops(folded)


def test_fold_constants_keeps_a_folded_value_a_subgraph_reads(tiny):
    then = helper.make_graph([helper.make_node("Add", ["x", "c2"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Sub", ["x", "c2"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, [2])])
    model = tiny.model([helper.make_node("Add", ["c", "c"], ["c2"], name="double"),
                        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                        helper.make_node("Greater", ["s", "zero"], ["cond"]),
                        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
                       {"x": [2]}, ["y"], {"zero": np.array(0, np.float32), "c": np.ones(2, np.float32)})
    folded, _ = tiny.check("fold_constants", model)
    assert "c2" in {t.name for t in folded.graph.initializer}


def test_fold_constants_removes_a_noop_a_subgraph_reads_and_the_subgraph_reads_its_input(tiny):
    # chars2vec's second LSTM Loop, kept whole, read the outer Transpose of a Transpose that
    # folding removed: its body still named the removed output ("Nodes in a graph must be
    # topologically sorted ... is not output of any previous nodes")
    then = helper.make_graph([helper.make_node("Neg", ["outer"], ["t"])], "then", [],
                             [helper.make_tensor_value_info("t", onnx.TensorProto.FLOAT, [2])])
    other = helper.make_graph([helper.make_node("Abs", ["outer"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, [2])])
    model = tiny.model([helper.make_node("Relu", ["x"], ["r"], name="relu"),
                        helper.make_node("Identity", ["r"], ["outer"], name="noop"),
                        helper.make_node("ReduceSum", ["x"], ["s"], keepdims=0),
                        helper.make_node("Greater", ["s", "zero"], ["cond"]),
                        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other)],
                       {"x": [2]}, ["y"], {"zero": np.array(0, np.float32)})
    folded, _ = tiny.check("fold_constants", model)
    assert "Identity" not in tiny.ops(folded)
    onnx.checker.check_model(folded, full_check=True)


def test_fold_constants_replaces_an_if_on_a_constant_by_the_branch_it_takes(tiny):
    # Silero VAD's decoder (an LSTM and convs) sits in an If whose condition is a constant:
    # kept as control flow the split can only run it on the CPU
    then = helper.make_graph([helper.make_node("Mul", ["x", "w"], ["t"]),
                              helper.make_node("Relu", ["t"], ["r"])], "then", [],
                             [helper.make_tensor_value_info("r", onnx.TensorProto.FLOAT, [2])],
                             [numpy_helper.from_array(np.array([2.0, -3.0], np.float32), "w")])
    other = helper.make_graph([helper.make_node("Neg", ["x"], ["e"])], "else", [],
                              [helper.make_tensor_value_info("e", onnx.TensorProto.FLOAT, [2])])
    model = tiny.model([helper.make_node("Not", ["off"], ["cond"]),
                        helper.make_node("If", ["cond"], ["y"], then_branch=then, else_branch=other),
                        helper.make_node("Relu", ["y"], ["t"])],  # a name the branch uses too
                       {"x": [2]}, ["t"], {"off": np.array(False)})
    folded, _ = tiny.check("fold_constants", model)
    assert "If" not in tiny.ops(folded) and {"Mul", "Relu"} <= set(tiny.ops(folded))
    onnx.checker.check_model(folded, full_check=True)
