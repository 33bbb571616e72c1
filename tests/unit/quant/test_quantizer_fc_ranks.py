"""`QuantConfig.fc_integer_ranks` (a chip's `fc_integer_ranks`): a fully connected layer is int8
only on an input of those ranks, and one kept in float keeps its output in float (rknn-toolkit2
stops on a quantized MatMul with its bias on a 3-D input, and on a float MatMul whose result is
quantized)."""

from __future__ import annotations

import numpy as np
from onnx import helper

from npubuild.quant.qdq import export_qdq
from tests.unit.quant.helpers import feeds_for, model, quantize

rng = np.random.default_rng(5)


def linear_3d():
    """A Linear layer on tokens as exporters write it: [1, 6, 10] @ [10, 4] + bias, then Relu."""
    return model([helper.make_node("MatMul", ["x", "w"], ["mm"], name="linear"),
                  helper.make_node("Add", ["mm", "b"], ["a"]),
                  helper.make_node("Relu", ["a"], ["y"])],
                 {"x": [1, 6, 10]}, {"y": [1, 6, 4]},
                 {"w": rng.normal(0, 0.3, (10, 4)), "b": rng.normal(0, 1, 4)})


def gemm_then_add():
    """x [1, 10] -> Gemm -> g, then g + g: an integer consumer of the Gemm's output."""
    return model([helper.make_node("Gemm", ["x", "w", "b"], ["g"], transB=1, name="fc"),
                  helper.make_node("Add", ["g", "g"], ["y"], name="twice")],
                 {"x": [1, 10]}, {"y": [1, 4]},
                 {"w": rng.normal(0, 0.3, (4, 10)), "b": rng.normal(0, 1, 4)})


def test_a_linear_on_tokens_stays_float_with_its_output_where_the_chip_takes_2d_only():
    m = linear_3d()
    feeds = feeds_for(m)
    anywhere, _, _ = quantize(m, feeds, scheme="asymmetric")
    assert not anywhere.tensors["y"].is_float
    qg, _, _ = quantize(m, feeds, scheme="asymmetric", fc_integer_ranks=(2,))
    fc = next(q for q in qg.layers if q.device == "cpu")
    assert "only on a 2-D input (this one is 3-D)" in fc.attrs["reason"]
    assert qg.tensors["y"].is_float
    qdq = export_qdq(qg)
    producer = {o: n for n in qdq.graph.node for o in n.output}
    matmul = next(n for n in qdq.graph.node if n.op_type == "MatMul")
    assert matmul.input[1] not in producer  # float weights, no DequantizeLinear
    assert not any(n.op_type == "QuantizeLinear" and n.input[0].startswith("y") for n in qdq.graph.node)


def test_a_2d_gemm_stays_int8_there():
    m = gemm_then_add()
    qg, _, _ = quantize(m, feeds_for(m), scheme="asymmetric", fc_integer_ranks=(2,))
    assert all(q.device == "npu" for q in qg.layers) and not qg.tensors["g"].is_float


def test_a_gemm_kept_in_float_keeps_its_output_in_float_there():
    """Its input kept in float (an override, as the precision search would): elsewhere its
    output is int8 for the integer Add that reads it; there the output, and so the Add, stay
    float."""
    m = gemm_then_add()
    feeds = feeds_for(m)
    elsewhere, _, _ = quantize(m, feeds, scheme="asymmetric", float_tensors=frozenset({"x"}))
    assert not elsewhere.tensors["g"].is_float
    qg, _, _ = quantize(m, feeds, scheme="asymmetric", float_tensors=frozenset({"x"}),
                        fc_integer_ranks=(2,))
    assert qg.tensors["g"].is_float and all(q.device == "cpu" for q in qg.layers)
