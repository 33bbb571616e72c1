"""An ONNX-only install (no `tf` extra): a TensorFlow recipe stops with one message that names
the extra to install. TensorFlow's absence is simulated by a `tensorflow` package on the path
whose import fails the way a missing module does."""

import os

import numpy as np
import pytest

from tests.conftest import REPO, write_recipe

MISSING = "raise ModuleNotFoundError(\"No module named 'tensorflow'\", name='tensorflow')\n"


def test_a_tensorflow_recipe_without_the_tf_extra_names_the_extra(tmp_path, cli):
    fake = tmp_path / "site" / "tensorflow"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text(MISSING)
    (tmp_path / "model.pb").write_bytes(b"not read: TensorFlow is needed first")
    recipe = write_recipe(tmp_path, """\
        version: 1
        name: tf-without-extra
        model:
          path: model.pb
          inputs: [{name: "input:0", shape: [1, 8, 8, 3]}]
          outputs: ["Identity:0"]
        """)
    env = {"PYTHONPATH": os.pathsep.join([str(fake.parent), str(REPO)])}
    result = cli("run", str(recipe), "import", "--build-dir", str(tmp_path / "build"),
                 "--cache", str(tmp_path / "cache"), env=env)
    assert result.returncode == 2, result.stderr
    assert "tensorflow is not installed" in result.stderr
    assert "pip install 'npubuild[tf]'" in result.stderr
    assert "Traceback" not in result.stderr
    assert result.stderr.count("error:") == 1


VALIDATE_WITHOUT = """\
import sys
for name in {hidden!r}:
    sys.modules[name] = None  # as if not installed: find_spec and import both fail
from npubuild.cli import main
code = main(["validate", {recipe!r}])
print("tensorflow imported" if "tensorflow" in sys.modules and sys.modules["tensorflow"] else "")
sys.exit(code)
"""


def _validate(tmp_path, hidden):
    import subprocess
    import sys

    from tests.unit.frontends import tflite_models

    path = tflite_models.with_unknown_custom_op(tmp_path)
    np.save(tmp_path / "calibration.npy", np.zeros((1, 4, 4, 2), np.float32))  # run needs it
    recipe = write_recipe(tmp_path, f"""\
        version: 1
        name: tflite-validate
        model:
          path: {path.name}
          inputs: [{{name: x, shape: [1, 4, 4, 2]}}]
        quantization: {{calibration: {{data: calibration.npy}}}}
        """)
    code = VALIDATE_WITHOUT.format(hidden=hidden, recipe=str(recipe))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})


@pytest.mark.slow  # writes the model with TensorFlow's schema classes
@pytest.mark.parametrize("hidden", [["tensorflow"], ["tf2onnx"]])
def test_validate_names_the_tf_extra_for_a_tflite_recipe_as_run_does(tmp_path, hidden):
    result = _validate(tmp_path, hidden)
    assert result.returncode == 2, result.stderr
    assert f"recipe.yaml:4:9: model.path: this recipe's model is a TensorFlow model, and " \
           f"{hidden[0]} is not installed" in result.stderr
    assert "pip install 'npubuild[tf]'" in result.stderr and "Traceback" not in result.stderr


@pytest.mark.slow
def test_validate_reads_a_tflite_signature_without_importing_tensorflow(tmp_path):
    result = _validate(tmp_path, [])
    assert result.returncode == 0, result.stderr
    assert "valid" in result.stdout and "tensorflow imported" not in result.stdout


@pytest.mark.slow
def test_a_string_input_is_named_before_tf2onnx_runs(tmp_path):
    """guesslang's SavedModel reads source code as one string and hashes it in the graph
    (StringToHashBucketFast, lookup tables, sparse ops); tf2onnx failed with 'Failed to import
    metagraph' and the hint said to try another opset."""
    from npubuild.errors import UserError
    from npubuild.frontends import tensorflow as tf_frontend
    from npubuild.recipe.model import InputSpec

    tf = tf_frontend._tensorflow()
    with tf_frontend._quiet():
        class Lengths(tf.Module):
            @tf.function(input_signature=[tf.TensorSpec([None], tf.string, name="text")])
            def __call__(self, text):
                buckets = tf.strings.to_hash_bucket_fast(text, 16)
                return {"scores": tf.nn.softmax(tf.one_hot(buckets, 16))}

        module = Lengths()
        tf.saved_model.save(module, str(tmp_path / "sm"), signatures=module.__call__)
    with pytest.raises(UserError) as caught:
        tf_frontend.convert(tmp_path / "sm", "saved_model", [InputSpec(name="text", shape=[1])], None)
    assert "input 'text' is a string tensor" in str(caught.value)
    assert "token ids" in caught.value.hint
