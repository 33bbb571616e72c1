"""`npubuild view R [stage]`: the stage's ONNX model, opened in Netron when it is installed,
else its path and how to install Netron."""

import importlib.util
import os

import pytest

from tests.conftest import REPO

FAKE_NETRON = '''
import os
def start(file, address=None, browse=True):
    with open(os.environ["NETRON_CALLS"], "a") as fh:
        fh.write(f"{file} browse={browse}\\n")
    return ("localhost", 8080)
def wait():
    pass
'''


@pytest.mark.skipif(importlib.util.find_spec("netron") is not None,
                    reason="netron is installed here: the fallback cannot be seen")
def test_without_netron_view_prints_the_model_path_and_how_to_install_it(cli, tiny_recipe, tmp_path):
    result = cli("view", str(tiny_recipe), "split", "--build-dir", str(tmp_path / "b"),
                 "--cache", str(tmp_path / "c"))
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"{tmp_path / 'b' / 'tiny' / 'split' / 'graph_0.onnx'}\n"
    assert "pip install netron" in result.stderr


def test_with_netron_view_serves_the_stage_model(cli, tiny_recipe, tmp_path):
    fake = tmp_path / "fake"
    fake.mkdir()
    (fake / "netron.py").write_text(FAKE_NETRON)
    calls = tmp_path / "calls.txt"
    env = {"PYTHONPATH": f"{fake}{os.pathsep}{REPO}", "NETRON_CALLS": str(calls)}
    result = cli("view", str(tiny_recipe), "--build-dir", str(tmp_path / "b"), "--cache",
                 str(tmp_path / "c"), env=env)
    assert result.returncode == 0, result.stderr
    model = tmp_path / "b" / "tiny" / "fusion" / "model.onnx"
    assert calls.read_text() == f"{model} browse=True\n"
    assert "Netron: http://localhost:8080" in result.stderr


def test_view_names_the_models_a_stage_has(cli, tiny_recipe, tmp_path):
    result = cli("view", str(tiny_recipe), "quantize", "--graph", "3", "--build-dir",
                 str(tmp_path / "b"), "--cache", str(tmp_path / "c"))
    assert result.returncode == 2
    assert "error: quantize wrote no graph_3.qdq.onnx\n  hint: its models: graph_0.qdq.onnx" in result.stderr
