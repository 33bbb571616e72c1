"""``graph_infos.json``: AutoSplit's description of a split model (seed 000), NPU for TPU.

    {"graphs": [{"inputs": [...], "outputs": [...], "device": "npu" | "cpu",
                 "model_info": {"model_path": "graph_0.onnx"}, "context_dir": "graph_ir_0"}],
     "tensors": {"name": {"shape": [1, 3, 320, 320], "attr": "input" | "output" | "intermediate"}},
     "graph_num": 1, "platform": "onnx", "dynamic": false, "layout": "NCHW"}

Every write and every read is validated against ``schemas/graph_infos.schema.json``, plus what
a schema cannot say (graph_num, tensors listed, each graph's inputs produced before it runs).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from npubuild.atomic import write_json
from npubuild.errors import BuildError, UserError

FILE_NAME = "graph_infos.json"


def build(graphs: list[tuple[str, list[str], list[str]]], shapes: dict[str, list[int]],
          model_inputs: list[str], model_outputs: list[str], layout: str = "NCHW") -> dict:
    """``graphs`` is ``(device, inputs, outputs)`` per submodel, in run order."""
    entries = []
    for i, (device, inputs, outputs) in enumerate(graphs):
        entry: dict[str, Any] = {"inputs": inputs, "outputs": outputs, "device": device,
                                 "model_info": {"model_path": f"graph_{i}.onnx"}}
        if device == "npu":
            entry["context_dir"] = f"graph_ir_{i}"
        entries.append(entry)
    # the model's outputs last and in its order (the order a reader lists them in, `Runner`'s
    # outputs: verify's "first model output"), not the order the segments produce them
    last = set(model_outputs) - set(model_inputs)
    names = dict.fromkeys([*model_inputs, *(t for _, ins, outs in graphs for t in (*ins, *outs)
                                            if t not in last), *model_outputs])
    tensors = {name: {"shape": [int(d) for d in shapes[name]],
                      "attr": "input" if name in model_inputs else
                      "output" if name in model_outputs else "intermediate"}
               for name in names}
    return {"graphs": entries, "tensors": tensors, "graph_num": len(entries),
            "platform": "onnx", "dynamic": False, "layout": layout}


def problems(data: Any) -> list[str]:
    """Everything wrong with a graph_infos document (empty when it is valid)."""
    import jsonschema

    from npubuild.schemas import load

    validator = jsonschema.Draft202012Validator(load("graph_infos"))
    # the deepest first: a bad device beats the if/then/else about context_dir around it
    errors = sorted(validator.iter_errors(data), key=lambda e: -len(e.absolute_path))
    if errors:
        return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}" for e in errors]
    out = []
    if data["graph_num"] != len(data["graphs"]):
        out.append(f"graph_num is {data['graph_num']} but there are {len(data['graphs'])} graphs")
    ready = {n for n, t in data["tensors"].items() if t["attr"] == "input"}
    for i, g in enumerate(data["graphs"]):
        out += [f"graphs/{i}: {t!r} is not listed in tensors" for t in g["inputs"] + g["outputs"]
                if t not in data["tensors"]]
        out += [f"graphs/{i}: input {t!r} is produced by no earlier graph" for t in g["inputs"]
                if t not in ready]
        ready.update(g["outputs"])
    out += [f"tensors: output {n!r} is produced by no graph" for n, t in data["tensors"].items()
            if t["attr"] == "output" and n not in ready]
    return out


def write(path: str | Path, data: dict) -> Path:
    """Validate, then write atomically; an invalid document is a bug in the split stage."""
    found = problems(data)
    if found:
        raise BuildError(f"refusing to write an invalid {FILE_NAME}: {found[0]}", stage="split")
    return write_json(path, data)


def read(path: str | Path) -> dict:
    """Load and validate a graph_infos.json (a bad file is the user's input: UserError)."""
    path = Path(path)
    if path.is_dir():
        path = path / FILE_NAME
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} not found", hint="run the split stage first") from None
    except json.JSONDecodeError as exc:
        raise UserError(f"{path} is not JSON: {exc}") from None
    found = problems(data)
    if found:
        raise UserError(f"{path} is not a valid {FILE_NAME}: {found[0]}")
    return data
