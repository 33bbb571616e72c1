"""An ONNX-only install (no `tf` extra): a TensorFlow recipe stops with one message that names
the extra to install. TensorFlow's absence is simulated by a `tensorflow` package on the path
whose import fails the way a missing module does."""

import os

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
