"""A worker in a toolchain's environment: only files cross, its bin leads PATH, and a vendor
failure is one message with the vendor's own line and suggestion."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from npubuild.errors import BuildError
from npubuild.toolchains import Toolchain
from npubuild.toolchains.env import Env
from npubuild.toolchains.process import (
    Worker,
    environment,
    run_worker,
    suggestion,
    vendor_line,
)

CHAIN = Toolchain(name="fake", package="six", version="1", python="current", steps=(),
                  identity=("six",))
ENV = Env(CHAIN, Path(sys.executable), {"six": "1"})
PROTOCOL = Path(__file__).parents[3] / "npubuild" / "toolchains" / "workers"


def worker_script(tmp_path, body: str) -> str:
    path = tmp_path / "w.py"
    path.write_text(f"import sys; sys.path.insert(0, {str(PROTOCOL)!r})\n"
                    "from _protocol import main\n" + body)
    return str(path)


def test_the_worker_reads_its_job_and_writes_its_result(tmp_path):
    script = worker_script(tmp_path, "import os\n"
                           "def build(spec):\n"
                           "    open('out.txt', 'w').write(spec['text'] * 2)\n"
                           "    return {'path': os.environ['PATH'].split(':')[0]}\n"
                           "main(build)\n")
    result = run_worker(ENV, script, {"text": "ab"}, tmp_path / "work", stage="compile", graph="g")
    assert (tmp_path / "work" / "out.txt").read_text() == "abab"
    assert result["path"] == str(Path(sys.executable).parent)  # the toolchain's bin leads PATH


def test_a_vendor_failure_names_the_stage_the_graph_and_the_vendors_line(tmp_path):
    script = worker_script(tmp_path, "def build(spec):\n"
                           "    print('I loading', flush=True)\n"
                           "    print('E build: Conv kernel 33 > 31! Please try to set kernel <= 31', flush=True)\n"
                           "    raise ValueError('Traceback noise')\n"
                           "main(build)\n")
    with pytest.raises(BuildError) as caught:
        run_worker(ENV, script, {}, tmp_path / "w", stage="compile", graph="graph_1",
                   patterns=(r"^E [a-z_]+:.*$",))
    message = str(caught.value)
    assert message.startswith("compile: graph_1: fake failed: E build: Conv kernel 33 > 31!")
    assert "fake suggests: Please try to set kernel <= 31" in message
    assert "Traceback" not in message.split("hint")[0]


def test_a_long_lived_worker_answers_request_after_request(tmp_path):
    script = worker_script(tmp_path, "import json\n"
                           "def serve(spec):\n"
                           "    def run(inputs, outputs):\n"
                           "        open(outputs, 'w').write(open(inputs).read().upper())\n"
                           "    return run\n"
                           "main(lambda spec: {}, serve)\n")
    worker = Worker(ENV, script, {}, tmp_path / "w", stage="verify", graph="g")
    try:
        for text in ("a", "b"):
            (tmp_path / "in.txt").write_text(text)
            worker(tmp_path / "in.txt", tmp_path / "out.txt")
            assert (tmp_path / "out.txt").read_text() == text.upper()
    finally:
        worker.close()


def test_the_workers_environment_has_no_npubuild_paths_and_no_proxy(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", "/somewhere/npubuild")
    monkeypatch.setenv("NPUBUILD_CACHE", "/x")
    env = environment(ENV)
    assert "PYTHONPATH" not in env and "NPUBUILD_CACHE" not in env
    assert env["https_proxy"].startswith("http://127.0.0.1:") and env["HF_HUB_OFFLINE"] == "1"


def test_vendor_lines_and_suggestions_are_found_in_their_logs():
    log = "I ok\nW careful\nE load_onnx: Model file x.onnx not exists!\n"
    assert vendor_line(log, (r"^E [a-z_]+:.*$",)) == "E load_onnx: Model file x.onnx not exists!"
    assert vendor_line(log, (r"^Error: .*$",)) is None
    assert suggestion("E x\nYou can set disable_rules=['fuse_pad_into_conv'] to skip it") == \
        "You can set disable_rules=['fuse_pad_into_conv'] to skip it"


def test_the_advice_nearest_the_failure_is_the_one_shown():
    log = ("W you can try changing config.optimization_level to 2.\n"
           "W You can add disable_rules=['fuse_pad_into_conv'] in rknn.config() to temporarily "
           "disable the error rule!\nE build: Traceback (most recent call last):\n"
           "ValueError: assignment destination is read-only\n")
    from npubuild.backends.rknn import ERROR_PATTERNS

    assert suggestion(log).startswith("You can add disable_rules=['fuse_pad_into_conv']")
    assert vendor_line(log, ERROR_PATTERNS) == "ValueError: assignment destination is read-only"


def test_a_worker_ends_when_npubuild_is_killed(tmp_path):
    import os
    import signal
    import subprocess
    import time

    script = worker_script(tmp_path, "import time\n"
                           "def build(spec):\n"
                           "    time.sleep(60)\n"
                           "    return {}\n"
                           "main(build)\n")
    driver = tmp_path / "driver.py"
    driver.write_text(
        "import sys, json\n"
        f"sys.path.insert(0, {str(Path(__file__).parents[3])!r})\n"
        "from pathlib import Path\n"
        "from npubuild.toolchains import Toolchain\n"
        "from npubuild.toolchains.env import Env\n"
        "from npubuild.toolchains.process import run_worker\n"
        "env = Env(Toolchain('fake', 'six', '1', 'current', (), ('six',)), Path(sys.executable), {})\n"
        f"run_worker(env, {script!r}, {{}}, Path({str(tmp_path / 'w')!r}), stage='s', graph='g')\n")
    parent = subprocess.Popen([sys.executable, str(driver)])
    for _ in range(100):  # the worker has started when its job is written
        if (tmp_path / "w" / "job.json").exists():
            break
        time.sleep(0.1)
    time.sleep(1)
    children = subprocess.run(["pgrep", "-P", str(parent.pid)], capture_output=True, text=True).stdout.split()
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    time.sleep(1)
    alive = [pid for pid in children if os.path.exists(f"/proc/{pid}")
             and "zombie" not in open(f"/proc/{pid}/status").read().lower()]
    assert children and not alive
