"""The build engine: incremental runs, the content cache, atomic swaps and the lock."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import onnx
import pytest

from npubuild import api
from npubuild.engine.hashing import sha256_file
from tests.conftest import REPO, TINY_RECIPE, write_recipe


def build(recipe, tmp_path, stage="import"):
    session = api.session_for(recipe, build_root=tmp_path / "build", cache=tmp_path / "cache")
    api.build(session, stage)
    return session


def statuses(session):
    return {name: r.status for name, r in session.results.items()}


def test_second_run_executes_no_stage(tiny_recipe, tmp_path, calls):
    first = build(tiny_recipe, tmp_path)
    second = build(tiny_recipe, tmp_path)
    assert statuses(first)["import"] == "built"
    assert statuses(second)["import"] == "current"
    assert calls["import"] == 1


def test_editing_only_quantization_leaves_import_current(tiny_recipe, tmp_path, calls):
    build(tiny_recipe, tmp_path)
    tiny_recipe.write_text(tiny_recipe.read_text().replace("scheme: symmetric", "scheme: asymmetric"))
    session = build(tiny_recipe, tmp_path)
    assert statuses(session)["import"] == "current"
    assert calls["import"] == 1


def test_recipe_a_b_a_restores_a_from_the_cache_without_running_the_stage(tiny_recipe, tmp_path, calls):
    recipe_a = tiny_recipe.read_text()
    build(tiny_recipe, tmp_path)
    model_a = (tmp_path / "build/tiny/import/model.onnx").read_bytes()
    tiny_recipe.write_text(recipe_a.replace("[1, 3, 8, 8]", "[1, 3, 16, 16]"))
    assert statuses(build(tiny_recipe, tmp_path))["import"] == "built"
    tiny_recipe.write_text(recipe_a)
    session = build(tiny_recipe, tmp_path)
    assert statuses(session)["import"] == "restored"
    assert calls["import"] == 2
    assert (tmp_path / "build/tiny/import/model.onnx").read_bytes() == model_a


def test_corrupt_cache_entry_is_evicted_and_rebuilt(tiny_recipe, tmp_path, calls):
    session = build(tiny_recipe, tmp_path)
    key = session.results["import"].key
    cached_model = session.cache.entry(key) / "model.onnx"
    cached_model.write_bytes(cached_model.read_bytes()[:-10])
    (tmp_path / "build/tiny/import/manifest.json").unlink()
    session = build(tiny_recipe, tmp_path)
    assert statuses(session)["import"] == "built"
    assert calls["import"] == 2


def test_modified_artifact_is_rebuilt(tiny_recipe, tmp_path, calls):
    build(tiny_recipe, tmp_path)
    (tmp_path / "build/tiny/import/model.onnx").write_bytes(b"truncated")
    session = build(tiny_recipe, tmp_path)
    assert statuses(session)["import"] == "restored"
    onnx.load(str(tmp_path / "build/tiny/import/model.onnx"))


def test_plan_names_the_changed_recipe_section(tiny_recipe, tmp_path):
    build(tiny_recipe, tmp_path)
    tiny_recipe.write_text(tiny_recipe.read_text().replace("[1, 3, 8, 8]", "[1, 3, 12, 12]"))
    session = api.session_for(tiny_recipe, build_root=tmp_path / "build", cache=tmp_path / "cache")
    plan = {r.stage: r for r in api.plan(session, "import")}
    assert plan["import"].status == "will run"
    assert plan["import"].reason == "recipe section `model` changed"


def test_report_and_lock_record_stage_status_and_artifact_hashes(tiny_recipe, tmp_path):
    build(tiny_recipe, tmp_path)
    report = json.loads((tmp_path / "build/tiny/report.json").read_text())
    lock = json.loads((tmp_path / "build/tiny/recipe.lock").read_text())
    assert report["stages"]["import"]["status"] == "built"
    assert report["stages"]["surgery"]["status"] == "not requested"
    assert report["import"]["inputs"]["x"]["shape"] == [1, 3, 8, 8]
    model = tmp_path / "build/tiny/import/model.onnx"
    assert lock["stages"]["import"]["files"]["model.onnx"] == sha256_file(model)
    assert lock["resolved"]["model"]["inputs"][0]["shape"] == [1, 3, 8, 8]


SLOW_STAGE_SCRIPT = textwrap.dedent("""
    import sys, time
    from npubuild import api
    from npubuild.stages import importer
    real = importer.run
    def slow(ctx):
        out = real(ctx)
        (ctx.out / "model.onnx").write_bytes(b"half-written")
        print("IN-STAGE", flush=True)
        time.sleep(60)
        return out
    importer.run = slow
    session = api.session_for(sys.argv[1], build_root=sys.argv[2], cache=sys.argv[3])
    api.build(session, "import")
""")


def test_build_killed_mid_stage_leaves_nothing_a_later_run_trusts(tiny_recipe, tmp_path):
    args = [str(tiny_recipe), str(tmp_path / "build"), str(tmp_path / "cache")]
    proc = subprocess.Popen([sys.executable, "-c", SLOW_STAGE_SCRIPT, *args], cwd=REPO,
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "IN-STAGE"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (tmp_path / "build/tiny/import").exists()
    session = build(tiny_recipe, tmp_path)
    assert statuses(session)["import"] == "built"
    model = tmp_path / "build/tiny/import/model.onnx"
    onnx.checker.check_model(onnx.load(str(model)))
    manifest = json.loads((tmp_path / "build/tiny/import/manifest.json").read_text())
    assert manifest["files"]["model.onnx"]["sha256"] == sha256_file(model)


def test_two_runs_started_at_once_do_not_corrupt_the_build(tiny_recipe, tmp_path):
    cmd = [sys.executable, "-m", "npubuild", "run", str(tiny_recipe), "import",
           "--build-dir", str(tmp_path / "build"), "--cache", str(tmp_path / "cache")]
    procs = [subprocess.Popen(cmd, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outputs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    report = json.loads((tmp_path / "build/tiny/report.json").read_text())
    assert report["stages"]["import"]["status"] in ("built", "current")
    model = tmp_path / "build/tiny/import/model.onnx"
    manifest = json.loads((tmp_path / "build/tiny/import/manifest.json").read_text())
    assert manifest["files"]["model.onnx"]["sha256"] == sha256_file(model)


def test_second_concurrent_run_fails_clearly_when_it_may_not_wait(tiny_recipe, tmp_path):
    from npubuild.engine.lock import build_lock
    from npubuild.errors import BuildLocked

    session = api.session_for(tiny_recipe, build_root=tmp_path / "build", cache=tmp_path / "cache")
    with build_lock(session.paths.lock_file):
        started = time.monotonic()
        with pytest.raises(BuildLocked, match="another npubuild run .* is writing"):
            api.build(session, "import", wait_seconds=0.3)
        assert time.monotonic() - started < 5


def test_a_current_stage_keeps_the_build_time_of_the_run_that_built_it(tiny_recipe, tmp_path):
    first = build(tiny_recipe, tmp_path, "split")
    built = {s: r.seconds for s, r in first.results.items() if r.status == "built"}
    build(tiny_recipe, tmp_path, "split")
    stages = {s: e for s, e in json.loads(
        (tmp_path / "build" / "tiny" / "report.json").read_text())["stages"].items() if s in built}
    assert len(built) == 4 and {s: e["status"] for s, e in stages.items()} == dict.fromkeys(
        built, "current")
    assert all(e["seconds"] == 0 for e in stages.values())
    assert {s: e["built_seconds"] for s, e in stages.items()} == {
        s: round(v, 3) for s, v in built.items()}
