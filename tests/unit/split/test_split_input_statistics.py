"""The self-normalised input class (`npubuild.split.input_statistics`): a model input divided
by a statistic of itself (min/max, mean/deviation) stays in float on the CPU, from the input to
the division; what follows the division goes to the NPU."""

from __future__ import annotations

import numpy as np
import onnx
import pytest

from npubuild.split import check_placement
from npubuild.split.input_statistics import REASON
from npubuild.targets import load_chip

N = 64


def _model(nodes, inits: dict, dtype=onnx.TensorProto.FLOAT) -> onnx.ModelProto:
    """``nodes`` reading ``x`` [1, N], a classifier MatMul ``head`` of ``normalised`` to ``y``."""
    h = onnx.helper
    inits = {**inits, "w": np.random.default_rng(0).normal(size=(N, 4)).astype(np.float32)}
    nodes = [*nodes, h.make_node("MatMul", ["normalised", "w"], ["y"], name="head")]
    graph = h.make_graph(nodes, "self_normalised", [h.make_tensor_value_info("x", dtype, [1, N])],
                         [h.make_tensor_value_info("y", onnx.TensorProto.FLOAT, None)],
                         [onnx.numpy_helper.from_array(v, k) for k, v in inits.items()])
    model = h.make_model(graph, opset_imports=[h.make_opsetid("", 17)], ir_version=8)
    return onnx.shape_inference.infer_shapes(model)


def min_max_model() -> onnx.ModelProto:
    """BirdNET V2.4's front: ``(x - min(x)) / (max(x - min(x)) + eps)``, then ``· 2 - 1``."""
    h = onnx.helper
    nodes = [h.make_node("ReduceMin", ["x"], ["lo"], name="min", keepdims=1),
             h.make_node("Sub", ["x", "lo"], ["shifted"], name="shift"),
             h.make_node("ReduceMax", ["shifted"], ["hi"], name="max", keepdims=1),
             h.make_node("Add", ["hi", "eps"], ["span"], name="span"),
             h.make_node("Div", ["shifted", "span"], ["unit"], name="divide"),
             h.make_node("Mul", ["unit", "two"], ["twice"], name="twice"),
             h.make_node("Sub", ["twice", "one"], ["normalised"], name="centre")]
    return _model(nodes, {"eps": np.array(1e-6, np.float32), "two": np.array(2.0, np.float32),
                          "one": np.array(1.0, np.float32)})


def standardised_model() -> onnx.ModelProto:
    """``(x - mean) · 1 / sqrt(mean((x - mean)²) + eps)``: a product by the reciprocal."""
    h = onnx.helper
    nodes = [h.make_node("ReduceMean", ["x"], ["mean"], name="mean", keepdims=1),
             h.make_node("Sub", ["x", "mean"], ["centred"], name="centred"),
             h.make_node("Mul", ["centred", "centred"], ["square"], name="square"),
             h.make_node("ReduceMean", ["square"], ["var"], name="var", keepdims=1),
             h.make_node("Add", ["var", "eps"], ["var_eps"], name="var_eps"),
             h.make_node("Sqrt", ["var_eps"], ["std"], name="std"),
             h.make_node("Reciprocal", ["std"], ["inv"], name="inv"),
             h.make_node("Mul", ["centred", "inv"], ["normalised"], name="scale")]
    return _model(nodes, {"eps": np.array(1e-6, np.float32)})


def placed(model) -> dict:
    return {p.name: p for p in check_placement(model, load_chip("npu-16m"))}


def test_a_min_max_normalisation_of_the_input_runs_in_float_on_the_cpu():
    """BirdNET V2.4 as written: the peak-to-peak (`MEL_SPEC1/add`) reached 2.06 on a wind clip
    where calibration's songs gave 0.80, so int8 clipped the divisor and the waveform before
    it. The input's statistics and the division stay in float on the CPU; the scale-free
    values after the division go to the NPU."""
    where = placed(min_max_model())
    for name in ("shift", "span"):  # ops the chip runs: on the CPU for this reason
        assert where[name].device == "cpu" and where[name].reasons == [REASON], name
    for name in ("min", "max", "divide"):  # on the CPU anyway (no kernel); in the chain too
        assert where[name].device == "cpu", name
    for name in ("twice", "centre", "head"):
        assert where[name].device == "npu", name


def test_a_standardisation_by_the_reciprocal_of_the_deviation_runs_in_float_on_the_cpu():
    where = placed(standardised_model())
    for name in ("centred", "square", "var_eps", "scale"):
        assert where[name].device == "cpu", name
    assert where["scale"].reasons == [REASON]
    assert where["head"].device == "npu"


def _unnormalised(case: str) -> onnx.ModelProto:
    h = onnx.helper
    if case == "constant scale":  # x / 255: calibration's range is the model's
        return _model([h.make_node("Div", ["x", "k"], ["normalised"], name="divide")],
                      {"k": np.array(255.0, np.float32)})
    if case == "shift only":  # x - mean(x): no division, nothing bounds it
        return _model([h.make_node("ReduceMean", ["x"], ["mean"], name="mean", keepdims=1),
                       h.make_node("Sub", ["x", "mean"], ["normalised"], name="divide")], {})
    # a table read at integer input ids, then divided by its own maximum: the values are the
    # model's table, not the input's level
    table = np.random.default_rng(1).normal(size=(10, N)).astype(np.float32)
    nodes = [h.make_node("Gather", ["table", "x"], ["rows"], name="rows", axis=0),
             h.make_node("Reshape", ["rows", "flat"], ["row"], name="row"),
             h.make_node("ReduceMax", ["row"], ["hi"], name="max", keepdims=1),
             h.make_node("Div", ["row", "hi"], ["normalised"], name="divide")]
    model = _model(nodes, {"table": table, "flat": np.array([N, -1], np.int64)},
                   onnx.TensorProto.INT64)
    return model


@pytest.mark.parametrize("case", ["constant scale", "shift only", "embedding table"])
def test_an_input_not_divided_by_its_own_statistic_keeps_its_placement(case):
    where = placed(_unnormalised(case))
    assert all(REASON not in p.reasons for p in where.values()), case
