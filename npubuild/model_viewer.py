"""Netron's web page and one ONNX model, served on 127.0.0.1 by the standard library's HTTP
server (`npubuild view`).

Netron's own server (``netron.start(path)``) answers ``/data/<any name>`` from the model's whole
folder (manifest, calibration tensors, every sibling) and any ``Host`` header, so a web page that
rebinds its DNS name to 127.0.0.1 can read them. This server is bound to 127.0.0.1 on a free
port, answers only requests whose ``Host`` is ``127.0.0.1:<port>`` or ``localhost:<port>``
(anything else: 403), with the one model, read once, as the only data, and otherwise only the
files of Netron's own page. (Its own module: `http.server` is too slow an import for the start
of every command.)
"""

from __future__ import annotations

import html
import importlib.util
import logging
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import unquote

HOST = "127.0.0.1"
PAGE_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript", ".css": "text/css",
              ".json": "application/json", ".png": "image/png", ".ico": "image/x-icon",
              ".svg": "image/svg+xml", ".woff": "font/woff", ".woff2": "font/woff2",
              ".ttf": "font/ttf", ".otf": "font/otf"}

log = logging.getLogger("npubuild")


def netron_page() -> Path | None:
    """The folder of Netron's web page (the installed package's), or None without Netron; the
    package is found, not imported."""
    spec = importlib.util.find_spec("netron")
    locations = list(spec.submodule_search_locations or []) if spec else []
    return Path(locations[0]) if locations and (Path(locations[0]) / "index.html").is_file() else None


def serve_model(model: Path, page: Path, port: int = 0) -> ThreadingHTTPServer:
    """A server (not yet serving: call ``serve_forever``) for ``model`` in Netron's ``page``."""
    from npubuild.engine.hashing import open_regular

    with open(open_regular(model), "rb") as fh:
        data = fh.read()
    files = {p.name: p for p in page.iterdir()
             if p.is_file() and not p.is_symlink() and p.suffix in PAGE_TYPES}
    server = ThreadingHTTPServer((HOST, port), ModelRequest)
    server.daemon_threads = True
    server.model_name, server.model_data, server.page_files = model.name, data, files
    server.index = _index(files["index.html"].read_text(encoding="utf-8"), model.name)
    return server


def _index(text: str, name: str) -> bytes:
    """Netron's page told which file to open, as Netron's own server tells it (meta tags)."""
    quoted = html.escape(name, quote=True)
    meta = (f'<meta name="type" content="Python">\n<meta name="file" content="/data/{quoted}">\n'
            f'<meta name="identifier" content="{quoted}">\n<meta name="name" content="{quoted}">')
    version = re.search(r'<meta name="version" content="[^"]*">', text)
    if version:
        text = text[:version.end()] + "\n" + meta + text[version.end():]
    else:
        text = text.replace("</head>", meta + "\n</head>", 1)
    return text.encode("utf-8")


class ModelRequest(BaseHTTPRequestHandler):
    """GET/HEAD only: the page, its files, and the one model; refused for a foreign Host."""

    server: ThreadingHTTPServer
    protocol_version = "HTTP/1.1"

    def do_HEAD(self) -> None:  # noqa: N802 - http.server's naming
        self.do_GET()

    def do_GET(self) -> None:  # noqa: N802
        if not self._host_is_ours():
            return self._send(403, "text/plain", b"forbidden: unexpected Host header\n")
        path = unquote(self.path.split("?", 1)[0].split("#", 1)[0])
        if path in ("/", "/index.html"):
            return self._send(200, PAGE_TYPES[".html"], self.server.index)
        if path == f"/data/{self.server.model_name}":
            return self._send(200, "application/octet-stream", self.server.model_data)
        found = self.server.page_files.get(path[1:]) if path.count("/") == 1 else None
        if found is None or path == "/index.html":
            return self._send(404, "text/plain", b"not found\n")
        self._send(200, PAGE_TYPES[found.suffix], found.read_bytes())

    def _host_is_ours(self) -> bool:
        """DNS rebinding sends the attacker's name as Host: only our own names are answered."""
        port = self.server.server_port
        return self.headers.get("Host", "") in (f"{HOST}:{port}", f"localhost:{port}")

    def _send(self, status: int, content_type: str, body: bytes) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-Content-Type-Options", "nosniff")
        self.send_header("Cache-Control", "no-store")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 - http.server's signature
        log.debug("view: " + format, *args)
