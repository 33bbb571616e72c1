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


@pytest.fixture(scope="module")
def streaming_model(tmp_path_factory):
    """microWakeWord's form: a ring buffer in a resource variable (VAR_HANDLE, READ_VARIABLE,
    ASSIGN_VARIABLE, CALL_ONCE initialising it to ones), shifted by each new frame."""
    tf = tf_frontend._tensorflow()
    with tf_frontend._quiet():
        class Streaming(tf.Module):
            def __init__(self):
                self.ring = tf.Variable(tf.ones([1, 3, 4]), name="ring")
                self.weights = tf.constant(np.random.default_rng(0).standard_normal((4, 2)),
                                           tf.float32)

            @tf.function(input_signature=[tf.TensorSpec([1, 1, 4], tf.float32, name="x")])
            def __call__(self, x):
                ring = tf.concat([self.ring[:, 1:], x], axis=1)
                self.ring.assign(ring)
                return tf.reduce_sum(tf.matmul(ring, self.weights), axis=1)

        module = Streaming()
        converter = tf.lite.TFLiteConverter.from_concrete_functions(
            [module.__call__.get_concrete_function()], module)
        converter.experimental_enable_resource_variables = True
        path = tmp_path_factory.mktemp("streaming") / "streaming.tflite"
        path.write_bytes(converter.convert())
    return path


def test_a_streaming_models_variables_become_inputs_and_outputs_proven_by_stepping(
        streaming_model):
    """microWakeWord's streaming models keep ring buffers in resource variables: the import
    stopped naming them ("keeps state between calls in resource variables")."""
    model = tflite_graph.read(streaming_model)
    assert tflite_graph.state_ops(model)["READ_VARIABLE"] == 1
    [ring] = tflite_graph.variables_as_io(model)
    assert tflite_graph.state_ops(model) == {}
    assert ring.name == "ring" and ring.initial.tolist() == np.ones((1, 3, 4)).tolist()
    assert tflite_graph.tensor_name(model, ring.input) == "ring"
    assert tflite_graph.tensor_name(model, ring.output) == "ring_out"
    steps = [{"serving_default_x:0": np.full((1, 1, 4), k, np.float32)} for k in range(4)]
    tf = tf_frontend._tensorflow()
    original, rewritten = streaming_model.read_bytes(), tflite_graph.to_bytes(model)
    worst = tflite_graph.prove_variables_as_io(tf, original, rewritten, [ring], steps)
    assert set(worst) == {"StatefulPartitionedCall:0", "ring_out"}
    # the proof can fail: a wrong first state differs from the reset model's
    wrong = tflite_graph.Variable(ring.name, ring.input, ring.output, ring.initial * 0,
                                  ring.written)
    with pytest.raises(ValueError, match="step 0"):
        tflite_graph.prove_variables_as_io(tf, original, rewritten, [wrong], steps)


def test_a_streaming_model_imports_with_its_state_as_input_and_output(streaming_model):
    inputs = [InputSpec(name="serving_default_x:0", shape=[1, 1, 4])]
    model = tf_frontend.convert(streaming_model, "tflite", inputs, None)
    assert [i.name for i in model.graph.input] == ["serving_default_x:0", "ring"]
    assert [o.name for o in model.graph.output] == ["StatefulPartitionedCall:0", "ring_out"]
    [ring] = tf_frontend.variables(streaming_model, "tflite", inputs, None)
    state, x = ring.initial, np.arange(4, dtype=np.float32).reshape(1, 1, 4)
    for _ in range(2):  # the ONNX model stepped as a user steps it
        got = run(model, {"serving_default_x:0": x, "ring": state})
        state = got["ring_out"]
    assert state.tolist() == [[[1.0] * 4, [0, 1, 2, 3], [0, 1, 2, 3]]]
    proof = tf_frontend.prove_state(streaming_model, "tflite", {"serving_default_x:0": x},
                                    inputs, None, 3)
    assert proof["steps"] == 3 and proof["max_abs"]["ring_out"] == 0.0


def test_a_streaming_model_cut_at_its_output_keeps_its_states_new_value(streaming_model):
    """A recipe that lists `model.outputs` cut the state outputs away: the state input stayed,
    its new value went, and no call after the first could be fed the state the model keeps.
    The new value of every state the listed outputs read is kept after them."""
    inputs = [InputSpec(name="serving_default_x:0", shape=[1, 1, 4])]
    listed = ["StatefulPartitionedCall:0"]
    model = tf_frontend.convert(streaming_model, "tflite", inputs, listed)
    assert [i.name for i in model.graph.input] == ["serving_default_x:0", "ring"]
    assert [o.name for o in model.graph.output] == ["StatefulPartitionedCall:0", "ring_out"]
    x = np.arange(4, dtype=np.float32).reshape(1, 1, 4)
    [ring] = tf_frontend.variables(streaming_model, "tflite", inputs, listed)
    [y, state] = tf_frontend.run_source(streaming_model, "tflite", {"serving_default_x:0": x,
                                                                    "ring": ring.initial},
                                        inputs, listed)
    got = run(model, {"serving_default_x:0": x, "ring": ring.initial})
    np.testing.assert_allclose(got["ring_out"], state, rtol=1e-6)
    np.testing.assert_allclose(got["StatefulPartitionedCall:0"], y, rtol=1e-6)
    # listing the state output too keeps it once, where the recipe lists it
    both = tf_frontend.convert(streaming_model, "tflite", inputs, ["ring_out", *listed])
    assert [o.name for o in both.graph.output] == ["ring_out", "StatefulPartitionedCall:0"]


def test_a_streaming_models_variables_are_rewritten_once_per_import(streaming_model,
                                                                    monkeypatch):
    """An import opens the source for the variables' listing, their proof, the conversion and
    the source's run: each rewrote the variables again (4 times per import)."""
    calls = []
    rewrite = tflite_graph.variables_as_io
    monkeypatch.setattr(tflite_graph, "variables_as_io",
                        lambda model: calls.append(1) or rewrite(model))
    cached = getattr(tf_frontend, "_state_as_io_of", None)  # another test may have filled it
    if cached is not None:
        cached.cache_clear()
    inputs = [InputSpec(name="serving_default_x:0", shape=[1, 1, 4])]
    x = {"serving_default_x:0": np.ones((1, 1, 4), np.float32)}
    [ring] = tf_frontend.variables(streaming_model, "tflite", inputs, None)
    tf_frontend.prove_state(streaming_model, "tflite", x, inputs, None, 2)
    tf_frontend.convert(streaming_model, "tflite", inputs, None)
    tf_frontend.run_source(streaming_model, "tflite", {**x, "ring": ring.initial}, inputs, None)
    assert len(calls) == 1
    assert not ring.initial.flags.writeable  # shared by every open: nobody may change it


def test_a_fully_connected_flattening_its_input_keeps_its_bias(tmp_path):
    """A FULLY_CONNECTED with a bias reading a rank-4 input without keep_num_dims (microWakeWord's
    last dense layer): tf2onnx 1.17 flattened the input and dropped the bias (2 int8 steps on
    okay_nabu's logit); the flattening is now a RESHAPE of its own before tf2onnx runs."""
    from tensorflow.lite.python import schema_py_generated as schema

    from tests.unit.frontends.tflite_models import Graph, write

    rng = np.random.default_rng(0)
    g = Graph()
    g.tensor("x", [1, 1, 2, 4])
    g.tensor("weights", [3, 4], rng.standard_normal((3, 4)).astype(np.float32))
    g.tensor("bias", [3], np.asarray([10.0, -20.0, 30.0], np.float32))
    g.tensor("y", [2, 3])
    options = schema.FullyConnectedOptionsT()
    options.keepNumDims = False
    g.op("FULLY_CONNECTED", ["x", "weights", "bias"], ["y"],
         (schema.BuiltinOptions.FullyConnectedOptions, options))
    path = write(g, ["x"], ["y"], tmp_path / "dense.tflite")
    inputs = [InputSpec(name="x", shape=[1, 1, 2, 4])]
    model = tf_frontend.convert(path, "tflite", inputs, None)
    x = rng.standard_normal((1, 1, 2, 4)).astype(np.float32)
    [source] = tf_frontend.run_source(path, "tflite", {"x": x}, inputs, None)
    got = next(iter(run(model, {"x": x}).values()))
    np.testing.assert_allclose(got, source, rtol=1e-5, atol=1e-5)
