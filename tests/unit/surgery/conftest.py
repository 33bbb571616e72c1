"""Tiny inline models for the surgery rewrites, the equivalence check every rewrite test makes,
and the real YOLOv8n (nudenet's 320n.onnx) imported the way the import stage does it."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild import surgery
from npubuild.onnx_io import fix_input_shapes
from npubuild.onnx_io import clone
from npubuild.surgery import origins, proof
from npubuild.surgery.graph import infer_types


class Tiny:
    """Builds small models, applies rewrites by their recipe name, proves the result."""

    def __init__(self):
        self.rng = np.random.default_rng(11)
        self.registry = surgery.load_builtins()

    def rand(self, *shape) -> np.ndarray:
        return self.rng.standard_normal(shape).astype(np.float32)

    def model(self, nodes, inputs: dict, outputs, inits: dict | None = None, opset: int = 17,
              ir_version: int = 8, elem=TensorProto.FLOAT) -> onnx.ModelProto:
        graph = helper.make_graph(
            nodes, "tiny",
            [helper.make_tensor_value_info(n, elem, s) for n, s in inputs.items()],
            [helper.make_tensor_value_info(n, TensorProto.UNDEFINED, None) for n in outputs],
            [numpy_helper.from_array(np.asarray(v), n) for n, v in (inits or {}).items()])
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])
        model.ir_version = ir_version
        inferred = onnx.shape_inference.infer_shapes(model)
        for out in inferred.graph.output:  # declare what inference found
            for value in inferred.graph.value_info:
                if value.name == out.name:
                    out.CopyFrom(value)
        del inferred.graph.value_info[:]
        return onnx.shape_inference.infer_shapes(inferred)

    def apply(self, name: str, model: onnx.ModelProto, /, **args) -> onnx.ModelProto:
        rw = self.registry[name]
        before = clone(model)
        result = rw.apply(model, rw.args(**args))
        assert model == before, f"{name} mutated its input"
        return result

    def check(self, name: str, model: onnx.ModelProto, /, *, rtol: float = 1e-5, **args):
        """Apply ``name`` and prove it as the stage does; return (result, comparison)."""
        result = self.apply(name, model, **args)
        step_origins = origins.pop(result)
        problem = proof.check_structure(result)
        assert problem is None, problem
        tolerance = args.get("tolerance")
        exact = self.registry[name].data_movement and tolerance is None
        comparison = proof.compare(model, result, step_origins, exact=exact, rtol=tolerance or rtol)
        if not args.get("expect_change"):
            assert not comparison.failures, comparison.failures
        return result, comparison

    @staticmethod
    def ops(model) -> Counter:
        return Counter(n.op_type for n in model.graph.node)

    @staticmethod
    def non_4d(model) -> dict:
        """Non-constant tensors whose rank is not 4."""
        inits = {t.name for t in model.graph.initializer}
        return {name: dims for name, (_, dims) in infer_types(model).items()
                if name not in inits and dims is not None and len(dims) != 4}


@pytest.fixture
def tiny():
    return Tiny()


def fixed_yolov8n() -> onnx.ModelProto:
    """nudenet's YOLOv8n with the input fixed to 1x3x320x320 and shapes inferred."""
    import nudenet

    model = onnx.load(str(Path(nudenet.__file__).parent / "320n.onnx"))
    inferred = fix_input_shapes(model, {"images": [1, 3, 320, 320]})
    out_value = next(v for v in inferred.graph.output)
    assert [d.dim_value for d in out_value.type.tensor_type.shape.dim] == [1, 22, 2100]
    return inferred


@pytest.fixture(scope="session")
def yolov8n() -> onnx.ModelProto:
    return fixed_yolov8n()
