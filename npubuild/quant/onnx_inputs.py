"""The pipeline's inputs as the data loader needs them: names, shapes and dtypes from the
submodels, layout and preprocessing from the recipe's ``model.inputs`` (matched through the
renames surgery recorded: `npubuild.model_inputs`), and a streaming model's states (the initial
values import recorded, stepped by the float pipeline: `npubuild.quant.data.State`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Sequence

import numpy as np

from npubuild import onnx_io
from npubuild.errors import BuildError
from npubuild.model_inputs import RecipeInputs
from npubuild.quant.data import InputInfo, State


def input_infos(pipeline, specs: Sequence, import_dir: Path | None = None) -> list[InputInfo]:
    """Every pipeline input; with ``import_dir`` (the import stage's folder), each state input
    of a streaming model (`recorded_states`) carries its `State`, stepped by the float
    pipeline, so the data need not hold it."""
    inputs = RecipeInputs(specs, pipeline.source_names)
    states = recorded_states(import_dir)
    step = (lambda sample: pipeline.runner.run(dict(sample))) if states else None
    infos = []
    for value in pipeline.input_values():
        spec = inputs.spec(value.name)
        shape = list(spec.shape) if spec is not None and spec.shape else onnx_io.value_shape(value)
        if any(not isinstance(d, int) or d <= 0 for d in shape):
            raise BuildError(f"input {value.name!r} has no fixed shape ({shape})", stage="quantize",
                             hint="fix it with model.inputs[].shape in the recipe")
        source = inputs.source_name(value.name)
        recorded = states.get(source)
        state = None
        if recorded is not None and recorded["initial"] is not None:
            output = recorded["output"] if recorded["output"] in pipeline.outputs else None
            state = State(recorded["initial"], output, step)
        infos.append(InputInfo(value.name, tuple(shape), str(onnx_io.value_dtype(value)),
                               spec.layout if spec is not None else "any",
                               spec.preprocess if spec is not None else None,
                               source=source, state=state))
    return infos


def recorded_states(import_dir: Path | None) -> dict[str, dict]:
    """The states import recorded in ``import.json`` (``proof.variables_as_io.states``: by
    input name, its ``output``, ``shape`` and ``initial`` value: a number for a state that
    starts uniform, else nested lists); empty without them."""
    path = Path(import_dir) / "import.json" if import_dir is not None else None
    if path is None or not path.is_file():
        return {}
    proof = json.loads(path.read_text()).get("proof", {})
    states = proof.get("variables_as_io", {}).get("states", {})
    return {name: {**state, "initial": None if state.get("initial") is None else
                   np.broadcast_to(np.asarray(state["initial"]), state["shape"])}
            for name, state in states.items()}
