"""`npubuild view R [stage]`: the stage's ONNX model, opened in Netron when it is installed,
else its path and how to install Netron. npubuild serves Netron's page itself: only the model
(never its siblings), only on 127.0.0.1, only to requests whose Host is its own."""

import http.client
import os
import signal
import subprocess
import sys
import threading

import pytest

from npubuild.model_viewer import netron_page, serve_model
from tests.conftest import REPO

NETRON = netron_page()
needs_netron = pytest.mark.skipif(NETRON is None, reason="Netron's page is not installed here")


def test_without_netron_view_prints_the_model_path_and_how_to_install_it(
        tiny_recipe, tmp_path, monkeypatch, capsys):
    from npubuild import cli

    monkeypatch.setitem(sys.modules, "netron", None)  # find_spec then says: not installed
    code = cli.main(["view", str(tiny_recipe), "split", "--build-dir", str(tmp_path / "b"),
                     "--cache", str(tmp_path / "c")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out == f"{tmp_path / 'b' / 'tiny' / 'split' / 'graph_0.onnx'}\n"
    assert "pip install netron" in err


@pytest.fixture
def served(tmp_path):
    """A stage folder with a model and secrets beside it, served in a background thread."""
    stage = tmp_path / "fusion"
    stage.mkdir()
    (stage / "model.onnx").write_bytes(b"\x08\x07model bytes")
    (stage / "manifest.json").write_text('{"secret": true}')
    (tmp_path / "elsewhere.txt").write_text("secret")
    server = serve_model(stage / "model.onnx", NETRON)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield server
    server.shutdown()
    server.server_close()


def get(server, path, host=None):
    conn = http.client.HTTPConnection("127.0.0.1", server.server_port, timeout=10)
    conn.request("GET", path, headers={"Host": host or f"127.0.0.1:{server.server_port}"})
    response = conn.getresponse()
    return response.status, response.read()


@needs_netron
def test_the_page_opens_the_model_and_the_model_is_served_byte_for_byte(served):
    status, page = get(served, "/")
    assert status == 200 and b'<meta name="file" content="/data/model.onnx">' in page
    assert get(served, "/data/model.onnx") == (200, b"\x08\x07model bytes")
    assert get(served, "/onnx.js")[0] == 200  # Netron's own page files


@needs_netron
@pytest.mark.parametrize("path", ["/data/manifest.json", "/data/../elsewhere.txt",
                                  "/data/%2e%2e/elsewhere.txt", "/data/", "/../fusion/model.onnx",
                                  "/server.py", "/__init__.py"])
def test_nothing_but_the_model_and_the_page_is_served(served, path):
    assert get(served, path)[0] == 404


@needs_netron
@pytest.mark.parametrize("host", ["attacker.example", "attacker.example:{port}", "127.0.0.1",
                                  "localhost.attacker.example:{port}", ""])
def test_a_request_for_a_foreign_host_is_refused(served, host):
    """DNS rebinding: the attacker's page, its name now pointing at 127.0.0.1, sends its Host."""
    status, body = get(served, "/data/model.onnx", host.format(port=served.server_port) or " ")
    assert status == 403 and b"model bytes" not in body


@needs_netron
def test_localhost_by_name_is_answered_and_the_server_listens_on_loopback_only(served):
    assert get(served, "/data/model.onnx", f"localhost:{served.server_port}")[0] == 200
    assert served.server_address[0] == "127.0.0.1"


@needs_netron
def test_view_serves_the_stage_model_until_interrupted(tiny_recipe, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(REPO), "BROWSER": "true"}  # no browser is started
    # Ctrl+C must reach view even where the suite runs with SIGINT ignored (a background job
    # of a non-interactive shell, which every child inherits): view would never see it
    proc = subprocess.Popen([sys.executable, "-m", "npubuild", "view", str(tiny_recipe),
                             "--build-dir", str(tmp_path / "b"), "--cache", str(tmp_path / "c")],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        line = ""
        while "Netron: http://127.0.0.1:" not in line:
            line = proc.stderr.readline()
            assert line, "view ended before serving"
        port = int(line.split("127.0.0.1:")[1].split("/")[0])
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("GET", "/data/model.onnx")
        model = tmp_path / "b" / "tiny" / "fusion" / "model.onnx"
        assert conn.getresponse().read() == model.read_bytes()
    finally:
        proc.send_signal(signal.SIGINT)
        out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0 and out == f"{model}\n"


def test_view_names_the_models_a_stage_has(cli, tiny_recipe, tmp_path):
    result = cli("view", str(tiny_recipe), "quantize", "--graph", "3", "--build-dir",
                 str(tmp_path / "b"), "--cache", str(tmp_path / "c"))
    assert result.returncode == 2
    assert "error: quantize wrote no graph_3.qdq.onnx\n  hint: its models: graph_0.qdq.onnx" in result.stderr
