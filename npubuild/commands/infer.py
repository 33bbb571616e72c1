"""`npubuild infer R --input ...`: run the deployed pipeline (NPU graphs in the simulator)."""

from __future__ import annotations

import json
from pathlib import Path

from npubuild.commands import output
from npubuild.commands.output import EXIT_OK

NAME = "infer"
HELP = "run the deployed pipeline (NPU graphs in the simulator) on an input"
OPTIONS = {"build_opts": True, "json_opt": True}


def add_arguments(p) -> None:
    p.add_argument("--input", action="append", required=True, metavar="[NAME=]FILE",
                   help="an image (preprocessed as the recipe says), a .npz of inputs by name, or "
                        "a .npy (NAME=FILE gives it to a named input); repeatable")
    p.add_argument("--output", type=Path, help="write the outputs to this .npz")
    p.add_argument("--float", action="store_true",
                   help="run the float submodels (no quantization, no simulator)")


def run(args) -> int:
    import numpy as np

    from npubuild import api

    session = output.session_for(args, args.recipe)
    feeds = api.load_inputs(session, args.input)
    outputs = api.infer(session, feeds, deployed=not args.float)
    if args.output:
        from npubuild.atomic import atomic_path

        with atomic_path(args.output) as tmp:
            with open(tmp, "wb") as fh:
                np.savez(fh, **outputs)
    summary = api.array_summary(outputs)
    if args.json:
        print(json.dumps({"pipeline": "float" if args.float else "deployed", "outputs": summary},
                         indent=2))
    else:
        for k, v in summary.items():
            print(f"{k}: shape {v['shape']} {v['dtype']}  min {v['min']:.4g}  max {v['max']:.4g}  "
                  f"mean {v['mean']:.4g}")
    return EXIT_OK
