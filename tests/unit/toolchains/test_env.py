"""Toolchain environments: where they live, a user's own, the Python a toolchain needs, and the
one message a missing toolchain gives."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from npubuild import toolchains
from npubuild.errors import BuildError, UserError
from npubuild.toolchains import Toolchain, env


def fake(name="fake-chain", python="current", steps=(("six==1.16.0",),)) -> Toolchain:
    return Toolchain(name=name, package="six", version="1.16.0", python=python, steps=steps,
                     identity=("six",))


def test_environments_live_in_a_user_cache_that_a_variable_moves(monkeypatch, tmp_path):
    monkeypatch.delenv(env.ROOT_VARIABLE, raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert env.root() == tmp_path / "xdg" / "npubuild" / "toolchains"
    monkeypatch.setenv(env.ROOT_VARIABLE, str(tmp_path / "chains"))
    assert env.folder(toolchains.get("rknn")) == tmp_path / "chains" / "rknn-2.5.0"


def test_a_missing_toolchain_is_one_message_naming_the_install_command(monkeypatch, tmp_path):
    monkeypatch.setenv(env.ROOT_VARIABLE, str(tmp_path))
    with pytest.raises(BuildError) as caught:
        env.require(toolchains.get("rknn"), install=False)
    assert "toolchain rknn (rknn-toolkit2==2.5.0) is not installed" in str(caught.value)
    assert caught.value.hint == "run `npubuild toolchain install rknn`"


def test_a_users_own_environment_is_used_and_asked_for_its_versions(monkeypatch, tmp_path):
    chain = fake()
    monkeypatch.setenv(chain.override_variable, sys.executable)
    found = env.find(chain)
    assert found.user_given and found.python == Path(sys.executable)
    assert set(found.versions) == {"six"}
    assert found.identity()["toolchain"] == "fake-chain"


def test_a_users_environment_that_is_not_there_is_the_users_error(monkeypatch, tmp_path):
    chain = fake()
    monkeypatch.setenv(chain.override_variable, str(tmp_path / "nope"))
    with pytest.raises(UserError, match="NPUBUILD_TOOLCHAIN_FAKE_CHAIN=.*no Python interpreter"):
        env.find(chain)


def test_a_python_version_nobody_has_stops_with_how_to_get_one(monkeypatch, tmp_path):
    monkeypatch.setenv("PYENV_ROOT", str(tmp_path))
    monkeypatch.delenv("NPUBUILD_PYTHON29", raising=False)
    with pytest.raises(UserError) as caught:
        env.base_python(fake(python="2.9"))
    assert "needs Python 2.9, and none was found" in caught.value.message
    assert "NPUBUILD_PYTHON29=" in caught.value.hint


def test_a_python_named_by_its_variable_is_checked_for_its_version(monkeypatch):
    version = "%d.%d" % sys.version_info[:2]
    major, minor = version.split(".")
    monkeypatch.setenv(f"NPUBUILD_PYTHON{major}{minor}", sys.executable)
    assert env.base_python(fake(python=version)) == Path(sys.executable)


def test_list_says_what_is_installed_and_how_to_install_the_rest(monkeypatch, tmp_path):
    monkeypatch.setenv(env.ROOT_VARIABLE, str(tmp_path))
    row = env.describe(toolchains.get("vela"))
    assert row["installed"] is False and row["install"] == "npubuild toolchain install vela"
    assert row["where"] == str(tmp_path / "vela-5.2.0")


def test_an_unknown_toolchain_name_is_the_users_error():
    with pytest.raises(UserError, match="unknown toolchain 'nope'; known: vela, rknn, tpu-mlir"):
        toolchains.get("nope")


@pytest.mark.slow
def test_install_makes_a_venv_from_the_registry_and_records_its_versions(monkeypatch, tmp_path):
    monkeypatch.setenv(env.ROOT_VARIABLE, str(tmp_path))
    made = env.install_env(fake())
    assert made.versions == {"six": "1.16.0"}
    assert (tmp_path / "fake-chain-1.16.0" / env.MARKER).is_file()
    assert env.find(fake()).versions == {"six": "1.16.0"}
