"""The recipe schema in a real editor: the YAML language server (npm `yaml-language-server`,
which VS Code's YAML extension runs) driven over LSP on stdio, reading schemas/recipe.schema.json
through the recipes' `# yaml-language-server: $schema=` line.

`.ci/run` installs the server into .ci/node/; elsewhere set NPUBUILD_YAML_LS to its
executable or put it on PATH. Without node or the server these tests skip, saying why.
"""

from __future__ import annotations

import json
import os
import queue
import shutil
import subprocess
import threading
from pathlib import Path

import pytest

from npubuild.schemas import schema_text
from tests.conftest import REPO

LOCAL_SERVER = REPO / ".ci" / "node" / "node_modules" / ".bin" / "yaml-language-server"
MODELINE = "# yaml-language-server: $schema=../schemas/recipe.schema.json\n"
HEAD = MODELINE + "version: 1\nname: editor\nmodel: {path: m.onnx}\n"


def server_command() -> list[str]:
    if shutil.which("node") is None:
        pytest.skip("node is not installed (the YAML language server runs on node)")
    for candidate in (os.environ.get("NPUBUILD_YAML_LS"), str(LOCAL_SERVER),
                      shutil.which("yaml-language-server")):
        if candidate and Path(candidate).is_file():
            return [candidate, "--stdio"]
    pytest.skip("yaml-language-server is not installed: `npm install --prefix .ci/node "
                "yaml-language-server` (as .ci/run does)")


class LanguageServer:
    """A minimal LSP client: requests with ids, notifications, published diagnostics."""

    def __init__(self, command: list[str]):
        self.proc = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL)
        self.messages: queue.Queue = queue.Queue()
        self.diagnostics: dict[str, queue.Queue] = {}
        self.next_id = 0
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        stream = self.proc.stdout
        while True:
            headers = {}
            while (line := stream.readline().decode()) not in ("\r\n", ""):
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            if not headers:
                return
            message = json.loads(stream.read(int(headers["content-length"])))
            if message.get("method") == "textDocument/publishDiagnostics":
                params = message["params"]
                self.diagnostics.setdefault(params["uri"], queue.Queue()).put(params["diagnostics"])
            elif "method" in message and "id" in message:  # a request from the server
                result = [SETTINGS["yaml"]] if message["method"] == "workspace/configuration" else None
                self._send({"jsonrpc": "2.0", "id": message["id"], "result": result})
            else:
                self.messages.put(message)

    def _send(self, message: dict) -> None:
        body = json.dumps(message).encode()
        self.proc.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)
        self.proc.stdin.flush()

    def notify(self, method: str, params: dict) -> None:
        self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def request(self, method: str, params: dict, timeout: float = 60) -> dict:
        self.next_id += 1
        self._send({"jsonrpc": "2.0", "id": self.next_id, "method": method, "params": params})
        while True:
            message = self.messages.get(timeout=timeout)
            if message.get("id") == self.next_id:
                return message.get("result")

    def open(self, path: Path, text: str) -> str:
        uri = path.resolve().as_uri()
        self.diagnostics.setdefault(uri, queue.Queue())
        self.notify("textDocument/didOpen", {"textDocument": {
            "uri": uri, "languageId": "yaml", "version": 1, "text": text}})
        return uri

    def diagnostics_of(self, uri: str, timeout: float = 60) -> list[dict]:
        """The diagnostics the server publishes for ``uri`` once it has read the schema (it
        validates again when the schema arrives; a hover request waits for that load)."""
        self.request("textDocument/hover", {"textDocument": {"uri": uri},
                                            "position": {"line": 1, "character": 1}})
        found = self.diagnostics[uri].get(timeout=timeout)
        while not self.diagnostics[uri].empty():
            found = self.diagnostics[uri].get()
        return found

    def close(self) -> None:
        self.proc.kill()
        self.proc.wait()


SETTINGS = {"yaml": {"validate": True, "completion": True, "hover": True, "format": {"enable": False},
                     "schemaStore": {"enable": False}, "schemas": {}}}


@pytest.fixture(scope="module")
def server():
    command = server_command()
    assert (REPO / "schemas" / "recipe.schema.json").read_text() == schema_text("recipe")
    ls = LanguageServer(command)
    ls.request("initialize", {"processId": os.getpid(), "rootUri": REPO.as_uri(),
                              "capabilities": {"workspace": {"configuration": True}}})
    ls.notify("initialized", {})
    ls.notify("workspace/didChangeConfiguration", {"settings": SETTINGS})
    yield ls
    ls.close()


def document(server, text: str, name: str) -> str:
    """An unsaved editor buffer in recipes/ (the modeline's relative path resolves there)."""
    return server.open(REPO / "recipes" / f".editor-{name}.yaml", text)


def messages(diagnostics: list[dict]) -> list[str]:
    return [d["message"] for d in diagnostics]


@pytest.mark.parametrize("recipe", sorted((REPO / "recipes").glob("*.yaml")), ids=lambda p: p.name)
def test_the_example_recipes_have_no_problems_in_the_editor(server, recipe):
    uri = server.open(recipe, recipe.read_text())
    assert messages(server.diagnostics_of(uri)) == []


def test_an_unknown_chip_name_is_flagged_and_a_chip_file_is_not(server):
    bad = document(server, HEAD + "target: npu-17m\n", "chip")
    assert any("npu-16m" in m for m in messages(server.diagnostics_of(bad)))
    good = document(server, HEAD + "target: chips/my-chip.yaml\n", "chip-file")
    assert messages(server.diagnostics_of(good)) == []


def test_an_unknown_fusion_rule_is_flagged(server):
    uri = document(server, HEAD + "fusion: [conv_silu, conv_sillu]\n", "fusion")
    found = messages(server.diagnostics_of(uri))
    assert len(found) == 1 and "conv_silu" in found[0]


def test_an_unknown_surgery_step_is_reported_as_unknown(server):
    uri = document(server, HEAD + "surgery:\n  - fold_constantz: {}\n", "step")
    found = messages(server.diagnostics_of(uri))
    assert found and all("Missing property" not in m for m in found)
    assert any("fold_constantz" in m and "not allowed" in m for m in found)


def test_each_surgery_step_is_offered_once(server):
    text = HEAD + "surgery:\n  - \n"
    uri = document(server, text, "complete")
    server.diagnostics_of(uri)
    result = server.request("textDocument/completion", {
        "textDocument": {"uri": uri}, "position": {"line": text.count("\n") - 1, "character": 4}})
    items = result["items"] if isinstance(result, dict) else result
    labels = [item["label"] for item in items]
    steps = json.loads(schema_text("recipe"))["properties"]["surgery"]["items"]["properties"]
    assert sorted(labels) == sorted(steps)


def test_sections_are_described_when_hovered(server):
    text = HEAD + "quantization:\n  scheme: symmetric\n"
    uri = document(server, text, "hover")
    hover = server.request("textDocument/hover", {"textDocument": {"uri": uri},
                                                  "position": {"line": 4, "character": 3}})
    assert "int8" in json.dumps(hover)
