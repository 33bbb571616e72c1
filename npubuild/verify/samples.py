"""One verify sample through the three pipelines the verify stage compares.

For each sample: the float original (the imported model, under the deployed outputs' names),
the deployed pipeline (CPU submodels in ONNX Runtime, NPU submodels in the simulator) and the
float pipeline (every submodel in ONNX Runtime). Only the tensors the verdict reads are kept
(model outputs and NPU hand-over tensors), so a sample's result is small enough to send back
from a Dask worker. The same `SampleRun` serves the verify stage in one process and on every
worker, which is why a fanned-out verify writes the same bytes.
"""

from __future__ import annotations

from pathlib import Path
from typing import Mapping

import numpy as np

Values = dict[str, np.ndarray]
# (float original, deployed, float pipeline) of one sample
Observed = tuple[Values, Values, Values]
STAGES = ("import", "surgery", "split", "compile")


def npu_handovers(pipeline) -> list[str]:
    """Tensors an NPU submodel hands to the CPU (or to the model's caller): what the NPU
    itself produces, checked even when a float CPU decode follows it."""
    return [t for g in pipeline.npu_graphs for t in g.outputs if t not in pipeline.outputs]


def npu_selections(pipeline) -> dict[str, list[str]]:
    """Model outputs a CPU submodel selects from NPU hand-over tensors by an index it chose
    (`npubuild.split.selection`): judged on those tensors."""
    from npubuild.split.selection import selected_outputs

    return selected_outputs([g.model.graph for g in pipeline.graphs if not g.is_npu],
                            pipeline.outputs, npu_handovers(pipeline))


class SampleRun:
    """The three pipelines of a build's ``import``, ``surgery``, ``split`` and ``compile``
    artifacts (``dirs``: stage → its directory), ready to run sample after sample."""

    def __init__(self, dirs: Mapping[str, Path]):
        from npubuild import onnx_io
        from npubuild.quant.pipeline import SplitPipeline
        from npubuild.runtime import Runner
        from npubuild.backends import npu_runner
        from npubuild.verify.reference import FloatReference, original_inputs, original_names

        self.pipeline = SplitPipeline(dirs["split"])
        self.deployed = Runner(dirs["split"], backends={"npu": npu_runner(dirs["compile"])})
        original = onnx_io.load_model(dirs["import"] / "model.onnx")
        surgery = onnx_io.load_model(dirs["surgery"] / "model.onnx")
        self.reference = FloatReference(original, self.pipeline.outputs, original_names(surgery),
                                        original_inputs(surgery))
        self.kept = set(self.pipeline.outputs) | set(npu_handovers(self.pipeline))

    def __call__(self, feeds: Mapping[str, np.ndarray]) -> Observed:
        # each run holds the tensors kept and lets go of the others after their last reader
        kept = sorted(self.kept)
        got = self.deployed.run(feeds, keep=kept)
        ref = self.reference(feeds)
        flt = self.pipeline.runner.run(feeds, keep=kept)
        return ref, self._kept(got), self._kept(flt)

    def _kept(self, values: Values) -> Values:
        return {name: value for name, value in values.items() if name in self.kept}
