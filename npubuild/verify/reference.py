"""The float reference of a deployed output, and how to read one model's tensors from another.

The deployed pipeline's outputs are the surgery-stage model's outputs. Each one is compared
with the *imported* (float original) model's tensor it stands for: the same name, or the tensor
the surgery stage's origins record (renamed, or split into parts and recombined).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
import onnx

from npubuild import onnx_io
from npubuild.surgery import origins


def original_inputs(later: onnx.ModelProto) -> dict[str, str]:
    """Each input of ``later`` (the surgery model) that surgery renamed → its imported name."""
    return dict(origins.read(later, origins.MODEL_KEY).get("inputs", {}))


def original_names(later: onnx.ModelProto) -> dict[str, str]:
    """Each output of ``later`` (the surgery model) → the imported model's tensor it equals."""
    recorded = origins.read(later, origins.MODEL_KEY).get("outputs", {})
    renamed = {spec: old for old, spec in recorded.items() if isinstance(spec, str)}
    return {o.name: renamed.get(o.name, o.name) for o in later.graph.output}


class FloatReference:
    """Runs the imported model on the deployed pipeline's feeds (an input surgery renamed fed
    under its imported name, ``inputs``: deployed → imported) and returns its values under the
    deployed outputs' names."""

    def __init__(self, original: onnx.ModelProto, deployed_outputs: list[str], names: dict[str, str],
                 inputs: Mapping[str, str] | None = None):
        self.inputs = dict(inputs or {})
        known = {n for node in original.graph.node for n in node.output} | \
                {i.name for i in original.graph.input}
        self.names = {out: names.get(out, out) for out in deployed_outputs if names.get(out, out) in known}
        self.missing = [out for out in deployed_outputs if out not in self.names]
        self.session = onnx_io.session(onnx_io.with_outputs(original, list(dict.fromkeys(self.names.values()))))

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        values = onnx_io.run(self.session, {self.inputs.get(k, k): v for k, v in feeds.items()})
        return {out: values[src] for out, src in self.names.items()}
