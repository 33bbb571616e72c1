"""SavedModels this TensorFlow cannot revive as Python objects (an older TensorFlow or Keras wrote
objects it no longer has, e.g. Keras 2 optimizer slots: "'_UserObject' object has no attribute
'add_slot'", basic-pitch 0.4.0's model written by TensorFlow 2.4.1) are read through their
MetaGraph as TensorFlow 1 read them; one neither way reads names the TensorFlow that wrote it."""

from __future__ import annotations

import numpy as np
import pytest

from npubuild.errors import UserError
from npubuild.frontends import tensorflow as tf_frontend
from npubuild.onnx_io import run
from npubuild.recipe.model import InputSpec

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def old_saved_model(tmp_path_factory):
    """A dense layer + ReLU (two weights: grappler leaves graphs under four nodes alone, calls
    included) saved by tf.saved_model.save, then given what an older Keras wrote:
    an optimizer slot on one of its variables, which TensorFlow 2.21 revives as a plain
    `_UserObject` without `add_slot`; and the TensorFlow version 2.4.1 in its MetaGraph."""
    from tensorflow.core.protobuf import saved_model_pb2

    tf = tf_frontend._tensorflow()
    with tf_frontend._quiet():
        module = tf.Module()
        rng = np.random.default_rng(0)
        module.w = tf.Variable(rng.normal(size=(4, 3)).astype(np.float32))
        module.b = tf.Variable(rng.normal(size=3).astype(np.float32))
        module.opt = tf.Module()
        module.opt.m = tf.Variable(np.zeros((4, 3), np.float32))  # becomes the slot

        def serve(x):
            return {"y": tf.nn.relu(tf.matmul(x, module.w) + module.b)}

        module.serve = tf.function(serve, input_signature=[tf.TensorSpec([None, 4], tf.float32,
                                                                         "x")])
        path = tmp_path_factory.mktemp("old") / "saved_model"
        tf.saved_model.save(module, str(path), signatures={"serving_default": module.serve})
    saved = saved_model_pb2.SavedModel()
    saved.ParseFromString((path / "saved_model.pb").read_bytes())
    meta = saved.meta_graphs[0]
    meta.meta_info_def.tensorflow_version = "2.4.1"
    graph = meta.object_graph_def
    child = {c.local_name: c.node_id for c in graph.nodes[0].children}
    optimizer = child["opt"]
    moment = next(c.node_id for c in graph.nodes[optimizer].children if c.local_name == "m")
    del graph.nodes[optimizer].children[:]  # the slot is reached through its variable only
    slot = graph.nodes[optimizer].slot_variables.add()
    slot.original_variable_node_id, slot.slot_name = child["w"], "m"
    slot.slot_variable_node_id = moment
    (path / "saved_model.pb").write_bytes(saved.SerializeToString())
    return path, module.w.numpy(), module.b.numpy()


def test_tensorflow_itself_cannot_revive_it(old_saved_model):
    tf = tf_frontend._tensorflow()
    with pytest.raises(AttributeError, match="add_slot"), tf_frontend._quiet():
        tf.saved_model.load(str(old_saved_model[0]))


def test_it_converts_and_runs_through_its_metagraph(old_saved_model):
    path, w, b = old_saved_model
    inputs = [InputSpec(name="x", shape=[2, 4])]
    model = tf_frontend.convert(path, "saved_model", inputs, None)
    x = np.random.default_rng(1).normal(size=(2, 4)).astype(np.float32)
    expected = np.maximum(x @ w + b, 0)
    [source] = tf_frontend.run_source(path, "saved_model", {"x": x}, inputs, None)
    assert [o.name for o in model.graph.output] == ["y"]
    np.testing.assert_allclose(source, expected, rtol=1e-6)
    np.testing.assert_allclose(run(model, {"x": x})["y"], expected, rtol=1e-5, atol=1e-6)
    assert tf_frontend.signature(path, "saved_model", inputs, None) == {"inputs": ["x"],
                                                                        "outputs": ["y"]}


def test_one_neither_way_reads_names_the_tensorflow_that_wrote_it(old_saved_model, tmp_path):
    import shutil

    broken = tmp_path / "saved_model"
    shutil.copytree(old_saved_model[0], broken)
    shutil.rmtree(broken / "variables")  # its weights are gone: no way can restore them
    with pytest.raises(UserError) as err:
        tf_frontend.convert(broken, "saved_model", [InputSpec(name="x", shape=[2, 4])], None)
    message = str(err.value)
    assert "written by TensorFlow 2.4.1" in message and "add_slot" in message
    assert "load it with TensorFlow 2.4.1" in err.value.hint
