"""Model loading refuses unsafe or broken files; saving writes a model ONNX Runtime loads."""

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
