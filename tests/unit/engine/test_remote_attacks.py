"""A remote cache written by an attacker (or a broken writer) is never believed.

Machine A builds and pushes, signed. Someone with write access to the remote (a ``file://``
folder here) then spoils one entry in each of the ways the attack set lists. Machine B, with a
fresh local cache, must not restore the spoilt entry: it warns once, builds the stage itself,
and its push replaces the entry, so machine C restores A's exact bytes again. No attack may
crash a run, hang it, or make it read more than the manifest declares.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from npubuild import api
from npubuild.engine.signing import SIGNING_KEY_ENV, TRUSTED_KEYS_ENV
from tests.conftest import REPO, TINY_RECIPE, write_recipe
from tests.unit.engine.test_kills_and_hostile_sample import benchmark

pytestmark = pytest.mark.usefixtures("signing_key")


@pytest.fixture(scope="module")
def pushed(tmp_path_factory, key_pair):
    """Machine A's build of import and surgery, pushed to a file:// remote (copied per test)."""
    root = tmp_path_factory.mktemp("machine-a")
    recipe = write_recipe(root, TINY_RECIPE)
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SIGNING_KEY_ENV, str(key_pair[0]))
        session = api.session_for(recipe, build_root=root / "build", cache=root / "cache",
                                  remote=f"file://{root}/remote")
        api.build(session, "surgery")
    keys = {name: r.key for name, r in session.results.items()}
    return root, keys


@pytest.fixture
def remote(pushed, tmp_path) -> Path:
    shutil.copytree(pushed[0] / "remote", tmp_path / "remote", symlinks=True)
    return tmp_path / "remote"


def entry(remote: Path, key: str) -> Path:
    return remote / key[:2] / key


# The attack set is the benchmark's (benchmarks/remote_attacks.py), where it is also measured
ATTACKS = benchmark("remote_attacks")
IMPORT_ATTACKS = {name: attack for name, (attack, spoilt, upto) in ATTACKS.FILE_ATTACKS.items()
                  if spoilt == upto == "import"}


def spoil(attack, remote: Path, key: str, tmp_path: Path, key_pair) -> None:
    attack(entry(remote, key), key, ATTACKS.Context(key_pair[0], tmp_path))


def machine(name: str, tiny_recipe: Path, tmp_path: Path, remote: Path, stage="import"):
    session = api.session_for(tiny_recipe, build_root=tmp_path / name / "build",
                              cache=tmp_path / name / "cache", remote=f"file://{remote}")
    api.build(session, stage)
    return session


@pytest.mark.parametrize("name", IMPORT_ATTACKS)
def test_an_attacked_entry_is_rebuilt_with_one_warning_and_healed_by_the_next_push(
        name, pushed, remote, tiny_recipe, tmp_path, caplog, key_pair):
    a_root, keys = pushed
    key = keys["import"]
    spoil(IMPORT_ATTACKS[name], remote, key, tmp_path, key_pair)

    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="npubuild"):
        b = machine("b", tiny_recipe, tmp_path, remote)
    assert time.monotonic() - started < 60
    assert b.results["import"].status == "built"
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len(warnings) == 1 and f"entry {key[:12]} rejected" in warnings[0], warnings
    assert b.remote.available  # one bad entry never disables the remote

    c = machine("c", tiny_recipe, tmp_path, remote)
    assert c.results["import"].status == "restored"
    model = (c.paths.stage_dir("import") / "model.onnx").read_bytes()
    assert model == (a_root / "build" / "tiny" / "import" / "model.onnx").read_bytes()


def test_a_signed_entry_with_an_over_long_file_name_is_refused_alone(
        pushed, remote, tiny_recipe, tmp_path, caplog, key_pair):
    """A trusted writer's bug: the manifest is signed but lists a name no file system holds."""
    _, keys = pushed
    spoil(ATTACKS.over_long_name, remote, keys["import"], tmp_path, key_pair)
    with caplog.at_level(logging.WARNING, logger="npubuild"):
        b = machine("b", tiny_recipe, tmp_path, remote, "surgery")
    assert [b.results[s].status for s in ("import", "surgery")] == ["built", "restored"]
    assert "too long" in caplog.text and b.remote.available


def test_a_flipped_verdict_in_a_verify_entry_is_not_believed(tiny_recipe, tmp_path, caplog):
    """The issue's case: a remote verify entry saying the opposite of what verify found."""
    remote = tmp_path / "remote"
    a = machine("a", tiny_recipe, tmp_path, remote, "verify")
    key = a.results["verify"].key
    verdict = a.results["verify"].report["verify"]["passed"]
    spoil(ATTACKS.flipped_verdict, remote, key, tmp_path, (None,))
    with caplog.at_level(logging.WARNING, logger="npubuild"):
        b = machine("b", tiny_recipe, tmp_path, remote, "verify")
    assert b.results["verify"].status == "built"
    assert b.results["verify"].report["verify"]["passed"] is verdict
    assert f"entry {key[:12]} rejected (the signature does not match" in caplog.text


def test_a_reader_without_the_private_key_restores_but_never_pushes(
        pushed, remote, tiny_recipe, tmp_path, monkeypatch, key_pair):
    monkeypatch.delenv(SIGNING_KEY_ENV)
    monkeypatch.setenv(TRUSTED_KEYS_ENV, key_pair[1])
    _, keys = pushed
    b = machine("b", tiny_recipe, tmp_path, remote, "fusion")
    assert [b.results[s].status for s in ("import", "surgery", "fusion")] == [
        "restored", "restored", "built"]
    assert not entry(remote, b.results["fusion"].key).exists()


def test_with_no_key_configured_the_remote_is_not_used_with_one_warning(
        pushed, remote, tiny_recipe, tmp_path, monkeypatch, caplog):
    monkeypatch.delenv(SIGNING_KEY_ENV)
    with caplog.at_level(logging.WARNING, logger="npubuild"):
        b = machine("b", tiny_recipe, tmp_path, remote, "fusion")
    assert {r.status for r in b.results.values() if r.key} == {"built"}
    assert caplog.text.count("is not used: no key is configured") == 1
    assert not entry(remote, b.results["fusion"].key).exists()


def test_cache_push_replaces_a_corrupt_remote_entry_it_used_to_call_pushed(
        pushed, remote, tiny_recipe, tmp_path, cli):
    a_root, keys = pushed
    spoil(ATTACKS.corrupt_entry, remote, keys["import"], tmp_path, (None,))
    args = ["--build-dir", str(a_root / "build"), "--cache", str(a_root / "cache"),
            "--remote", f"file://{remote}", "--json"]
    pushed_now = cli("cache", "push", str(tiny_recipe), *args)
    assert pushed_now.returncode == 0, pushed_now.stderr
    assert json.loads(pushed_now.stdout)["pushed"] == ["import", "surgery"]
    assert "rejected (model.onnx does not match its hash)" in pushed_now.stderr
    c = machine("c", tiny_recipe, tmp_path, remote)
    assert c.results["import"].status == "restored"


def test_cache_push_without_a_signing_key_is_a_user_error(pushed, tiny_recipe, tmp_path, cli,
                                                         key_pair):
    result = cli("cache", "push", str(tiny_recipe), "--build-dir", str(tmp_path / "b"),
                 "--remote", f"file://{tmp_path}/r",
                 env={SIGNING_KEY_ENV: "", TRUSTED_KEYS_ENV: key_pair[1]})
    assert result.returncode == 2
    assert "NPUBUILD_SIGNING_KEY: no signing key for the remote cache" in result.stderr


KILLED_PULL = """
import os, signal, sys
from npubuild import api
from npubuild.engine import remote
real = remote.RemoteCache._download
def download_then_die(self, key, rel, info, staging):
    real(self, key, rel, info, staging)
    os.kill(os.getpid(), signal.SIGKILL)
remote.RemoteCache._download = download_then_die
session = api.session_for(sys.argv[1], build_root=sys.argv[2], cache=sys.argv[3], remote=sys.argv[4])
api.build(session, "import")
"""


def test_a_pull_killed_midway_leaves_nothing_a_rerun_keeps(pushed, remote, tiny_recipe, tmp_path,
                                                           cli):
    cache = tmp_path / "b" / "cache"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    killed = subprocess.run([sys.executable, "-c", KILLED_PULL, str(tiny_recipe),
                             str(tmp_path / "b" / "build"), str(cache), f"file://{remote}"],
                            env=env, capture_output=True, text=True, timeout=300)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    staged = [p.name for p in cache.iterdir() if p.name.startswith(".tmp-")]
    assert staged and all(socket.gethostname() in name for name in staged)
    legacy = cache / ".pull-x1y2z3"  # what pulls left before, in an older npubuild
    legacy.mkdir()
    os.utime(legacy, (time.time() - 7200, time.time() - 7200))

    b = machine("b", tiny_recipe, tmp_path, remote)
    assert b.results["import"].status == "restored"
    assert not any(p.name.startswith(".tmp-") for p in cache.iterdir())
    gc = cli("cache", "gc", "--cache", str(cache), "--json")
    assert [p["path"] for p in json.loads(gc.stdout)["problems"]] == [str(legacy)]
    assert sorted(p.name for p in cache.iterdir()) == sorted(
        ["CACHEDIR.TAG", b.results["import"].key[:2]])


def test_cache_push_through_a_folder_that_is_not_a_cache_is_one_user_error(
        pushed, tiny_recipe, tmp_path, cli):
    a_root, _ = pushed
    home = tmp_path / "home"
    (home / "Documents").mkdir(parents=True)
    result = cli("cache", "push", str(tiny_recipe), "--build-dir", str(a_root / "build"),
                 "--cache", str(home), "--remote", f"file://{tmp_path}/r")
    assert result.returncode == 2
    assert f"error: cannot store import into the local cache: {home} is not an npubuild cache" \
        in result.stderr
    assert sorted(p.name for p in home.iterdir()) == ["Documents"]
