"""The vendor toolchain in compile's and verify's keys (a tool-version hook,
`npubuild.backends.toolchain_versions`): its name and exact versions, and the reason `plan`
gives when they change."""

from __future__ import annotations

from npubuild.backends import toolchain_versions
from npubuild.engine.keys import TOOL_VERSION_HOOKS, KeyParts, explain_change
from npubuild.stages import STAGES
from npubuild.toolchains import env


class Loaded:
    """What the hook reads of a loaded recipe: its chip."""

    def __init__(self, chip: str):
        from npubuild.targets import load_chip

        self._chip = load_chip(chip)

    def chip(self):
        return self._chip


def test_the_hook_is_registered_with_the_keys():
    assert "npubuild.backends:toolchain_versions" in TOOL_VERSION_HOOKS


def test_simulated_chips_and_stages_without_a_toolchain_add_nothing():
    assert toolchain_versions(STAGES["compile"], Loaded("npu-16m")) == {}
    assert toolchain_versions(STAGES["split"], Loaded("rk3588")) == {}


def test_a_real_chips_compile_and_verify_key_on_the_toolchains_versions(monkeypatch, tmp_path):
    monkeypatch.setenv(env.ROOT_VARIABLE, str(tmp_path))  # not installed: what npubuild installs
    for stage in ("compile", "verify"):
        assert toolchain_versions(STAGES[stage], Loaded("rk3588")) == \
            {"rknn toolchain: rknn-toolkit2": "2.5.0"}


def test_plan_says_the_toolchain_changed():
    old = KeyParts("compile", "0.1.0", "c", tools={"rknn toolchain: rknn-toolkit2": "2.4.0"})
    new = KeyParts("compile", "0.1.0", "c", tools={"rknn toolchain: rknn-toolkit2": "2.5.0"})
    assert "rknn toolchain: rknn-toolkit2 (2.4.0 -> 2.5.0)" in explain_change({"parts": old.as_dict()}, new)
