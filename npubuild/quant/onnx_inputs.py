"""The pipeline's inputs as the data loader needs them: names, shapes and dtypes from the
submodels, layout and preprocessing from the recipe's ``model.inputs`` (matched through the
renames surgery recorded: `npubuild.model_inputs`)."""

from __future__ import annotations

from typing import Sequence

from npubuild import onnx_io
from npubuild.errors import BuildError
from npubuild.model_inputs import RecipeInputs
from npubuild.quant.data import InputInfo


def input_infos(pipeline, specs: Sequence) -> list[InputInfo]:
    inputs = RecipeInputs(specs, pipeline.source_names)
    infos = []
    for value in pipeline.input_values():
        spec = inputs.spec(value.name)
        shape = list(spec.shape) if spec is not None and spec.shape else onnx_io.value_shape(value)
        if any(not isinstance(d, int) or d <= 0 for d in shape):
            raise BuildError(f"input {value.name!r} has no fixed shape ({shape})", stage="quantize",
                             hint="fix it with model.inputs[].shape in the recipe")
        infos.append(InputInfo(value.name, tuple(shape), str(onnx_io.value_dtype(value)),
                               spec.layout if spec is not None else "any",
                               spec.preprocess if spec is not None else None,
                               source=inputs.source_name(value.name)))
    return infos
