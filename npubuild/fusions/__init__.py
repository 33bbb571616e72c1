"""Op-fusion rules: the registry ``FUSIONS`` keyed by the rule names recipes use.

A rule is ``apply(model) -> (model, FusionReport)``: it rewrites matches of its pattern into one
node whose op is an ONNX model-local function in domain ``npubuild.fused`` (the body is the
original subgraph, so ONNX Runtime still runs it), or, for ``conv_bn``, folds weights.
Built-in rule families live one per module, listed in ``BUILTIN_MODULES``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import import_module
from typing import Any, Callable

from npubuild.registry import Registry

FUSED_DOMAIN = "npubuild.fused"


@dataclass
class FusionReport:
    """What one rule did: how often it fired, and why the nearest non-matches failed."""

    fired: int = 0
    fused_nodes: list[str] = field(default_factory=list)
    near_misses: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class FusionRule:
    name: str
    apply: Callable[[Any], tuple[Any, FusionReport]]

    @property
    def doc(self) -> str:
        return (self.apply.__doc__ or "").strip().split("\n\n")[0]


FUSIONS: Registry[FusionRule] = Registry("fusion rule", "npubuild.fusions")

BUILTIN_MODULES: tuple[str, ...] = ()


def fusion_rule(name: str):
    """Register ``fn(model) -> (model, FusionReport)`` as the rule called ``name``."""

    def decorate(fn):
        FUSIONS.register(name, FusionRule(name, fn))
        return fn

    return decorate


def load_builtins() -> Registry[FusionRule]:
    for module in BUILTIN_MODULES:
        import_module(module)
    FUSIONS.load_plugins()
    return FUSIONS
