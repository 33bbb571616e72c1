"""The TensorFlow frontend on one small Keras CNN (Conv+BatchNorm+ReLU, then a MobileNetV3
block: hard-swish and squeeze-and-excite) saved in every format it reads.

Each conversion is checked three ways on the same random input: ONNX Runtime on the converted
model vs `run_source` (the source framework) within 1e-4, and `run_source` vs the Keras model
itself (so names and output order are right, not just consistent with each other).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from npubuild.errors import UserError
from npubuild.frontends import tensorflow as tf_frontend
from npubuild.proofs import compare
from npubuild.onnx_io import MAX_ORT_IR_VERSION, graph_inputs, run, value_shape
from npubuild.recipe.model import InputSpec

SHAPE = [1, 16, 16, 3]
WIDTHS = {"logits": 5, "features": 8}  # the two outputs, told apart by their last dim


def spec(name: str, shape=SHAPE, **kwargs) -> InputSpec:
    return InputSpec(name=name, shape=shape, **kwargs)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """The CNN (Conv2D+BatchNorm+ReLU, pooled features and Dense logits, batch None) saved as
    frozen .pb, SavedModel, .keras, .h5 and .tflite, plus its own outputs on a random input."""
    tf = tf_frontend._tensorflow()  # the frontend's quiet import
    with tf_frontend._quiet():
        model = _cnn(tf.keras)
        out = tmp_path_factory.mktemp("tf_models")
        paths = {"keras": out / "model.keras", "h5": out / "model.h5",
                 "saved_model": out / "saved_model", "tf_frozen": out / "frozen.pb",
                 "tflite": out / "model.tflite"}
        model.save(paths["keras"])
        model.save(paths["h5"])
        model.export(str(paths["saved_model"]), verbose=False)
        paths["tf_frozen"].write_bytes(_frozen_graph_def(tf, model).SerializeToString())
        paths["tflite"].write_bytes(tf.lite.TFLiteConverter.from_keras_model(model).convert())
        paths["tflite_int8"] = out / "model_int8.tflite"
        paths["tflite_int8"].write_bytes(_full_int8(tf, model))
        x = np.random.default_rng(1).standard_normal(SHAPE).astype(np.float32)
        logits, features = (t.numpy() for t in model(x, training=False))
    return SimpleNamespace(paths=paths, x=x, expected={5: logits, 8: features})


def _cnn(keras):
    keras.utils.set_random_seed(0)
    image = keras.Input(SHAPE[1:], name="image")
    x = keras.layers.Conv2D(8, 3, padding="same")(image)
    norm = keras.layers.BatchNormalization()
    x = keras.layers.ReLU()(norm(x))
    features = keras.layers.GlobalAveragePooling2D(name="features")(x)
    # MobileNetV3's block: 1x1 conv, hard-swish (x + 3 with a scalar), squeeze-and-excite Mul
    y = keras.layers.Activation("hard_swish")(keras.layers.Conv2D(6, 1)(x))
    excite = keras.layers.Conv2D(6, 1, activation="hard_sigmoid")(
        keras.layers.GlobalAveragePooling2D(keepdims=True)(y))
    y = keras.layers.Multiply()([y, excite])
    logits = keras.layers.Dense(5, name="logits")(keras.layers.GlobalAveragePooling2D()(y))
    rng = np.random.default_rng(0)  # non-trivial statistics, so folding BatchNorm is tested
    norm.set_weights([rng.uniform(0.5, 2, 8), rng.normal(0, 1, 8), rng.normal(0, 1, 8),
                      rng.uniform(0.5, 2, 8)])
    return keras.Model(image, [logits, features])


def _full_int8(tf, model) -> bytes:
    """The model as a full-integer TFLite (int8 kernels, float input and output), calibrated on
    seeded random images as TFLite's converter is."""
    converter = tf.lite.TFLiteConverter.from_keras_model(model)
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    rng = np.random.default_rng(2)
    converter.representative_dataset = lambda: ([rng.standard_normal(SHAPE).astype(np.float32)]
                                                for _ in range(8))
    converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
    return converter.convert()


def _frozen_graph_def(tf, model):
    """A frozen GraphDef whose output tensors are named 'logits' and 'features'."""
    from tensorflow.python.framework.convert_to_constants import convert_variables_to_constants_v2

    def outputs(x):
        return [tf.identity(t, name=n) for t, n in zip(model(x, training=False), WIDTHS)]

    fn = tf.function(outputs).get_concrete_function(
        tf.TensorSpec([None, *SHAPE[1:]], tf.float32, name="image"))
    return convert_variables_to_constants_v2(fn).graph.as_graph_def()


# case: (file, format, recipe inputs, recipe outputs, ONNX input name, ONNX output names)
CASES = {
    "tf_frozen": ("tf_frozen", "tf_frozen", [spec("image")], ["features", "logits:0"],
                  "image", ["features", "logits:0"]),
    "saved_model": ("saved_model", "saved_model", [spec("image")], None,
                    "image", ["output_0", "output_1"]),
    "keras": ("keras", "keras", [spec("image")], None, "image", ["logits", "features"]),
    "h5": ("h5", "keras", [spec("image:0")], ["features"], "image:0", ["features"]),
    # TFLite output tensor names are TF's own (StatefulPartitionedCall...): only counted
    "tflite": ("tflite", "tflite", [spec("serving_default_image")], None,
               "serving_default_image", None),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES)
def test_conversion_matches_the_source_framework(models, case):
    file, fmt, inputs, outputs, input_name, output_names = CASES[case]
    path = models.paths[file]
    model = tf_frontend.convert(path, fmt, inputs, outputs)

    assert [(v.name, value_shape(v)) for v in graph_inputs(model)] == [(input_name, SHAPE)]
    names = [o.name for o in model.graph.output]
    assert names == (output_names or names) and len(names) == len(output_names or WIDTHS)
    if fmt != "tflite":  # the recipe's batch reached tf2onnx (its TFLite path ignores shapes)
        assert all(value_shape(o)[0] == 1 for o in model.graph.output)
    assert model.ir_version <= MAX_ORT_IR_VERSION
    # NHWC → NCHW once at the input; none left between the ops (layout, issue class 9)
    assert [n.op_type for n in model.graph.node].count("Transpose") == 1
    assert {(o.domain, o.version) for o in model.opset_import} >= {("", 17)}

    feeds = {input_name: models.x}
    converted = run(model, feeds)
    source = dict(zip(names, tf_frontend.run_source(path, fmt, feeds, inputs, outputs)))
    _, bad = compare(source, converted, tolerance=1e-4)
    assert not bad, [str(b) for b in bad]
    for name, value in source.items():  # the source run is the Keras model's own result
        want = models.expected[value.shape[-1]]
        np.testing.assert_allclose(value, want, rtol=1e-4, atol=1e-5)
        for label, width in WIDTHS.items():
            assert label not in name or value.shape[-1] == width, name


@pytest.mark.slow
def test_tflite_can_be_cut_at_an_inner_tensor(models):
    tf = tf_frontend._tensorflow()
    path = models.paths["tflite"]
    with tf_frontend._quiet():
        tensors = tf.lite.Interpreter(model_path=str(path)).get_tensor_details()
    # Conv2D+BatchNorm+ReLU is one fused TFLite op: its output is the one 16x16x8 tensor
    relu = next(d["name"] for d in tensors if list(d["shape"]) == [1, 16, 16, 8])
    inputs = [spec("serving_default_image:0")]
    model = tf_frontend.convert(path, "tflite", inputs, [relu])
    assert [o.name for o in model.graph.output] == [relu]
    feeds = {"serving_default_image:0": models.x}
    (source,) = tf_frontend.run_source(path, "tflite", feeds, inputs, [relu])
    assert source.shape == (1, 16, 16, 8) and source.min() >= 0
    _, bad = compare({relu: source}, run(model, feeds), tolerance=1e-4)
    assert not bad, [str(b) for b in bad]


@pytest.mark.slow
@pytest.mark.parametrize("inputs, outputs, field, bad_name, candidate", [
    ([spec("imag")], ["logits"], "model.inputs[0].name", "'imag'", "image:0"),
    ([spec("image")], ["logits", "logit:0"], "model.outputs[1]", "'logit:0'", "Identity:0"),
    ([], ["logits"], "model.inputs", "inputs", "image:0"),
    ([spec("image")], None, "model.outputs", "outputs", "Identity_1:0"),
], ids=["unknown input", "unknown output", "no inputs", "no outputs"])
def test_frozen_graph_names_are_checked(models, inputs, outputs, field, bad_name, candidate):
    path = models.paths["tf_frozen"]
    with pytest.raises(UserError) as err:
        tf_frontend.convert(path, "tf_frozen", inputs, outputs)
    assert err.value.exit_code == 2 and err.value.field == field
    assert bad_name in err.value.message and str(path) in str(err.value)
    assert candidate in err.value.hint  # placeholders for inputs, unconsumed tensors for outputs


@pytest.mark.slow
@pytest.mark.parametrize("file, fmt", [("keras", "keras"), ("saved_model", "saved_model")])
def test_outputs_must_be_the_models_own(models, file, fmt):
    with pytest.raises(UserError, match="'nope' is not a tensor") as err:
        tf_frontend.convert(models.paths[file], fmt, [], ["nope"])
    assert err.value.field == "model.outputs[0]" and "surgery" in err.value.hint


@pytest.mark.slow
@pytest.mark.parametrize("input_spec, field", [
    (spec("image", [1, 16, 16, 4]), "model.inputs[0].shape"),
    (spec("image", [1, 16, 16]), "model.inputs[0].shape"),
    (spec("image", dtype="uint8"), "model.inputs[0].dtype"),
])
def test_recipe_shape_and_dtype_must_fit(models, input_spec, field):
    with pytest.raises(UserError) as err:
        tf_frontend.convert(models.paths["keras"], "keras", [input_spec], None)
    assert err.value.field == field


@pytest.mark.slow
@pytest.mark.parametrize("name, fmt", [("bad.pb", "tf_frozen"), ("bad.keras", "keras"),
                                       ("bad.h5", "keras"), ("bad.tflite", "tflite"),
                                       ("bad_saved_model", "saved_model")])
def test_corrupt_files_are_user_errors(tmp_path, name, fmt):
    junk = np.random.default_rng(0).bytes(2048)
    path = tmp_path / name
    if fmt == "saved_model":
        path.mkdir()
        (path / "saved_model.pb").write_bytes(junk)
    else:
        path.write_bytes(junk)
    with pytest.raises(UserError, match="cannot read") as err:
        tf_frontend.convert(path, fmt, [spec("x")], ["y"])
    assert str(path) in str(err.value)


def test_missing_file_and_unknown_format_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="not found") as err:
        tf_frontend.convert(tmp_path / "nope.pb", "tf_frozen", [spec("x")], ["y"])
    assert err.value.field == "model.path"
    with pytest.raises(UserError, match="unknown TensorFlow model format 'onnx'"):
        tf_frontend.convert(tmp_path, "onnx", [], None)


@pytest.mark.slow
def test_ops_tf2onnx_cannot_convert_are_named(tmp_path):
    tf = tf_frontend._tensorflow()
    graph = tf.Graph()
    with graph.as_default():
        x = tf.compat.v1.placeholder(tf.float32, [4, 4], name="x")
        tf.identity(tf.linalg.svd(x, compute_uv=False), name="y")
    path = tmp_path / "svd.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    with pytest.raises(UserError, match=r"could not convert these ops to ONNX: Svd \(×1\)"):
        tf_frontend.convert(path, "tf_frozen", [InputSpec(name="x")], ["y"])


CONVERT_TWICE = """
import sys
from pathlib import Path
from npubuild.frontends import tensorflow as tf_frontend
from npubuild.recipe.model import InputSpec
for fmt, name, path, out in zip(*[iter(sys.argv[1:])] * 4):
    spec = [InputSpec(name=name, shape=%r)]
    Path(out).write_bytes(tf_frontend.convert(Path(path), fmt, spec, None).SerializeToString(deterministic=True))
""" % (SHAPE,)


def test_a_conversion_is_byte_identical_in_any_process_and_hash_seed(models, tmp_path):
    """tf2onnx alone is not (its optimizers iterate over sets; its names count up across the
    conversions of a process): here, after the conversions this test process already made,
    and in a fresh one with another hash seed."""
    cases = [("keras", "image", models.paths["keras"]),
             ("tflite", "serving_default_image", models.paths["tflite_int8"])]
    here = [tf_frontend.convert(path, fmt, [spec(name)], None).SerializeToString(deterministic=True)
            for fmt, name, path in cases]
    args = [a for i, (fmt, name, path) in enumerate(cases)
            for a in (fmt, name, str(path), str(tmp_path / f"{i}.onnx"))]
    result = subprocess.run([sys.executable, "-c", CONVERT_TWICE, *args], capture_output=True,
                            text=True, env={**os.environ, "PYTHONHASHSEED": "4242"})
    assert result.returncode == 0, result.stderr
    assert [(tmp_path / f"{i}.onnx").read_bytes() for i in range(len(cases))] == here


def test_importing_the_frontend_does_not_load_tensorflow():
    code = ("import sys, npubuild.frontends.tensorflow; "
            "loaded = {'tensorflow', 'tf2onnx', 'keras'} & set(sys.modules); "
            "sys.exit(f'loaded {sorted(loaded)}' if loaded else 0)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            cwd=Path(__file__).resolve().parents[3])
    assert result.returncode == 0, result.stderr


@pytest.mark.slow
@pytest.mark.parametrize("keep", [0.5, 0.9, 0.99])
def test_truncated_tflite_is_refused_before_the_interpreter_can_crash(models, tmp_path, keep):
    from npubuild.frontends.tflite_check import check_tflite

    whole = models.paths["tflite"].read_bytes()
    check_tflite(models.paths["tflite"])  # the whole file passes
    path = tmp_path / "cut.tflite"
    path.write_bytes(whole[:int(len(whole) * keep)])
    with pytest.raises(UserError, match="truncated or corrupt"):
        check_tflite(path)


@pytest.mark.slow
def test_sparse_tflite_weights_are_densified_before_tf2onnx(tmp_path):
    tf = tf_frontend._tensorflow()
    keras = tf.keras
    with tf_frontend._quiet():
        keras.utils.set_random_seed(0)
        image = keras.Input(SHAPE[1:], name="image")
        x = keras.layers.Conv2D(16, 3, padding="same", activation="relu")(image)
        model = keras.Model(image, keras.layers.GlobalAveragePooling2D()(keras.layers.Conv2D(24, 1)(x)))
        rng = np.random.default_rng(1)
        for layer in model.layers:  # 80 % zeros: the converter stores the weights sparse
            if isinstance(layer, keras.layers.Conv2D):
                kernel, bias = layer.get_weights()
                layer.set_weights([kernel * (rng.random(kernel.shape) < 0.2), bias])
        converter = tf.lite.TFLiteConverter.from_keras_model(model)
        converter.optimizations = [tf.lite.Optimize.EXPERIMENTAL_SPARSITY]
        path = tmp_path / "sparse.tflite"
        path.write_bytes(converter.convert())
    from tensorflow.lite.tools import flatbuffer_utils

    codes = flatbuffer_utils.read_model(str(path)).operatorCodes
    assert 124 in {c.builtinCode for c in codes}  # DENSIFY: the model really is sparse
    inputs = [spec("serving_default_image")]
    converted = tf_frontend.convert(path, "tflite", inputs, None)
    feeds = {"serving_default_image": np.random.default_rng(2).standard_normal(SHAPE).astype(np.float32)}
    (source,) = tf_frontend.run_source(path, "tflite", feeds, inputs, None)
    _, bad = compare({converted.graph.output[0].name: source}, run(converted, feeds), tolerance=1e-4)
    assert not bad, [str(b) for b in bad]


@pytest.mark.slow
def test_placeholders_with_defaults_are_fed_or_keep_their_default(tmp_path):
    """A TensorFlow 1 graph trained from a dataset: its input defaults to the iterator's next
    batch (a computed tensor, not a constant) and a `training` flag defaults to False, gating
    dropout through TensorFlow 1's tf.cond (Switch/Merge). The input the recipe feeds is an
    input; the flag it does not feed keeps its default, and the branch it switches off is gone
    (tf2onnx alone stops: "non-const default value for PlaceholderWithDefault"). Fed too, the
    flag is an input like any other."""
    tf = tf_frontend._tensorflow()
    v1 = tf.compat.v1
    weight = np.random.default_rng(0).normal(0, 1, (6, 3)).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        batch = v1.placeholder(tf.float32, [None, 6], name="batch")  # the iterator's stand-in
        x = v1.placeholder_with_default(tf.tanh(batch), [None, 6], name="x")
        training = v1.placeholder_with_default(False, [], name="training")
        h = tf.nn.relu(tf.matmul(x, tf.constant(weight)))
        v1.disable_control_flow_v2()  # TensorFlow 1's tf.cond: Switch and Merge, no If
        try:
            # as tf.layers.dropout(training=training) wrote it
            h = v1.cond(training, lambda: tf.nn.dropout(h, rate=0.5), lambda: tf.identity(h))
        finally:
            v1.enable_control_flow_v2()
        tf.identity(tf.sigmoid(h), name="prob")
    path = tmp_path / "with_defaults.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    inputs = [InputSpec(name="x", shape=[2, 6])]
    model = tf_frontend.convert(path, "tf_frozen", inputs, ["prob"])

    assert [v.name for v in graph_inputs(model)] == ["x"]
    assert not {"RandomUniform", "RandomUniformLike", "If"} & {n.op_type for n in model.graph.node}
    feed = np.random.default_rng(1).normal(0, 1, (2, 6)).astype(np.float32)
    (converted,) = run(model, {"x": feed}).values()
    (source,) = tf_frontend.run_source(path, "tf_frozen", {"x": feed}, inputs, ["prob"])
    np.testing.assert_allclose(converted, source, rtol=1e-5, atol=1e-6)
    # the flag's default (no dropout) ran, on the fed x rather than the iterator's batch
    np.testing.assert_allclose(source, 1 / (1 + np.exp(-np.maximum(feed @ weight, 0))), rtol=1e-5)

    both = [*inputs, InputSpec(name="training", shape=[])]  # the flag fed too: an input
    model = tf_frontend.convert(path, "tf_frozen", both, ["prob"])
    assert [v.name for v in graph_inputs(model)] == ["x", "training"]


@pytest.mark.slow
@pytest.mark.parametrize("spatial", [2, 3])
def test_a_transpose_conv_after_a_cond_is_padded_as_tensorflow_pads_it(tmp_path, spatial):
    """deepbrain's U-Net: a stride-2 SAME Conv3DBackpropInputV2 whose input comes out of a
    TensorFlow 1 tf.cond (dropout behind a fed `training` flag), so tf2onnx does not know its
    size and writes only ``output_shape``: ONNX then puts the odd padding row at the start,
    TensorFlow at the end, and the upsampled map is shifted by one (off by its own magnitude)."""
    tf = tf_frontend._tensorflow()
    v1 = tf.compat.v1
    shape = [1] + [6] * spatial + [4]
    rng = np.random.default_rng(0)
    kernel = rng.normal(0, 1, [3] * spatial + [5, 4]).astype(np.float32)
    graph = tf.Graph()
    with graph.as_default():
        x = v1.placeholder(tf.float32, [None] * (spatial + 1) + [4], name="x")
        training = v1.placeholder_with_default(True, [], name="training")
        v1.disable_control_flow_v2()  # TensorFlow 1's tf.cond: Switch and Merge, no If
        try:
            h = v1.cond(training, lambda: tf.nn.dropout(x, rate=0.5), lambda: tf.identity(x))
        finally:
            v1.enable_control_flow_v2()
        size = tf.shape(h)  # as tf.layers.conv3d_transpose computes its output's size
        out = tf.stack([size[0]] + [size[i] * 2 for i in range(1, spatial + 1)] + [5])
        up = tf.nn.conv2d_transpose if spatial == 2 else tf.nn.conv3d_transpose
        tf.identity(up(h, tf.constant(kernel), out, [1] + [2] * spatial + [1], padding="SAME"),
                    name="y")
    path = tmp_path / "up.pb"
    path.write_bytes(graph.as_graph_def().SerializeToString())
    inputs = [InputSpec(name="x", shape=shape), InputSpec(name="training", shape=[])]
    model = tf_frontend.convert(path, "tf_frozen", inputs, ["y"])

    (up_node,) = [n for n in model.graph.node if n.op_type == "ConvTranspose"]
    pads = [a for a in up_node.attribute if a.name == "pads"]
    assert pads and list(pads[0].ints) == [0] * spatial + [1] * spatial
    feeds = {"x": rng.normal(0, 1, shape).astype(np.float32), "training": np.array(False)}
    (converted,) = run(model, feeds).values()
    (source,) = tf_frontend.run_source(path, "tf_frozen", feeds, inputs, ["y"])
    np.testing.assert_allclose(converted, source, rtol=1e-4, atol=1e-5)
