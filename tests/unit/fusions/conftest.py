"""Tiny inline models for the fusion rules, and the equivalence check every rule test makes."""

from __future__ import annotations

from collections import Counter

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild import fusions
from npubuild.fusions import FUSED_DOMAIN
from npubuild.onnx_io import run
from npubuild.proofs import compare, make_feeds


class Tiny:
    """Builds small float models and checks a rule's result against the original."""

    def __init__(self):
        self.rng = np.random.default_rng(7)
        self.rules = fusions.load_builtins()

    def rand(self, *shape, low: float | None = None) -> np.ndarray:
        values = self.rng.standard_normal(shape).astype(np.float32)
        return np.abs(values) + low if low is not None else values

    def model(self, nodes, inputs: dict, outputs, inits: dict | None = None,
              opset: int = 17) -> onnx.ModelProto:
        graph = helper.make_graph(
            nodes, "tiny",
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, s) for n, s in inputs.items()],
            [helper.make_tensor_value_info(n, TensorProto.FLOAT, None) for n in outputs],
            [numpy_helper.from_array(np.asarray(v), n) for n, v in (inits or {}).items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = 8
        return onnx.shape_inference.infer_shapes(model, strict_mode=True)

    def apply(self, rule: str, model: onnx.ModelProto):
        return self.rules[rule].apply(model)

    def fuse_and_check(self, rule: str, model: onnx.ModelProto, *, exact: bool = True):
        """Apply ``rule``; the result must be valid ONNX with the same outputs."""
        before = onnx.ModelProto()
        before.CopyFrom(model)
        fused, report = self.apply(rule, model)
        assert model == before, "a rule must not mutate its input"
        self.assert_equivalent(model, fused, exact=exact)
        return fused, report

    def assert_equivalent(self, model, fused, *, exact: bool = True) -> None:
        onnx.checker.check_model(fused, full_check=True)
        feeds = make_feeds(model, seed=3)
        _, bad = compare(run(model, feeds), run(fused, feeds), tolerance=1e-5, exact=exact)
        assert not bad, [str(b) for b in bad]

    @staticmethod
    def ops(model) -> Counter:
        return Counter(f"{n.op_type}:{n.overload}" if n.domain == FUSED_DOMAIN else n.op_type
                       for n in model.graph.node)

    @staticmethod
    def fused(model) -> list[onnx.NodeProto]:
        return [n for n in model.graph.node if n.domain == FUSED_DOMAIN]

    @staticmethod
    def attrs(node) -> dict:
        return {a.name: (v.decode() if isinstance(v := helper.get_attribute_value(a), bytes) else v)
                for a in node.attribute}


@pytest.fixture
def tiny() -> Tiny:
    return Tiny()


def node(op: str, inputs, outputs, **attrs) -> onnx.NodeProto:
    return helper.make_node(op, list(inputs), list(outputs), name=f"/{outputs[0]}", **attrs)


@pytest.fixture
def make_node():
    return node
