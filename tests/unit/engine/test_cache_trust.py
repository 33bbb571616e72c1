"""The content cache trusts nothing it has not checked, and is only ever an optimisation."""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import socket

import pytest

from npubuild import api
from npubuild.engine.cache import Cache
from npubuild.engine.paths import MANIFEST


def build(recipe, tmp_path, cache=None):
    session = api.session_for(recipe, build_root=tmp_path / "build",
                              cache=cache or tmp_path / "cache")
    api.build(session, "import")
    return session


def fresh_build(recipe, tmp_path, cache=None):
    """A build with an empty build dir: the import stage restores or builds."""
    shutil.rmtree(tmp_path / "build", ignore_errors=True)
    return build(recipe, tmp_path, cache)


def status(session):
    return session.results["import"].status


def import_key(recipe, tmp_path):
    session = build(recipe, tmp_path)
    return session.results["import"].key, session.cache


def spoil_missing(entry):
    (entry / MANIFEST).unlink()


def spoil_garbled(entry):
    (entry / MANIFEST).write_text("{not json")


def spoil_symlinked(entry):
    real = entry.parent / "elsewhere.json"
    (entry / MANIFEST).rename(real)
    (entry / MANIFEST).symlink_to(real)


def spoil_plain_file(entry):
    shutil.rmtree(entry)
    entry.write_text("not a directory")


@pytest.mark.parametrize("spoil", [spoil_missing, spoil_garbled, spoil_symlinked, spoil_plain_file])
def test_a_spoilt_entry_is_rebuilt_once_and_stored_again(tiny_recipe, tmp_path, calls, spoil):
    key, cache = import_key(tiny_recipe, tmp_path)
    spoil(cache.entry(key))
    assert status(fresh_build(tiny_recipe, tmp_path)) == "built"
    assert cache.check(key) is None  # the rebuilt stage replaced the spoilt entry
    assert status(fresh_build(tiny_recipe, tmp_path)) == "restored"
    assert calls["import"] == 2


def test_an_entry_under_the_wrong_key_is_not_restored(tiny_recipe, tmp_path, calls):
    key, cache = import_key(tiny_recipe, tmp_path)
    other = "f" * 64
    shutil.copytree(cache.entry(key), cache.entry(other))
    assert cache.manifest(other) is None
    assert cache.check(other) == "the manifest belongs to another key"


def test_only_listed_files_are_restored_and_symlinks_are_never_followed(tiny_recipe, tmp_path, calls):
    key, cache = import_key(tiny_recipe, tmp_path)
    entry = cache.entry(key)
    (entry / "planted.txt").write_text("not in the manifest")
    (entry / "system").symlink_to("/etc", target_is_directory=True)
    (entry / "loop").symlink_to(entry / "loop")
    session = fresh_build(tiny_recipe, tmp_path)
    assert status(session) == "restored"
    restored = sorted(p.name for p in session.paths.stage_dir("import").iterdir())
    assert restored == sorted([*cache.read_manifest(key)["files"], MANIFEST])
    assert "model.onnx" in restored and "planted.txt" not in restored
    assert "files not in the manifest" in cache.check(key)


def test_a_listed_file_that_is_a_symlink_out_of_the_entry_is_corrupt(tiny_recipe, tmp_path, calls,
                                                                     caplog):
    key, cache = import_key(tiny_recipe, tmp_path)
    model = cache.entry(key) / "model.onnx"
    outside = tmp_path / "outside.onnx"
    shutil.copy(model, outside)  # the same bytes: only the symlink is wrong
    model.unlink()
    model.symlink_to(outside)
    with caplog.at_level(logging.WARNING, logger="npubuild"):
        assert status(fresh_build(tiny_recipe, tmp_path)) == "built"
    assert "is corrupt" in caplog.text and key[:12] in caplog.text


def test_corruption_is_reported_not_healed_silently(tiny_recipe, tmp_path, calls, caplog):
    key, cache = import_key(tiny_recipe, tmp_path)
    model = cache.entry(key) / "model.onnx"
    model.write_bytes(model.read_bytes()[:-3] + b"xyz")
    with caplog.at_level(logging.WARNING, logger="npubuild"):
        assert status(fresh_build(tiny_recipe, tmp_path)) == "built"
    assert "model.onnx does not match its hash" in caplog.text


def test_a_cache_path_naming_a_file_warns_once_and_builds(tiny_recipe, tmp_path, caplog):
    blocker = tmp_path / "cache-file"
    blocker.write_text("")
    with caplog.at_level(logging.WARNING, logger="npubuild"):
        session = build(tiny_recipe, tmp_path, cache=blocker / "sub")
    assert status(session) == "built"
    assert caplog.text.count("building without it") == 1


@pytest.mark.parametrize("code", [errno.ENOSPC, errno.EROFS, errno.EACCES])
def test_a_full_or_read_only_cache_warns_and_builds(tiny_recipe, tmp_path, monkeypatch, caplog, code):
    def refuse(self, *args):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(Cache, "store", refuse)
    with caplog.at_level(logging.WARNING, logger="npubuild"):
        assert status(build(tiny_recipe, tmp_path)) == "built"
    assert os.strerror(code) in caplog.text


def test_a_byte_flip_that_keeps_size_and_mtime_is_rebuilt(tiny_recipe, tmp_path, calls):
    session = build(tiny_recipe, tmp_path)
    model = session.paths.stage_dir("import") / "model.onnx"
    build(tiny_recipe, tmp_path)  # the hash of the current file is now remembered
    before = model.stat()
    data = bytearray(model.read_bytes())
    data[len(data) // 2] ^= 0x01
    model.write_bytes(bytes(data))
    os.utime(model, ns=(before.st_atime_ns, before.st_mtime_ns))
    assert model.stat().st_size == before.st_size
    assert status(build(tiny_recipe, tmp_path)) == "restored"
    assert bytes(data) != model.read_bytes()


def test_the_lock_file_never_follows_a_symlink(tiny_recipe, tmp_path):
    from npubuild.errors import UserError

    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    lock = tmp_path / "build" / "tiny" / ".lock"
    lock.parent.mkdir(parents=True)
    lock.symlink_to(target)
    with pytest.raises(UserError, match="symlink"):
        build(tiny_recipe, tmp_path)
    assert target.read_text() == "keep me"


def test_artifacts_and_cache_entries_honour_the_umask(tiny_recipe, tmp_path):
    old = os.umask(0o022)
    try:
        session = build(tiny_recipe, tmp_path)
    finally:
        os.umask(old)
    files = [*session.paths.stage_dir("import").iterdir(),
             *session.cache.entry(session.results["import"].key).iterdir(), session.paths.report]
    assert {oct(p.stat().st_mode & 0o777) for p in files} == {"0o644"}


def test_a_run_removes_what_killed_runs_left_and_gc_cleans_the_cache(tiny_recipe, tmp_path, cli):
    session = build(tiny_recipe, tmp_path)
    root = session.paths.root
    (root / ".tmp" / "import-dead").mkdir(parents=True)
    (root / ".tmp-report.json.x1y2").write_text("half")
    (root / "import" / ".tmp-model.onnx.z9").write_text("half")
    dead = session.cache.root / "00" / f".tmp-{socket.gethostname()}-999999999-deadbeef"
    dead.mkdir(parents=True)
    (dead / "model.onnx").write_bytes(b"x" * 1000)
    build(tiny_recipe, tmp_path)
    assert not any(p.name.startswith(".tmp") for p in [*root.iterdir(), *(root / "import").iterdir()])
    verify = cli("cache", "verify", "--cache", str(session.cache.root))
    assert verify.returncode == 1 and "left by a killed run" in verify.stdout
    gc = cli("cache", "gc", "--cache", str(session.cache.root), "--json")
    removed = json.loads(gc.stdout)["problems"]
    assert gc.returncode == 0 and [p["path"] for p in removed] == [str(dead)]
    assert removed[0]["bytes"] == 1000 and not dead.exists()
    assert cli("cache", "verify", "--cache", str(session.cache.root)).returncode == 0


def test_cache_gc_removes_entries_failing_their_hash_and_keeps_good_ones(tiny_recipe, tmp_path, cli):
    session = build(tiny_recipe, tmp_path)
    key = session.results["import"].key
    (session.cache.entry(key) / "import.json").write_text("{}")
    verify = cli("cache", "verify", "--cache", str(session.cache.root))
    assert verify.returncode == 1 and "import.json does not match its hash" in verify.stdout
    gc = cli("cache", "gc", "--cache", str(session.cache.root))
    assert gc.returncode == 0 and "removed 1 corrupt entries and 0 orphans" in gc.stdout
    assert not session.cache.entry(key).exists()


def test_a_read_only_build_dir_is_a_clear_user_error(tiny_recipe, tmp_path, monkeypatch):
    """(Root ignores chmod, so the read-only mount is simulated where the lock opens.)"""
    from npubuild.engine import lock
    from npubuild.errors import UserError

    def read_only(*args, **kwargs):
        raise OSError(errno.EROFS, os.strerror(errno.EROFS))

    monkeypatch.setattr(lock.os, "open", read_only)
    with pytest.raises(UserError, match="cannot lock the build directory .*Read-only file system"):
        build(tiny_recipe, tmp_path)


def plant_look_alikes(folder):
    """What `cache gc` used to remove from any folder: a stale .tmp-* and an entry-shaped dir."""
    old = folder / ".tmp-editor-swap"
    old.mkdir(parents=True)
    os.utime(old, (1, 1))
    entry = folder / "ab" / ("ab" * 32)
    entry.mkdir(parents=True)
    (entry / "notes.txt").write_text("mine")
    (folder / "Documents").mkdir()
    return sorted(p.relative_to(folder) for p in folder.rglob("*"))


@pytest.mark.parametrize("action", ["gc", "verify"])
def test_gc_and_verify_refuse_a_folder_npubuild_did_not_make_a_cache(tmp_path, cli, action):
    home = tmp_path / "home"
    before = plant_look_alikes(home)
    result = cli("cache", action, "--cache", str(home))
    assert result.returncode == 2
    assert f"error: {home} is not an npubuild cache: it holds 'Documents'" in result.stderr
    assert "nothing was checked or removed" in result.stderr
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == before


def test_a_new_cache_is_tagged_and_a_tagged_cache_is_cleaned(tiny_recipe, tmp_path, cli):
    session = build(tiny_recipe, tmp_path)
    tag = session.cache.root / "CACHEDIR.TAG"
    assert tag.read_text().startswith("Signature: 8a477f597d28d172789f06886806bc55\n")
    (session.cache.root / "Documents").mkdir()  # the tag, not the layout, makes it a cache
    assert cli("cache", "gc", "--cache", str(session.cache.root)).returncode == 0


def test_a_cache_from_before_the_tag_is_adopted_when_it_holds_only_entries(tiny_recipe, tmp_path,
                                                                          cli, calls):
    session = build(tiny_recipe, tmp_path)
    (session.cache.root / "CACHEDIR.TAG").unlink()
    assert cli("cache", "verify", "--cache", str(session.cache.root)).returncode == 0
    assert not (session.cache.root / "CACHEDIR.TAG").exists()  # verify only reads
    assert status(fresh_build(tiny_recipe, tmp_path)) == "restored"
    Cache(session.cache.root).store(session.paths.stage_dir("import"), "cd" * 32)  # adopted
    assert (session.cache.root / "CACHEDIR.TAG").is_file()


def test_a_run_never_writes_into_a_folder_that_is_not_a_cache(tiny_recipe, tmp_path, caplog):
    home = tmp_path / "home"
    before = plant_look_alikes(home)
    with caplog.at_level(logging.WARNING, logger="npubuild"):
        session = build(tiny_recipe, tmp_path, cache=home)
    assert status(session) == "built"
    assert caplog.text.count("is not an npubuild cache") == 1
    assert sorted(p.relative_to(home) for p in home.rglob("*")) == before


@pytest.mark.parametrize("name", [".doit.sqlite", ".doit.sqlite-journal"])
def test_doits_database_is_never_opened_through_a_symlink(tiny_recipe, tmp_path, cli, name):
    target = tmp_path / "precious.txt"
    target.write_text("keep me")
    link = tmp_path / "build" / "tiny" / name
    link.parent.mkdir(parents=True)
    link.symlink_to(target)
    result = cli("run", str(tiny_recipe), "import", "--build-dir", str(tmp_path / "build"),
                 "--cache", str(tmp_path / "cache"))
    assert result.returncode == 2
    assert f"error: {link} is a symlink: doit's database is never opened through one" in result.stderr
    assert target.read_text() == "keep me"


def test_a_lock_timeout_names_the_recipe_the_holder_and_the_wait(tiny_recipe, tmp_path, cli):
    from npubuild.engine.lock import build_lock

    with build_lock(tmp_path / "build" / "tiny" / ".lock"):
        result = cli("run", str(tiny_recipe), "--build-dir", str(tmp_path / "build"),
                     "--cache", str(tmp_path / "cache"), "--wait", "0.5")
    assert result.returncode == 2
    assert (f"error: {tiny_recipe}: another npubuild run (pid {os.getpid()}) is writing "
            f"{tmp_path / 'build' / 'tiny'} (waited 0.5 s)") in result.stderr
    assert "hint: wait for it to finish, or pass --wait SECONDS" in result.stderr
