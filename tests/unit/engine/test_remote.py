"""The remote cache on a real S3 endpoint: moto's S3 server on 127.0.0.1 and the real s3fs.

"Machine A" and "machine B" are two build directories with their own local caches that share
one remote; B must restore every stage from the remote without running any stage function.
"""

from __future__ import annotations

import hashlib
import json
import logging
import socket
import time
import uuid
from pathlib import Path

import pytest

from npubuild import api
from npubuild.engine.cache import Cache
from npubuild.engine.remote import RemoteCache
from npubuild.engine.signing import load_trust
from tests.unit.engine.test_kills_and_hostile_sample import benchmark
from npubuild.stages import PIPELINE

s3fs = pytest.importorskip("s3fs", reason="the remote cache test needs s3fs")
moto_server = pytest.importorskip("moto.server", reason="the remote cache test needs moto[server]")
pytestmark = pytest.mark.usefixtures("signing_key")

@pytest.fixture
def bucket() -> str:
    """A new bucket per test: moto keeps its state per process, across servers."""
    return f"npubuild-{uuid.uuid4().hex[:12]}"


@pytest.fixture
def s3_server(monkeypatch, bucket):
    """A real S3 endpoint on loopback, with credentials and endpoint in the environment."""
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    for name, value in {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                        "AWS_DEFAULT_REGION": "us-east-1", "AWS_ENDPOINT_URL": endpoint}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    s3fs.S3FileSystem.clear_instance_cache()
    s3fs.S3FileSystem(skip_instance_cache=True).mkdir(bucket)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    yield server
    try:
        server.stop()
    except Exception:  # already stopped by the test
        pass
    s3fs.S3FileSystem.clear_instance_cache()


def tree_digest(root: Path) -> dict[str, str]:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def stage_dirs_digest(build: Path) -> dict[str, dict[str, str]]:
    return {s.name: tree_digest(build / s.name) for s in PIPELINE if (build / s.name).is_dir()}


def forbid_stage_functions(monkeypatch) -> None:
    for stage in PIPELINE:
        module, _, attr = stage.entry.partition(":")

        def refuse(ctx, _name=stage.name):
            raise AssertionError(f"stage {_name} ran on machine B")

        monkeypatch.setattr(f"{module}.{attr}", refuse)


def test_machine_b_restores_every_stage_from_the_remote_byte_for_byte(
        s3_server, bucket, tiny_recipe, tmp_path, monkeypatch):
    url = f"s3://{bucket}/cache"
    a = api.session_for(tiny_recipe, build_root=tmp_path / "a" / "build",
                        cache=tmp_path / "a" / "cache", remote=url)
    api.build(a)
    assert {r.status for r in a.results.values()} == {"built"}

    forbid_stage_functions(monkeypatch)
    b = api.session_for(tiny_recipe, build_root=tmp_path / "b" / "build",
                        cache=tmp_path / "b" / "cache", remote=url)
    assert api.plan(b)[0].status == "will restore"
    api.build(b)

    assert {name: r.status for name, r in b.results.items()} == {s.name: "restored" for s in PIPELINE}
    assert stage_dirs_digest(b.paths.root) == stage_dirs_digest(a.paths.root)
    assert len(RemoteCache(url, trust=load_trust()).keys()) == len(PIPELINE)


def test_a_url_given_as_cache_is_the_remote_behind_the_default_local_cache(s3_server, bucket, tiny_recipe, tmp_path,
                                                                          monkeypatch):
    monkeypatch.chdir(tmp_path)
    session = api.session_for(tiny_recipe, build_root=tmp_path / "build", cache=f"s3://{bucket}/c")
    api.build(session, "surgery")
    assert session.remote is not None and session.remote.available
    assert len(session.remote.keys()) == 2
    assert (tmp_path / ".npubuild" / "cache").is_dir()


def test_server_stopped_mid_build_degrades_to_a_local_build_with_one_warning(
        s3_server, bucket, tiny_recipe, tmp_path, monkeypatch, caplog):
    import npubuild.stages.split as split_stage

    real_split = split_stage.run

    def split_then_stop_the_server(ctx):
        s3_server.stop()
        return real_split(ctx)

    monkeypatch.setattr(split_stage, "run", split_then_stop_the_server)
    session = api.session_for(tiny_recipe, build_root=tmp_path / "build", cache=tmp_path / "cache",
                              remote=f"s3://{bucket}/cache")
    with caplog.at_level(logging.WARNING, logger="npubuild"):
        api.build(session)

    assert {r.status for r in session.results.values()} == {"built"}
    warnings = [r.getMessage() for r in caplog.records if "remote cache" in r.getMessage()]
    assert len(warnings) == 1 and "building without the remote" in warnings[0]
    assert session.remote is not None and not session.remote.available
    local = Cache(tmp_path / "cache")
    assert all(local.manifest(r.key) for r in session.results.values())


def test_a_tampered_remote_file_is_a_miss_not_a_wrong_artifact(s3_server, bucket, tiny_recipe, tmp_path, caplog):
    url = f"s3://{bucket}/cache"
    a = api.session_for(tiny_recipe, build_root=tmp_path / "a" / "build",
                        cache=tmp_path / "a" / "cache", remote=url)
    api.build(a, "import")
    key = a.results["import"].key
    remote = RemoteCache(url, trust=load_trust())
    path = f"{remote.entry(key)}/model.onnx"
    data = bytearray(remote.transport.fs.cat_file(path))
    data[100] ^= 0xFF  # the same size: only the hash can tell
    remote.transport.fs.pipe_file(path, bytes(data))

    local = Cache(tmp_path / "b" / "cache")
    with caplog.at_level(logging.WARNING, logger="npubuild"):
        assert remote.pull(key, local) is False
    assert local.manifest(key) is None
    assert any("does not match its hash" in r.getMessage() for r in caplog.records)


def test_an_unreachable_remote_costs_one_warning_and_no_failure(tiny_recipe, tmp_path, caplog):
    with caplog.at_level(logging.WARNING, logger="npubuild"):
        session = api.session_for(tiny_recipe, build_root=tmp_path / "build", cache=tmp_path / "cache",
                                  remote=f"file://{tmp_path}/remote-is-a-file")
        (tmp_path / "remote-is-a-file").write_text("not a folder")
        api.build(session, "surgery")
    assert {r.status for r in session.results.values() if r.key} == {"built"}
    assert sum("remote cache" in r.getMessage() for r in caplog.records) == 1


def test_a_file_remote_round_trips_an_entry(tiny_recipe, tmp_path):
    url = f"file://{tmp_path}/remote"
    a = api.session_for(tiny_recipe, build_root=tmp_path / "a", cache=tmp_path / "ca", remote=url)
    api.build(a, "import")
    b = api.session_for(tiny_recipe, build_root=tmp_path / "b", cache=tmp_path / "cb", remote=url)
    api.build(b, "import")
    assert b.results["import"].status == "restored"
    assert tree_digest(b.paths.root / "import") == tree_digest(a.paths.root / "import")


def test_cache_push_then_pull_on_another_machine_then_run_restores(s3_server, bucket, tiny_recipe, tmp_path, cli):
    url = f"s3://{bucket}/cache"
    env = {k: v for k, v in __import__("os").environ.items() if k.startswith("AWS_")}
    a = ["--build-dir", str(tmp_path / "a"), "--cache", str(tmp_path / "ca")]
    b = ["--build-dir", str(tmp_path / "b"), "--cache", str(tmp_path / "cb")]
    api.build(api.session_for(tiny_recipe, build_root=tmp_path / "a", cache=tmp_path / "ca"), "split")

    pushed = cli("cache", "push", str(tiny_recipe), *a, "--remote", url, "--json", env=env)
    assert pushed.returncode == 0, pushed.stderr
    assert json.loads(pushed.stdout)["pushed"] == ["import", "surgery", "fusion", "split"]

    status = cli("cache", "status", str(tiny_recipe), *b, "--remote", url, "--json", env=env)
    rows = {r["stage"]: r for r in json.loads(status.stdout)["stages"]}
    assert rows["split"]["remote"] and not rows["split"]["local"] and not rows["split"]["build"]

    pulled = cli("cache", "pull", str(tiny_recipe), *b, "--remote", url, "--json", env=env)
    assert json.loads(pulled.stdout)["pulled"] == ["import", "surgery", "fusion", "split"]
    session_b = api.session_for(tiny_recipe, build_root=tmp_path / "b", cache=tmp_path / "cb")
    api.build(session_b, "split")  # no remote: everything comes from the pulled local cache
    assert {r.status for r in session_b.results.values() if r.key} == {"restored"}


def test_cache_push_without_a_remote_says_how_to_configure_one(tiny_recipe, tmp_path, cli):
    result = cli("cache", "push", str(tiny_recipe), "--build-dir", str(tmp_path / "b"),
                 env={"NPUBUILD_REMOTE": ""})
    assert result.returncode == 2
    assert "no remote cache is configured" in result.stderr and "--remote" in result.stderr


def test_a_url_in_npubuild_cache_is_the_remote_and_the_local_cache_stays_a_folder(monkeypatch, tmp_path):
    from npubuild.engine.paths import DEFAULT_CACHE_DIR, cache_dir
    from npubuild.engine.remote import resolve_remote_url

    monkeypatch.delenv("NPUBUILD_REMOTE", raising=False)
    monkeypatch.setenv("NPUBUILD_CACHE", "s3://team-bucket/npubuild")
    assert resolve_remote_url(None) == "s3://team-bucket/npubuild"
    assert cache_dir(None) == DEFAULT_CACHE_DIR
    monkeypatch.setenv("NPUBUILD_CACHE", str(tmp_path))
    assert resolve_remote_url(None) is None and cache_dir(None) == tmp_path


def test_a_remote_freezing_mid_push_costs_seconds_and_one_warning(
        s3_server, bucket, tiny_recipe, tmp_path, monkeypatch, caplog):
    proxy = benchmark("remote_attacks").FreezableProxy(s3_server.get_host_and_port(), 1)
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.setenv("NPUBUILD_REMOTE_TIMEOUT", "6")  # the reads before the freeze, on a
    # loaded machine, must not be the ones that time out
    s3fs.S3FileSystem.clear_instance_cache()
    session = api.session_for(tiny_recipe, build_root=tmp_path / "build", cache=tmp_path / "cache",
                              remote=f"s3://{bucket}/cache")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="npubuild"):
        api.build(session, "fusion")
    elapsed = time.monotonic() - started
    proxy.close()
    assert {r.status for r in session.results.values() if r.key} == {"built"}
    warnings = [r.getMessage() for r in caplog.records if "remote cache" in r.getMessage()]
    assert len(warnings) == 1 and "cannot push to it (no answer within" in warnings[0], warnings
    assert proxy.frozen.is_set() and not session.remote.available
    assert elapsed < 60, elapsed  # the frozen call is given up after its deadline (6 s + 1 s)


def test_an_endpoint_that_accepts_and_never_answers_costs_seconds(tiny_recipe, tmp_path, monkeypatch,
                                                                  caplog):
    listener = socket.create_server(("127.0.0.1", 0))  # connects, never answers
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{listener.getsockname()[1]}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("NPUBUILD_REMOTE_TIMEOUT", "2")
    s3fs.S3FileSystem.clear_instance_cache()
    session = api.session_for(tiny_recipe, build_root=tmp_path / "build", cache=tmp_path / "cache",
                              remote="s3://frozen-bucket/cache")
    started = time.monotonic()
    with caplog.at_level(logging.WARNING, logger="npubuild"):
        assert session.remote_manifest("ab" * 32) is None
    assert time.monotonic() - started < 10
    assert "no answer within 3 s" in caplog.text
    listener.close()


def test_credentials_in_the_remote_url_never_appear_in_output(tiny_recipe, tmp_path, cli):
    closed = socket.create_server(("127.0.0.1", 0))
    port = closed.getsockname()[1]
    closed.close()  # nothing listens: connection refused
    url = "s3://AKIASECRETKEYID:wJalrXUtnFEMIK7MDENGbPxRfiCYSECRET@bucket/cache"
    result = cli("run", str(tiny_recipe), "import", "--build-dir", str(tmp_path / "b"),
                 "--cache", str(tmp_path / "c"), "--remote", url, "-v",
                 env={"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "NPUBUILD_REMOTE_TIMEOUT": "2"})
    assert result.returncode == 0, result.stderr
    assert "remote cache s3://***@bucket/cache" in result.stderr
    assert "AKIASECRETKEYID" not in result.stderr + result.stdout
    assert "YSECRET" not in result.stderr + result.stdout
