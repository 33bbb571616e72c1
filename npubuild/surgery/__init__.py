"""Graph-surgery rewrites: the registry ``SURGERY`` keyed by the step names recipes use.

A rewrite is a pure function ``apply(model, args) -> model`` on an ``onnx.ModelProto`` (it
must not mutate its input) plus a pydantic model of its arguments. The surgery stage applies
the recipe's steps in order and proves each one numerically against its input: bit-identical
when the rewrite only moves data (``data_movement=True``), else within the step's tolerance.
Built-in rewrite families live one per module, listed in ``BUILTIN_MODULES``.
"""

from __future__ import annotations

from dataclasses import dataclass
from importlib import import_module
from typing import Any, Callable

from pydantic import BaseModel, ConfigDict, Field

from npubuild.errors import UserError
from npubuild.registry import Registry


class StepArgs(BaseModel):
    """Arguments every rewrite step accepts."""

    model_config = ConfigDict(extra="forbid")  # docstrings: `npubuild.schemas.docstrings`

    tolerance: float | None = Field(
        default=None, gt=0,
        description="Relative tolerance of this step's numerical check "
                    "(default: 0 for pure data movement, else 1e-5).")


class SurgeryError(UserError):
    """A rewrite's arguments do not fit the model (unknown node, wrong op type, bad shape)."""


@dataclass(frozen=True)
class Rewrite:
    name: str
    args: type[StepArgs]
    apply: Callable[[Any, Any], Any]
    data_movement: bool = False

    @property
    def doc(self) -> str:
        return (self.apply.__doc__ or "").strip().split("\n\n")[0]


# Each built-in rewrite and the module that registers it, in the order `load_builtins`
# registers them: `SURGERY.known()` names them without importing the rewrites, and validating
# a recipe imports the modules of the steps it names only (`SURGERY.get`).
BUILTIN_REWRITES: dict[str, str] = {
    "fold_constants": "npubuild.surgery.folding",
    "remove_nodes": "npubuild.surgery.nodes",
    "replace_op": "npubuild.surgery.nodes",
    "set_attribute": "npubuild.surgery.nodes",
    "insert_op": "npubuild.surgery.nodes",
    "rewrite_gemm_as_conv": "npubuild.surgery.gemm",
    "split_gemm_slices": "npubuild.surgery.gemm",
    "reshape_to_4d": "npubuild.surgery.rank4",
    "extract": "npubuild.surgery.io",
    "update_io_shape": "npubuild.surgery.io",
    "rename_tensors": "npubuild.surgery.io",
}

SURGERY: Registry[Rewrite] = Registry("surgery rewrite", "npubuild.surgery", BUILTIN_REWRITES)

BUILTIN_MODULES: tuple[str, ...] = (
    "npubuild.surgery.folding",
    "npubuild.surgery.nodes",
    "npubuild.surgery.gemm",
    "npubuild.surgery.rank4",
    "npubuild.surgery.io",
)


def rewrite(name: str, args: type[StepArgs], *, data_movement: bool = False):
    """Register ``fn(model, args) -> model`` as the rewrite called ``name`` in recipes."""

    def decorate(fn):
        SURGERY.register(name, Rewrite(name, args, fn, data_movement))
        return fn

    return decorate


def load_builtins() -> Registry[Rewrite]:
    for module in BUILTIN_MODULES:
        import_module(module)
    SURGERY.load_plugins()
    return SURGERY
