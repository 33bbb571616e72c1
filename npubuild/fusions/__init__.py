"""Op-fusion rules: the registry ``FUSIONS`` keyed by the rule names recipes use.

A rule is ``apply(model) -> (model, FusionReport)`` and never mutates its input: it rewrites
matches of its pattern into one node whose op is an ONNX model-local function in domain
``npubuild.fused`` (the body is the original subgraph, so ONNX Runtime still runs it), or, for
``conv_bn`` and ``pad_conv``, folds the first op into the Conv (a plain Conv remains).
Built-in rule families live one per module, listed in ``BUILTIN_MODULES``.

Naming: a fused op's type is its rule's name in CamelCase (`fused_op_name`): ``conv_act`` →
``ConvAct``, ``silu`` → ``Silu``, a recipe rule ``name: my_block`` → ``MyBlock``. Bodies that
differ within one rule are overloads of that function (``ConvAct`` overload ``Relu``);
`npubuild.fusions.functions` says which attributes a fused node carries.

Order: rules apply in the order the recipe lists them, each to the graph the previous one left.
Built-in rules match ONNX ops, not fused ones, so a rule that absorbs another's ops comes first:
``conv_silu`` before ``silu``, ``conv_act`` before a user rule on bare activations. The folds
(``fold_affine``, ``conv_bn``, ``pad_conv``) come first of all. `DEFAULT_RULES` is that order.
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


# Each built-in rule and the module that registers it, in the order `load_builtins` registers
# them: `FUSIONS.known()` names them without importing the rules, so validating a recipe (and
# writing its schema) imports none.
BUILTIN_RULES: dict[str, str] = {
    "conv_bn": "npubuild.fusions.conv_bn",
    "fold_affine": "npubuild.fusions.affine",
    "pad_conv": "npubuild.fusions.pad_conv",
    "silu": "npubuild.fusions.conv",
    "hard_swish": "npubuild.fusions.conv",
    "conv_act": "npubuild.fusions.conv",
    "conv_silu": "npubuild.fusions.conv",
    "gemm_act": "npubuild.fusions.linear",
    "matmul_add": "npubuild.fusions.linear",
    "layer_norm": "npubuild.fusions.layer_norm",
}

FUSIONS: Registry[FusionRule] = Registry("fusion rule", "npubuild.fusions", BUILTIN_RULES)

BUILTIN_MODULES: tuple[str, ...] = (
    "npubuild.fusions.conv_bn",
    "npubuild.fusions.affine",
    "npubuild.fusions.pad_conv",
    "npubuild.fusions.conv",
    "npubuild.fusions.activation",
    "npubuild.fusions.linear",
    "npubuild.fusions.layer_norm",
)

DEFAULT_RULES: tuple[str, ...] = (
    "fold_affine", "conv_bn", "pad_conv", "conv_silu", "conv_act", "silu", "hard_swish",
    "gemm_act", "matmul_add", "layer_norm",
)


def fused_op_name(rule: str) -> str:
    """The op type of a rule's fused nodes: ``conv_act`` -> ``ConvAct`` (``Silu`` stays)."""
    return "".join(part[:1].upper() + part[1:] for part in rule.split("_"))


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
