"""`npubuild view R [STAGE]`: open a stage's ONNX model in Netron (or print its path)."""

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
    import importlib.util

    from npubuild import api

    path = api.model_file(output.session_for(args, args.recipe), args.stage, args.graph)
    if importlib.util.find_spec("netron") is None:
        print(path)
        print("Netron is not installed: `pip install netron` (or npubuild[view]) to open it here, "
              "or open the file above in any ONNX viewer", file=sys.stderr)
        return EXIT_OK
    import netron

    host, port = netron.start(str(path))  # serves the file and opens the browser
    print(path)
    print(f"Netron: http://{host}:{port} (Ctrl+C stops it)", file=sys.stderr)
    netron.wait()
    return EXIT_OK
