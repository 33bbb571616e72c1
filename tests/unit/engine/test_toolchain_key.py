"""The vendor toolchain in compile's and verify's keys: its name and exact versions, and the
reason `plan` gives when they change."""

from __future__ import annotations

from npubuild.engine.keys import KeyParts, explain_change, toolchain_part
from npubuild.stages import STAGES
from npubuild.targets import load_chip
from npubuild.toolchains import env


def test_simulated_chips_and_stages_without_a_toolchain_key_on_nothing_more():
    assert toolchain_part(STAGES["compile"], load_chip("npu-16m")) is None
    assert toolchain_part(STAGES["split"], load_chip("rk3588")) is None


def test_a_real_chips_compile_and_verify_key_on_the_toolchains_versions(monkeypatch, tmp_path):
    monkeypatch.setenv(env.ROOT_VARIABLE, str(tmp_path))  # not installed: what npubuild installs
    for stage in ("compile", "verify"):
        assert toolchain_part(STAGES[stage], load_chip("rk3588")) == \
            {"toolchain": "rknn", "rknn-toolkit2": "2.5.0"}


def test_plan_says_the_toolchain_changed():
    old = KeyParts("compile", "0.1.0", "c", toolchain={"toolchain": "rknn", "rknn-toolkit2": "2.4.0"})
    new = KeyParts("compile", "0.1.0", "c", toolchain={"toolchain": "rknn", "rknn-toolkit2": "2.5.0"})
    assert explain_change({"parts": old.as_dict()}, new).startswith("toolchain changed")
