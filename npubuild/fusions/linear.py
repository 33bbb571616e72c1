"""Fully connected layers: Gemm + activation, MatMul + bias.

- ``gemm_act``: Gemm → Relu / Clip / Sigmoid / HardSigmoid / LeakyRelu → ``GemmAct``; the node
  carries Gemm's ``alpha``, ``beta``, ``transA``, ``transB`` and the activation (see `activation`).
- ``matmul_add``: MatMul → Add of a constant bias → ``MatmulAdd`` (inputs ``a``, ``b``, ``bias``).
  An Add of a computed tensor (a residual) is not a bias and is left alone.
"""

from __future__ import annotations

from npubuild.fusions import fusion_rule
from npubuild.fusions.activation import activation_attrs, activation_ops
from npubuild.fusions.functions import Fused
from npubuild.fusions.graph import GraphView
from npubuild.fusions.pattern import Match, Op, Opt, pattern
from npubuild.fusions.rules import fuse_as_function

GEMM = Op("Gemm", ("a", "b", Opt("c")), id="gemm")
GEMM_ACT = tuple(pattern(GEMM, act, tag=act.op) for act in activation_ops("gemm"))


def _describe_gemm_act(view: GraphView, match: Match) -> Fused:
    attrs = activation_attrs(view, view.nodes[match.nodes["act"]])
    return Fused(attrs["activation"] + ("" if match.inputs.get("c") else "NoBias"), attrs)


@fusion_rule("gemm_act")
def gemm_act(model):
    """Gemm + Relu / Clip / Sigmoid / HardSigmoid / LeakyRelu -> npubuild.fused.GemmAct."""
    return fuse_as_function(model, "gemm_act", GEMM_ACT, _describe_gemm_act)


MATMUL_ADD = pattern(Op("MatMul", ("a", "b"), id="matmul"), Op("Add", ("matmul", "bias"), id="add"))


def _constant_bias(view: GraphView, match: Match):
    if view.constant(match.inputs["bias"]) is None:
        return f"the Add's other input {match.inputs['bias']!r} is computed, not a constant bias"
    return None


@fusion_rule("matmul_add")
def matmul_add(model):
    """MatMul + Add(constant bias) -> npubuild.fused.MatmulAdd."""
    return fuse_as_function(model, "matmul_add", [MATMUL_ADD], _constant_bias)
