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


def _select_model() -> onnx.ModelProto:
    """Attention's packed projections split as PyTorch exports ``select``: a Gather of a
    computed [3, 8, 1, 4] tensor by the scalar indices 0, 1 and 2 on axis 0, one by the
    1-element index [-1] on the last axis, beside an embedding (a Gather of a constant table)."""
    h = onnx.helper
    rng = np.random.default_rng(0)
    nodes = [h.make_node("Gather", ["table", "ids"], ["emb"], name="embedding"),
             h.make_node("Reshape", ["emb", "packed_shape"], ["packed"]),
             h.make_node("Relu", ["packed"], ["act"])]
    outputs = []
    for k in range(3):
        nodes.append(h.make_node("Gather", ["act", f"k{k}"], [f"part{k}"], axis=0, name=f"select_{k}"))
        outputs.append(f"part{k}")
    nodes.append(h.make_node("Gather", ["act", "last"], ["tail"], axis=-1, name="select_last"))
    outputs.append("tail")
    inits = [onnx.numpy_helper.from_array(rng.normal(size=(10, 12)).astype(np.float32), "table"),
             onnx.numpy_helper.from_array(np.array([3, 8, 1, 4], np.int64), "packed_shape"),
             onnx.numpy_helper.from_array(np.array([-1], np.int64), "last"),
             *[onnx.numpy_helper.from_array(np.array(k, np.int64), f"k{k}") for k in range(3)]]
    graph = h.make_graph(nodes, "g", [h.make_tensor_value_info("ids", onnx.TensorProto.INT64, [1, 8])],
                         [h.make_tensor_value_info(o, onnx.TensorProto.FLOAT, None) for o in outputs],
                         inits)
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def test_a_gather_of_one_constant_index_becomes_a_slice_the_npu_runs():
    """khmersm's transformer splits its packed q, k, v with torch's ``select`` (Gather of one
    index): npu-16m runs no Gather, so each cut the attention block into more hand-overs."""
    from npubuild.split import check_placement
    from npubuild.targets import load_chip

    source = _select_model()
    model = onnx_frontend.gather_one_index_as_slice(source)
    assert [n.op_type for n in model.graph.node].count("Gather") == 1  # the embedding stays
    feeds = {"ids": np.arange(8, dtype=np.int64).reshape(1, 8)}
    names = [o.name for o in source.graph.output]
    expected, got = onnx_io.run(source, feeds, names), onnx_io.run(model, feeds, names)
    for name in names:
        assert got[name].shape == expected[name].shape
        np.testing.assert_array_equal(got[name], expected[name])
    placed = {p.name: p.device for p in check_placement(model, load_chip("npu-16m"))}
    assert placed["select_0/as_slice"] == placed["select_0/squeeze"] == "npu"
    assert placed["select_last/as_slice"] == "npu"
    assert {p.name: p.device for p in check_placement(source, load_chip("npu-16m"))}["select_0"] == "cpu"
    assert onnx_frontend.gather_one_index_as_slice(model) is model


def test_a_node_without_inputs_beside_a_one_index_gather_is_kept():
    """A Constant node (no input at all) beside a Gather to rewrite: Silero VAD v5's import
    stopped with IndexError when the rewrite looked up every node's first input."""
    source = _select_model()
    constant = onnx.helper.make_node("Constant", [], ["unused"], name="constant",
                                     value=onnx.numpy_helper.from_array(np.float32(1.0)))
    source.graph.node.insert(0, constant)
    model = onnx_frontend.gather_one_index_as_slice(source)
    assert model.graph.node[0].op_type == "Constant"
    assert [n.op_type for n in model.graph.node].count("Gather") == 1
