"""`npubuild view R [STAGE]`: open a stage's ONNX model in Netron (or print its path), served
by `npubuild.model_viewer` (only that model, only to 127.0.0.1)."""

from __future__ import annotations

import sys

from npubuild.commands import output
from npubuild.commands.output import EXIT_OK

NAME = "view"
HELP = "open a stage's ONNX model in Netron (or print its path)"
OPTIONS = {"build_opts": True}


def add_arguments(p) -> None:
    p.add_argument("stage", nargs="?", default="fusion",
                   choices=["import", "surgery", "fusion", "split", "quantize"],
                   help="whose model (default: fusion, the whole model after rewrites)")
    p.add_argument("--graph", type=int, metavar="N", help="split/quantize: submodel N (default: the first)")


def run(args) -> int:
    import webbrowser

    from npubuild import api
    from npubuild.model_viewer import HOST, netron_page, serve_model

    path = api.model_file(output.session_for(args, args.recipe), args.stage, args.graph)
    page = netron_page()
    if page is None:
        print(path)
        print("Netron is not installed: `pip install netron` (or npubuild[view]) to open it here, "
              "or open the file above in any ONNX viewer", file=sys.stderr)
        return EXIT_OK
    server = serve_model(path, page)
    url = f"http://{HOST}:{server.server_port}/"
    print(path)
    print(f"Netron: {url} (only this model is served; Ctrl+C stops it)", file=sys.stderr)
    webbrowser.open(url)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.server_close()
    return EXIT_OK
