"""The deployed pipeline as quantization sees it: the split directory's submodels run by the
runtime's ``Runner``, all in float (calibration), or with the NPU submodels replaced by their
integer reference (accuracy)."""

from __future__ import annotations

from functools import cached_property
from pathlib import Path
from typing import Mapping

import numpy as np
import onnx

from npubuild import onnx_io
from npubuild.quant.qgraph import QGraph
from npubuild.quant.reference import dequantize_tensor, quantize_inputs, run_reference


class SubGraph:
    """One submodel (the runner's ``GraphInfo``) with its ONNX model loaded on demand."""

    def __init__(self, info):
        self.info = info
        self.index, self.device = info.index, info.device
        self.inputs, self.outputs = list(info.inputs), list(info.outputs)

    @property
    def is_npu(self) -> bool:
        return self.device == "npu"

    @cached_property
    def model(self) -> onnx.ModelProto:
        return onnx_io.load_model(self.info.model_path)


class SplitPipeline:
    """The submodels of a split directory, in execution order."""

    def __init__(self, split_dir: Path):
        from npubuild.runtime.runner import Runner

        self.split_dir = Path(split_dir)
        self.runner = Runner(self.split_dir)
        self.graphs = [SubGraph(g) for g in self.runner.graphs]

    @property
    def npu_graphs(self) -> list[SubGraph]:
        return [g for g in self.graphs if g.is_npu]

    @property
    def inputs(self) -> list[str]:
        return list(self.runner.inputs)

    @property
    def outputs(self) -> list[str]:
        return list(self.runner.outputs)

    @cached_property
    def source_names(self) -> dict[str, str]:
        """Pipeline inputs surgery renamed → their names in the source model (and the recipe),
        as the split carried them onto the submodels (`npubuild.surgery.origins`)."""
        from npubuild.surgery import origins

        found: dict[str, str] = {}
        for g in self.graphs:
            found.update(origins.read(g.model, origins.MODEL_KEY).get("inputs", {}))
        return {new: old for new, old in found.items() if new in self.inputs}

    def input_values(self) -> list[onnx.ValueInfoProto]:
        """ValueInfos of the pipeline inputs, from the submodels that read them."""
        found = {}
        for g in self.graphs:
            if any(t in self.inputs for t in g.inputs):
                for v in onnx_io.graph_inputs(g.model):
                    found.setdefault(v.name, v)
        return [found[name] for name in self.inputs if name in found]

    def downstream_of_npu(self) -> set[int]:
        """The graphs (indices) that read, directly or through other graphs, a tensor an NPU
        graph computes: in the quantized pipeline their inputs differ from the float one's."""
        tainted: set[str] = set()
        out: set[int] = set()
        for g in self.graphs:  # execution order
            if any(t in tainted for t in g.inputs):
                out.add(g.index)
            if g.is_npu or g.index in out:
                tainted.update(g.outputs)
        return out

    def float_values(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        """Every boundary tensor of the float pipeline."""
        return self.runner.run(dict(feeds), keep_intermediates=True)

    def quantized_runner(self, qgraphs: Mapping[int, QGraph], seen: dict | None = None):
        """The split runner with every NPU submodel run by the integer reference; ``seen``
        (when given) receives, per NPU graph, its float inputs and every integer tensor."""
        from npubuild.runtime.runner import Runner

        def backend(g, feeds):
            qg = qgraphs[g.index]
            env = run_reference(qg, quantize_inputs(qg, feeds))
            if seen is not None:
                seen[g.index] = (dict(feeds), env)
            return {n: dequantize_tensor(qg, n, env[n]) for n in g.outputs}
        # the CPU submodels in the float runner's sessions (one per file, stateless between
        # runs): a build judges on the integer reference several times (int8, int16 everywhere,
        # each measured rounding and equalisation, each confirmation), and opened them anew
        return Runner(self.split_dir, backends={"npu": backend, "cpu": self.runner.backends["cpu"]})

    def quantized_outputs(self, feeds: Mapping[str, np.ndarray],
                          qgraphs: Mapping[int, QGraph]) -> dict[str, np.ndarray]:
        """The pipeline's outputs with every NPU submodel run by the integer reference."""
        return self.quantized_runner(qgraphs).run(dict(feeds))
