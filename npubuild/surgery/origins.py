"""Where a rewritten model's outputs and inputs came from, so the proof can compare them.

A rewrite that renames, splits or reshapes graph outputs (or renames inputs) records it in the
model's ``metadata_props`` under ``STEP_KEY`` as JSON::

    {"outputs": {"<old output>": SPEC}, "inputs": {"<new input>": "<old input>"}}

where SPEC is a tensor name of the new model, or ``{"parts": [SPEC, ...], "axis": k,
"shape": [...]}``: the old output is the parts concatenated on ``axis`` (after nothing when
``axis`` is null) and reshaped to ``shape``. The surgery stage reads and removes the step's
entry, and stores the composition of all steps under ``MODEL_KEY`` in the final model, so later
stages can rebuild the imported model's outputs from the rewritten model's.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Union

import lazy_loader as lazy

np = lazy.load("numpy")
onnx = lazy.load("onnx")

STEP_KEY = "npubuild.surgery.step_origins"
MODEL_KEY = "npubuild.surgery.origins"

Spec = Union[str, dict]


def parts(names: list[Spec], axis: int | None, shape: list[int] | None) -> dict:
    return {"parts": list(names), "axis": axis, "shape": None if shape is None else list(shape)}


def read(model: onnx.ModelProto, key: str = STEP_KEY) -> dict[str, Any]:
    for prop in model.metadata_props:
        if prop.key == key:
            return json.loads(prop.value)
    return {"outputs": {}, "inputs": {}}


def write(model: onnx.ModelProto, origins: Mapping[str, Any], key: str = STEP_KEY) -> None:
    """Record origins (merging with what the model already holds under ``key``)."""
    merged = read(model, key)
    merged["outputs"].update(origins.get("outputs", {}))
    merged["inputs"].update(origins.get("inputs", {}))
    pop(model, key)
    model.metadata_props.add(key=key, value=json.dumps(merged))


def pop(model: onnx.ModelProto, key: str = STEP_KEY) -> dict[str, Any]:
    found = read(model, key)
    keep = [p for p in model.metadata_props if p.key != key]
    model.ClearField("metadata_props")
    model.metadata_props.extend(keep)
    return found


def leaves(spec: Spec) -> list[str]:
    if isinstance(spec, str):
        return [spec]
    return [name for part in spec["parts"] for name in leaves(part)]


def rebuild(spec: Spec, values: Mapping[str, np.ndarray]) -> np.ndarray:
    """The old output's value from the new model's values."""
    if isinstance(spec, str):
        return values[spec]
    arrays = [rebuild(p, values) for p in spec["parts"]]
    joined = arrays[0] if spec["axis"] is None else np.concatenate(arrays, axis=spec["axis"])
    return joined if spec["shape"] is None else joined.reshape(spec["shape"])


def compose(earlier: dict[str, Any], later: dict[str, Any]) -> dict[str, Any]:
    """Origins relative to the first model, given those of two consecutive steps."""
    def substitute(spec: Spec) -> Spec:
        if isinstance(spec, str):
            return later["outputs"].get(spec, spec)
        return {**spec, "parts": [substitute(p) for p in spec["parts"]]}

    outputs = {old: substitute(spec) for old, spec in earlier["outputs"].items()}
    for old, spec in later["outputs"].items():
        if old not in _all_leaves(earlier) and old not in outputs:
            outputs[old] = spec
    inputs = {new: earlier["inputs"].get(old, old) for new, old in later["inputs"].items()}
    for new, old in earlier["inputs"].items():
        if new not in later["inputs"].values():
            inputs.setdefault(new, old)
    return {"outputs": outputs, "inputs": inputs}


def _all_leaves(origins: dict[str, Any]) -> set[str]:
    return {name for spec in origins["outputs"].values() for name in leaves(spec)}
