"""Run a split model (seed 000's AutoRunner): the submodels of ``graph_infos.json`` in order.

Each device has one backend, a callable ``backend(graph, feeds) -> outputs`` taking a
`GraphInfo` and the graph's input tensors by name. The defaults run every submodel's float
ONNX file in ONNX Runtime; the compile stage plugs its simulator in for ``"npu"``:

    Runner("build/yolov8n/split", backends={"npu": simulator}).run({"images": x})
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Mapping

import numpy as np

from npubuild.errors import BuildError, UserError
from npubuild.split import graph_infos


@dataclass(frozen=True)
class GraphInfo:
    """One submodel as ``graph_infos.json`` describes it, with absolute paths."""

    index: int
    device: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    model_path: Path
    context_dir: Path | None

    @property
    def name(self) -> str:
        return f"graph_{self.index}"


Backend = Callable[[GraphInfo, Mapping[str, np.ndarray]], Mapping[str, np.ndarray]]


class OnnxRuntimeBackend:
    """Runs a submodel's ONNX file in ONNX Runtime on the CPU (one cached session per file)."""

    def __init__(self) -> None:
        self._sessions: dict[Path, object] = {}

    def __call__(self, graph: GraphInfo, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        from npubuild import onnx_io

        if graph.model_path not in self._sessions:
            self._sessions[graph.model_path] = onnx_io.session(graph.model_path)
        try:
            return onnx_io.run(self._sessions[graph.model_path], feeds, list(graph.outputs))
        except Exception as exc:  # ONNX Runtime's own exception types
            raise BuildError(f"{graph.name}: ONNX Runtime failed: {exc}") from None


class Runner:
    """Runs the submodels of a split directory in order and returns the model's outputs."""

    def __init__(self, split_dir: str | Path, backends: Mapping[str, Backend] | None = None):
        self.dir = Path(split_dir)
        self.infos = graph_infos.read(self.dir)
        self.graphs = [GraphInfo(i, g["device"], tuple(g["inputs"]), tuple(g["outputs"]),
                                 self.dir / g["model_info"]["model_path"],
                                 self.dir / g["context_dir"] if "context_dir" in g else None)
                       for i, g in enumerate(self.infos["graphs"])]
        self.backends: dict[str, Backend] = {"cpu": OnnxRuntimeBackend(),
                                             "npu": OnnxRuntimeBackend(), **(backends or {})}
        self.inputs = [n for n, t in self.infos["tensors"].items() if t["attr"] == "input"]
        self.outputs = [n for n, t in self.infos["tensors"].items() if t["attr"] == "output"]
        self._last_use = self._last_uses()

    def _last_uses(self) -> dict[str, int]:
        last: dict[str, int] = {}
        for g in self.graphs:
            for t in g.inputs:
                last[t] = g.index
        return last

    def shape(self, name: str) -> list[int]:
        return list(self.infos["tensors"][name]["shape"])

    def run(self, feeds: Mapping[str, np.ndarray], keep_intermediates: bool = False,
            keep: Iterable[str] = ()) -> dict[str, np.ndarray]:
        """The original model's outputs; with ``keep_intermediates``, every tensor between
        submodels too (the quantize stage reads each NPU graph's inputs from it); ``keep``:
        the tensors between submodels to return besides the outputs, every other one let go
        after its last reader (verify's sample run: a 3-D U-Net's twenty segments hand each
        other 128³ activations)."""
        values = self._checked_feeds(feeds)
        keep = list(dict.fromkeys([*self.outputs, *keep]))
        held = set(keep)
        for g in self.graphs:
            got = self.backends[g.device](g, {t: values[t] for t in g.inputs})
            missing = [t for t in g.outputs if t not in got]
            if missing:
                raise BuildError(f"{g.name} ({g.device} backend) returned no {missing[0]!r}")
            values.update({t: np.asarray(got[t]) for t in g.outputs})
            del got
            if not keep_intermediates:
                for t in [t for t in g.inputs if self._last_use[t] == g.index and t not in held]:
                    values.pop(t, None)
        if keep_intermediates:
            return values
        return {name: values[name] for name in keep}

    def _checked_feeds(self, feeds: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
        unknown = sorted(set(feeds) - set(self.inputs))
        missing = [n for n in self.inputs if n not in feeds]
        if unknown or missing:
            raise UserError(f"the split model takes inputs {self.inputs}; "
                            + (f"missing {missing}" if missing else f"unknown {unknown}"))
        values = {}
        for name in self.inputs:
            value = np.asarray(feeds[name])
            want = self.shape(name)
            if not self.infos["dynamic"] and list(value.shape) != want:
                raise UserError(f"input {name!r} has shape {list(value.shape)}, the model "
                                f"expects {want}")
            values[name] = value
        return values
