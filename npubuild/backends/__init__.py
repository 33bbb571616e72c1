"""Backends: how npubuild builds for one family of chips (seed 000's `convert`).

A chip is validated data (`npubuild.targets.model.Chip`); its ``backend`` field names one entry
of `BACKENDS`, the one registry of what a chip family can do:

- **support**: the chip's op table (the data file, written from the vendor's own support list
  with the vendor's reasons) is what the split checks; a backend adds nothing hidden to it;
- **compile**: NPU submodels → the vendor artifact in ``compile/graph_ir_<i>/`` (the
  ``context_dir`` of ``graph_infos.json``), with the vendor's figures in the report;
- **run**: a `Runner` backend that executes that artifact (the vendor's simulator, or the
  reference its hardware is specified to match), for verify and ``infer``;
- **toolchain**: the vendor toolchain it runs in its own environment (`npubuild.toolchains`),
  whose exact versions are part of the compile and verify keys.

``simulated`` (npubuild's own compiler and bit-exact simulator: npu-16m, npu-strict, npu-tiny)
is one backend among them. Third-party backends register through the entry-point group
``npubuild.backends``. Code dispatches on ``chip.backend`` through this registry, never on a
chip's name.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from npubuild.registry import Registry

if TYPE_CHECKING:
    import numpy as np

    from npubuild.recipe import LoadedRecipe
    from npubuild.stages import StageContext
    from npubuild.targets.model import Chip

#: Written by a vendor backend's compile into ``compile/``: which backend built it and how.
BACKEND_FILE = "backend.json"
SIMULATED = "simulated"

NpuRun = Callable[[Any, "Mapping[str, np.ndarray]"], "Mapping[str, np.ndarray]"]


class Backend:
    """What a chip family can do; subclasses override what differs from the defaults."""

    name: str = ""
    #: One line for `npubuild targets`.
    description: str = ""
    #: The toolchain (`npubuild.toolchains.TOOLCHAINS`) this backend runs, or None.
    toolchain: str | None = None
    #: What the deployed NPU graphs run in during verify (the report says it).
    runs_in: str = ""
    #: Whether npubuild's own compiler places every NPU layer in the chip's LMEM, so split asks
    #: it whether a node fits even alone (a vendor compiler tiles for itself: its chip file's
    #: memory figures only feed npubuild's estimate).
    plans_lmem: bool = False

    def compile(self, ctx: StageContext) -> dict:
        """NPU submodels → artifacts under ``ctx.out``; returns the report fragment."""
        raise NotImplementedError

    def npu_runner(self, compile_dir: Path) -> NpuRun:
        """A `Runner` backend executing the artifacts of ``compile_dir``."""
        raise NotImplementedError

    def file_inputs(self, loaded: LoadedRecipe) -> list[Path]:
        """Files outside the build that compile reads (the vendor's calibration data)."""
        return []


#: The built-in backends by name, each with the module that registers it when imported. Naming
#: them imports nothing: a chip file's ``backend`` is checked (`npubuild validate`) without
#: loading a backend's code, numpy or ONNX; `get` imports the one a build uses.
BUILTIN_MODULES: dict[str, str] = {
    "rknn": "npubuild.backends.rknn",
    SIMULATED: "npubuild.backends.simulated",
    "tpu-mlir": "npubuild.backends.tpu_mlir",
    "vela": "npubuild.backends.vela",
}

BACKENDS: Registry[Backend] = Registry("backend", "npubuild.backends", BUILTIN_MODULES)



def register(backend: Backend) -> Backend:
    return BACKENDS.register(backend.name, backend)


def names() -> list[str]:
    """Every backend's name: the built-ins (not imported) and the plugins' (loaded)."""
    return BACKENDS.known()


def is_known(name: str) -> bool:
    """Whether ``name`` is a backend (a built-in is known without loading any plugin)."""
    return name in BUILTIN_MODULES or name in names()


def get(name: str) -> Backend:
    """The backend called ``name``, its module imported on first use."""
    return BACKENDS.get(name)


def of(chip: Chip) -> Backend:
    """The backend that builds for ``chip`` (its ``backend`` field, validated on load)."""
    return get(chip.backend)


def compile_files(loaded: LoadedRecipe) -> list[Path]:
    """The compile stage's external files: what the chip's backend reads (calibration data
    for a vendor quantizer), so editing them re-keys compile."""
    return of(loaded.chip()).file_inputs(loaded)


def toolchain_versions(stage, loaded) -> dict[str, str]:
    """Tool-version hook (`npubuild.engine.keys.TOOL_VERSION_HOOKS`): the vendor toolchain a
    stage runs for the recipe's chip, its name and exact package versions (they decide the
    artifact as much as npubuild's code does). Nothing for the simulated chips and for stages
    that run no toolchain; a toolchain not installed yet is keyed on what npubuild installs."""
    if not getattr(stage, "uses_toolchain", False):
        return {}
    from npubuild import toolchains
    from npubuild.errors import NpubuildError
    from npubuild.toolchains.env import find

    try:
        name = of(loaded.chip()).toolchain
    except (NpubuildError, AttributeError):  # a bad target is reported where the chip is loaded
        return {}
    if name is None:
        return {}
    chain = toolchains.get(name)
    env = find(chain)
    versions = env.versions if env else {chain.package: chain.version}
    return {f"{name} toolchain: {package}": str(version) for package, version in versions.items()}


def built_by(compile_dir: Path) -> str:
    """The backend that built ``compile_dir`` (``backend.json``; none: the simulated one)."""
    path = Path(compile_dir) / BACKEND_FILE
    if not path.is_file():
        return SIMULATED
    return json.loads(path.read_text(encoding="utf-8"))["backend"]


def npu_runner(compile_dir: Path) -> NpuRun:
    """The `Runner` backend for the NPU graphs of a built ``compile/`` directory."""
    return get(built_by(compile_dir)).npu_runner(Path(compile_dir))
