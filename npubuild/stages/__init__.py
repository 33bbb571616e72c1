"""The pipeline, written in exactly one place.

Each stage is a pure function ``run(ctx: StageContext) -> dict`` from its input artifacts (the
directories of the stages it ``needs``), its own recipe sections and (maybe) the chip, to the
files it writes into ``ctx.out`` plus a report fragment merged into ``report.json``. The build
engine derives each stage's cache key from exactly what it declares here.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterable, Iterator, TypeVar

if TYPE_CHECKING:
    from npubuild.engine.fetch import StageArtifacts
    from npubuild.recipe import LoadedRecipe
    from npubuild.targets.model import Chip

T = TypeVar("T")


def no_progress(items: Iterable[T], total: int | None = None, description: str = "") -> Iterator[T]:
    yield from items


@dataclass
class StageContext:
    """Everything a stage may read, and the one directory it may write."""

    loaded: "LoadedRecipe"
    chip: "Chip | None"
    upstream: dict[str, Path]
    out: Path
    progress: Callable[..., Iterator[Any]] = no_progress
    log: logging.Logger = field(default_factory=lambda: logging.getLogger("npubuild"))
    # Fan-out (``--scheduler``): where Dask runs sample batches, and the upstream stages by
    # content key, which workers fetch through the cache instead of reading ``upstream``.
    scheduler: str | None = None
    sources: dict[str, "StageArtifacts"] = field(default_factory=dict)
    # Where a failing external tool's logs are kept (``build/<name>/logs``): a failed stage's
    # own directory is discarded, and its scratch folders are removed whatever happens.
    logs: Path | None = None

    @property
    def recipe(self):
        return self.loaded.recipe


@dataclass(frozen=True)
class Stage:
    """A pipeline stage: what its key depends on and where its code lives."""

    name: str
    sections: tuple[str, ...]
    needs: tuple[str, ...] = ()
    uses_chip: bool = False
    uses_toolchain: bool = False
    entry: str | None = None
    file_inputs: str | None = None
    description: str = ""

    @property
    def implemented(self) -> bool:
        return self.entry is not None

    def function(self) -> Callable[[StageContext], dict]:
        return _resolve(self.entry)

    def external_files(self, loaded: "LoadedRecipe") -> list[Path]:
        """Files outside the build that this stage reads (model, data): part of its key."""
        return _resolve(self.file_inputs)(loaded) if self.file_inputs else []


def _resolve(entry: str | None) -> Callable:
    module, _, attr = (entry or "").partition(":")
    return getattr(import_module(module), attr)


PIPELINE: tuple[Stage, ...] = (
    Stage("import", ("model",), entry="npubuild.stages.importer:run",
          file_inputs="npubuild.stages.files:import_files",
          description="source model -> import/model.onnx (shapes fixed, checked)"),
    Stage("surgery", ("surgery", "model.inputs"), needs=("import",),
          entry="npubuild.stages.surgery:run",
          description="recipe rewrites, each proven numerically"),
    Stage("fusion", ("fusion",), needs=("surgery",), entry="npubuild.stages.fusion:run",
          description="fused ops as npubuild.fused functions"),
    Stage("split", ("split",), needs=("fusion",), uses_chip=True, entry="npubuild.stages.split:run",
          description="NPU/CPU submodels + graph_infos.json"),
    Stage("quantize", ("quantization", "model.inputs", "verify"), needs=("split", "import", "surgery"),
          uses_chip=True, entry="npubuild.stages.quantize:run",
          file_inputs="npubuild.stages.files:quantize_files",
          description="int8 NPU submodels, calibration, the precision search, per-layer accuracy"),
    Stage("compile", ("compile",), needs=("quantize", "split", "import"), uses_chip=True,
          uses_toolchain=True, entry="npubuild.stages.compile:run",
          file_inputs="npubuild.backends:compile_files",
          description="layer groups, LMEM plan, simulator program"),
    Stage("verify", ("verify", "model.inputs"), needs=("import", "surgery", "fusion", "split",
                                                        "quantize", "compile"),
          uses_chip=True, uses_toolchain=True, entry="npubuild.stages.verify:run",
          file_inputs="npubuild.stages.files:verify_files",
          description="deployed pipeline vs the float model; report"),
)

STAGES: dict[str, Stage] = {s.name: s for s in PIPELINE}


def upto(target: str | None) -> tuple[Stage, ...]:
    """The stages from the start of the pipeline up to and including ``target``."""
    if target is None:
        return PIPELINE
    names = [s.name for s in PIPELINE]
    return PIPELINE[: names.index(target) + 1]
