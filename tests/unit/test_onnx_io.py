"""Model loading refuses unsafe or broken files; saving writes a model ONNX Runtime loads."""

import re

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild import onnx_io
from npubuild.errors import UserError
from tests.conftest import TINY_MODEL


def model_with_external_weight(tmp_path, location: str) -> str:
    weight = numpy_helper.from_array(np.ones((2, 2), np.float32), "w")
    weight.data_location = TensorProto.EXTERNAL
    weight.ClearField("raw_data")
    for key, value in (("location", location), ("offset", "0"), ("length", "16")):
        weight.external_data.add(key=key, value=value)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 2])], [weight])
    path = tmp_path / "m" / "model.onnx"
    path.parent.mkdir()
    path.write_bytes(helper.make_model(graph).SerializeToString())
    return path


def test_external_data_outside_the_model_folder_is_refused(tmp_path):
    (tmp_path / "secret.bin").write_bytes(b"\0" * 16)
    path = model_with_external_weight(tmp_path, "../secret.bin")
    with pytest.raises(UserError, match="outside the model's folder"):
        onnx_io.load_model(path)


def test_external_data_inside_the_model_folder_loads(tmp_path):
    path = model_with_external_weight(tmp_path, "weights.bin")
    (path.parent / "weights.bin").write_bytes(np.ones((2, 2), np.float32).tobytes())
    model = onnx_io.load_model(path)
    np.testing.assert_array_equal(numpy_helper.to_array(model.graph.initializer[0]), np.ones((2, 2)))


def test_missing_model_file_is_a_user_error(tmp_path):
    with pytest.raises(UserError, match="model file not found"):
        onnx_io.load_model(tmp_path / "nope.onnx")


def test_saved_model_has_an_ir_version_onnx_runtime_reads(tmp_path):
    model = onnx.load(str(TINY_MODEL))
    model.ir_version = 14
    onnx_io.save_model(model, tmp_path / "out.onnx")
    assert onnx.load(str(tmp_path / "out.onnx")).ir_version == onnx_io.MAX_ORT_IR_VERSION
    onnx_io.session(tmp_path / "out.onnx")


def _model_with_function(opset: int) -> onnx.ModelProto:
    """y = Fn(x) with Fn = Unsqueeze(x, axes=[0]) at ``opset`` (axes moved to an input at 13)."""
    body = helper.make_node("Unsqueeze", ["a"], ["b"], axes=[0])
    fn = helper.make_function("npubuild.fused", "Fn", ["a"], ["b"], [body],
                              [helper.make_opsetid("", opset)])
    graph = helper.make_graph([helper.make_node("Fn", ["x"], ["y"], domain="npubuild.fused")], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 2])])
    return helper.make_model(graph, functions=[fn], ir_version=8, opset_imports=[
        helper.make_opsetid("", opset), helper.make_opsetid("npubuild.fused", 1)])


def test_convert_version_keeps_and_converts_model_local_functions():
    converted = onnx_io.convert_version(_model_with_function(12), 13)
    assert [f.name for f in converted.functions] == ["Fn"]
    assert [n.op_type for n in converted.functions[0].node] == ["Constant", "Unsqueeze"]
    x = np.arange(2, dtype=np.float32)
    np.testing.assert_array_equal(onnx_io.run(converted, {"x": x})["y"], x[None])


def test_a_model_that_lost_a_function_is_named_before_onnx_runtime_sees_it():
    model = _model_with_function(13)
    del model.functions[:]
    assert onnx_io.missing_functions(model) == ["npubuild.fused:Fn"]
    with pytest.raises(onnx_io.BuildError, match="calls npubuild.fused:Fn but carries no function"):
        onnx_io.session(model)


@pytest.mark.parametrize("make, message", [
    (lambda folder: (folder / "weights.bin").mkdir(), "not a regular file"),
    (lambda folder: (folder / "weights.bin").write_bytes(b"\0" * 8), "does not lie inside"),
])
def test_external_data_must_be_a_file_holding_its_range(tmp_path, make, message):
    path = model_with_external_weight(tmp_path, "weights.bin")
    make(path.parent)
    with pytest.raises(UserError, match=message):
        onnx_io.load_model(path)


@pytest.mark.parametrize("location, message", [
    ("weights.bin/", "which is not a file name"),
    ("weights.bin\0", "which is not a file name"),
    ("", "which is not a file name"),
    ("loop.bin", "which cannot be resolved"),
])
def test_a_broken_external_data_location_is_a_user_error(tmp_path, location, message):
    path = model_with_external_weight(tmp_path, location)
    (path.parent / "weights.bin").write_bytes(np.ones((2, 2), np.float32).tobytes())
    (path.parent / "loop.bin").symlink_to("loop.bin")
    for load_external in (True, False):  # `run` and `validate`
        with pytest.raises(UserError, match=message):
            onnx_io.load_model(path, load_external=load_external)


@pytest.mark.parametrize("tag, field", [
    (b"PRODUCER", "producer_name"), (b"conv", "graph.node[0].output[0]"),
    (b"Relu", "graph.node[1].op_type"),
])
def test_a_string_that_is_not_utf8_is_a_user_error_naming_the_field(tmp_path, tag, field):
    model = onnx.load(str(TINY_MODEL))
    model.producer_name = "PRODUCER"
    raw = model.SerializeToString()
    assert tag in raw
    path = tmp_path / "m.onnx"
    path.write_bytes(raw.replace(tag, b"\xff" + tag[1:], 1))
    with pytest.raises(UserError, match=rf"{re.escape(field)} is not UTF-8 text"):
        onnx_io.load_model(path)


def weighted_model(old_ir: bool = False):
    """MatMul by a 64x64 weight (a "large" initializer) and Add of a 4-element bias; with
    ``old_ir`` the initializers are listed as graph inputs too, as IR-3 exports do."""
    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=(64, 64)).astype(np.float32), "w"),
             numpy_helper.from_array(np.float32([1.0]), "b")]
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 64])]
    if old_ir:
        inputs += [helper.make_tensor_value_info(t.name, t.data_type, list(t.dims)) for t in inits]
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["m"]),
                               helper.make_node("Add", ["m", "b"], ["y"])], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 64])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])
    model.ir_version = 7
    return model


@pytest.mark.parametrize("old_ir", [False, True])
def test_skeleton_leaves_weights_out_and_with_weights_puts_them_back(old_ir):
    model = weighted_model(old_ir)
    light = onnx_io.skeleton(model, max_elements=16)
    assert [t.name for t in light.graph.initializer] == ["b"]
    assert "w" in [i.name for i in light.graph.input]
    inferred = onnx.shape_inference.infer_shapes(light)
    assert any(v.name == "m" for v in inferred.graph.value_info)
    back = onnx_io.with_weights(light, model, max_elements=16)
    assert sorted(t.name for t in back.graph.initializer) == ["b", "w"]
    assert [i.name for i in back.graph.input] == [i.name for i in model.graph.input]
    onnx.checker.check_model(back)


def test_large_weights_reach_onnx_runtime_in_memory_with_the_same_results(monkeypatch):
    model = weighted_model()
    x = {"x": np.random.default_rng(1).normal(size=(2, 64)).astype(np.float32)}
    expected = onnx_io.run(onnx_io.session(model), x)["y"]
    monkeypatch.setattr(onnx_io, "LARGE_SESSION_BYTES", 1024)
    monkeypatch.setattr(onnx_io, "LARGE_ELEMENTS", 16)
    sess = onnx_io.session(model)
    assert list(sess.npubuild_weights) == ["w"]          # passed beside the model, not in it
    np.testing.assert_array_equal(onnx_io.run(sess, x)["y"], expected)


def model_with_every_initializer_outside(tmp_path) -> str:
    """y = x·W + b with both in ``model.onnx.data``, as PyTorch's exporter writes a model: the
    bias is small (a skeleton keeps it), W large (a skeleton makes it a typed input)."""
    weight = np.arange(onnx_io.LARGE_ELEMENTS * 2, dtype=np.float32).reshape(2, -1) / 1e4
    bias = np.full(weight.shape[1], 0.5, np.float32)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["xw"]),
                               helper.make_node("Add", ["xw", "b"], ["y"])], "g",
                              [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 2])],
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, weight.shape[1]])],
                              [numpy_helper.from_array(weight, "w"), numpy_helper.from_array(bias, "b")])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    path = tmp_path / "m" / "model.onnx"
    path.parent.mkdir()
    onnx.save_model(model, str(path), save_as_external_data=True, all_tensors_to_one_file=True,
                    location="model.onnx.data", size_threshold=0)
    return path


def test_skeleton_of_a_model_with_external_data_holds_its_small_initializers(tmp_path):
    path = model_with_every_initializer_outside(tmp_path)
    source, light = onnx_io.load_skeleton(path)
    assert onnx_io.has_external_data(source)
    assert [t.name for t in light.graph.initializer] == ["b"]
    np.testing.assert_array_equal(numpy_helper.to_array(light.graph.initializer[0]), 0.5)
    assert "w" in [i.name for i in light.graph.input]
    onnx.checker.check_model(light)  # from any directory: nothing left to read


def test_an_output_inference_cannot_shape_keeps_its_declared_rank():
    """chars2vec's second LSTM Loop, kept whole, left its output of no inferable rank: shapes
    inferred again cleared what it declared ([unk, 300]), and the checker then refused the
    graph output with no shape at all ("Field 'shape' of 'type' is required but missing"), so
    surgery stopped on "an invalid model" that import had written."""
    graph = helper.make_graph(
        [helper.make_node("Reshape", ["x", "s"], ["y"])], "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3]),
         helper.make_tensor_value_info("s", TensorProto.INT64, ["n"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["a", 3])])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    onnx.checker.check_model(model)
    inferred = onnx_io.reinfer_shapes(model)
    onnx.checker.check_model(inferred)
    (dims,) = [o.type.tensor_type.shape.dim for o in inferred.graph.output]
    assert len(dims) == 2 and not any(d.HasField("dim_value") or d.HasField("dim_param")
                                      for d in dims)
