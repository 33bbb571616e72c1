"""Cache keys carry the versions of the tools whose output lands in an artifact: numpy, onnx and
onnxruntime for every stage, TensorFlow and tf2onnx for a TensorFlow import, and whatever a
tool-version hook (a vendor backend) declares; a changed version rebuilds and says why."""

from __future__ import annotations

import importlib.metadata
from types import SimpleNamespace

import pytest

from npubuild import api
from npubuild.engine import keys
from npubuild.stages import STAGES


@pytest.fixture
def fresh_versions():
    keys.distribution_version.cache_clear()
    keys.tool_version_hooks.cache_clear()
    yield
    keys.distribution_version.cache_clear()
    keys.tool_version_hooks.cache_clear()


def session(recipe, tmp_path):
    return api.session_for(recipe, build_root=tmp_path / "build", cache=tmp_path / "cache")


def test_every_stage_key_names_numpy_onnx_and_onnxruntime_as_installed(tiny_recipe, tmp_path):
    parts = session(tiny_recipe, tmp_path).parts(STAGES["import"])
    assert parts.tools == {"numpy": f"numpy {importlib.metadata.version('numpy')}",
                           "onnx": f"onnx {importlib.metadata.version('onnx')}",
                           "onnxruntime": f"onnxruntime {importlib.metadata.version('onnxruntime')}"}


@pytest.mark.parametrize("fmt, stage, has_tf", [("keras", "import", True), ("tflite", "import", True),
                                                 ("onnx", "import", False), ("keras", "quantize", False)])
def test_tensorflow_and_tf2onnx_are_in_the_key_only_of_a_tensorflow_import(fmt, stage, has_tf):
    tools = keys.tool_versions(STAGES[stage], SimpleNamespace(model_format=fmt))
    assert ("tensorflow" in tools and "tf2onnx" in tools) is has_tf
    assert has_tf is False or not tools["tensorflow"].startswith("absent")


def test_a_new_library_version_changes_the_key_and_plan_says_which(tiny_recipe, tmp_path,
                                                                   monkeypatch, fresh_versions):
    api.build(session(tiny_recipe, tmp_path), "import")
    real = importlib.metadata.version
    monkeypatch.setattr(importlib.metadata, "version",
                        lambda name: "9.9.9" if name == "onnxruntime" else real(name))
    keys.distribution_version.cache_clear()
    [planned] = api.plan(session(tiny_recipe, tmp_path), "import")
    assert planned.status == "will run"
    assert planned.reason.startswith("tool versions changed: onnxruntime (onnxruntime ")
    assert planned.reason.endswith("-> onnxruntime 9.9.9)")


def vendor_toolchain(stage, loaded):
    return {"vendor-npu-compiler": "2.3.0"} if stage.name == "compile" else {}


def test_a_hook_adds_a_vendor_toolchain_to_the_stages_it_names(tiny_recipe, monkeypatch,
                                                              fresh_versions):
    monkeypatch.setattr(keys, "TOOL_VERSION_HOOKS",
                        (*keys.TOOL_VERSION_HOOKS, f"{__name__}:vendor_toolchain"))
    loaded = SimpleNamespace(model_format="onnx")
    assert keys.tool_versions(STAGES["compile"], loaded)["vendor-npu-compiler"] == "2.3.0"
    assert "vendor-npu-compiler" not in keys.tool_versions(STAGES["quantize"], loaded)


def test_an_absent_library_is_named_so_not_an_error(fresh_versions):
    assert keys.distribution_version("no-such-distribution-npubuild") == "absent"
    assert keys.distribution_version("no-such-distribution-npubuild", "numpy").startswith("numpy ")
