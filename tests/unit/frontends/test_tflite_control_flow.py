"""TFLite control flow imports: an IF whose operand is a zero-element constant (what a converted
`tf.cond` hands its branches when they capture an empty tensor) is a constant, not a tensor the
recipe must feed ("cannot cut the TFLite model" about a cut nobody asked for)."""

from __future__ import annotations

import numpy as np
import pytest

from npubuild.frontends import tensorflow as tf_frontend
from npubuild.frontends import tflite_graph
from npubuild.onnx_io import run
from npubuild.recipe.model import InputSpec

pytestmark = pytest.mark.slow
INPUTS = [InputSpec(name="x", shape=[1, 4])]


@pytest.fixture(scope="module")
def cond_model(tmp_path_factory):
    """x → sum > 0 → IF: x * 2, else x - 1; both branches concatenate a [0, 4] constant."""
    tf = tf_frontend._tensorflow()
    with tf_frontend._quiet():
        empty = tf.constant(np.zeros((0, 4), np.float32))

        @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32, name="x")])
        def branch(x):
            return tf.cond(tf.reduce_sum(x) > 0, lambda: tf.concat([x, empty], 0) * 2.0,
                           lambda: tf.concat([empty, x], 0) - 1.0)

        converter = tf.lite.TFLiteConverter.from_concrete_functions(
            [branch.get_concrete_function()], branch)
        path = tmp_path_factory.mktemp("cond") / "cond.tflite"
        path.write_bytes(converter.convert())
    return path


def test_the_if_reads_a_zero_element_constant(cond_model):
    model = tflite_graph.read(cond_model)
    graph = model.subgraphs[0]
    [op] = [op for op in graph.operators if tflite_graph.op_type(model, op) == "IF"]
    empty = [t for t in op.inputs if 0 in list(graph.tensors[t].shape)]
    assert empty and all(tflite_graph.is_constant(model, t) for t in empty)


@pytest.mark.parametrize("sign", [1.0, -1.0])
def test_it_imports_as_an_onnx_if_equal_to_tflite_on_both_branches(cond_model, sign):
    model = tf_frontend.convert(cond_model, "tflite", INPUTS, None)
    assert "If" in [n.op_type for n in model.graph.node]
    x = sign * np.arange(1, 5, dtype=np.float32).reshape(1, 4)
    [source] = tf_frontend.run_source(cond_model, "tflite", {"x": x}, INPUTS, None)
    np.testing.assert_array_equal(next(iter(run(model, {"x": x}).values())), source)


def test_a_streaming_model_with_resource_variables_is_named_with_what_to_do(tmp_path):
    """microWakeWord's streaming models keep ring buffers in resource variables (VAR_HANDLE,
    READ_VARIABLE, ASSIGN_VARIABLE, CALL_ONCE): tf2onnx failed with an IndexError and the hint
    said to try another opset."""
    from npubuild.errors import UserError

    tf = tf_frontend._tensorflow()
    with tf_frontend._quiet():
        class Streaming(tf.Module):
            def __init__(self):
                self.previous = tf.Variable(tf.zeros([1, 4]))

            @tf.function(input_signature=[tf.TensorSpec([1, 4], tf.float32, name="x")])
            def __call__(self, x):
                y = self.previous + x
                self.previous.assign(x)
                return y

        module = Streaming()
        converter = tf.lite.TFLiteConverter.from_concrete_functions(
            [module.__call__.get_concrete_function()], module)
        converter.experimental_enable_resource_variables = True
        path = tmp_path / "streaming.tflite"
        path.write_bytes(converter.convert())
    assert tflite_graph.state_ops(tflite_graph.read(path))["READ_VARIABLE"] >= 1
    with pytest.raises(UserError) as caught:
        tf_frontend.convert(path, "tflite", [InputSpec(name="serving_default_x:0", shape=[1, 4])], None)
    assert "keeps state between calls in resource variables" in str(caught.value)
    assert "without streaming state" in caught.value.hint
