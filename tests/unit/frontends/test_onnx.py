"""The ONNX frontend: shapes inference cannot derive (folded, kept as declared, or named), and
old-IR models normalised, on small models that reproduce what Paddle and old exporters write."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from npubuild import onnx_io
from npubuild.errors import BuildError
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
