"""The QDQ export's form: what a vendor reading it (rknn-toolkit2) takes for an integer layer."""

from __future__ import annotations

import numpy as np
from onnx import helper

from npubuild.quant.qdq import export_qdq
from tests.unit.quant.helpers import feeds_for, model, quantize

rng = np.random.default_rng(3)


def ops_into(m, tensor: str) -> list[str]:
    """The ops from the layer's input DequantizeLinear to ``tensor``'s QuantizeLinear, along
    first inputs (the float ops the integer layer is written as)."""
    producer = {o: n for n in m.graph.node for o in n.output}
    q = next(n for n in m.graph.node if n.op_type == "QuantizeLinear" and n.output[0] == f"{tensor}::q")
    ops, node = [], producer[q.input[0]]
    while node.op_type != "DequantizeLinear":
        ops.append(node.op_type)
        node = producer[node.input[0]]
    return ops[::-1]


def test_without_ties_the_export_writes_no_float_op_between_a_layer_and_its_quantize():
    """pow2 graphs nudge exact ties upwards with an Add before QuantizeLinear; the model handed
    to a vendor leaves it out (rknn-toolkit2 takes a layer whose result reaches its
    QuantizeLinear through another float op for a float16 one) and is otherwise the same."""
    m = model([helper.make_node("Conv", ["x", "w"], ["y"], pads=[1, 1, 1, 1])],
              {"x": [1, 3, 6, 6]}, {"y": None}, {"w": rng.normal(0, 0.3, (4, 3, 3, 3))})
    qg, _, _ = quantize(m, feeds_for(m), scheme="pow2_symmetric")
    nudged, plain = export_qdq(qg), export_qdq(qg, ties=False)
    assert ops_into(nudged, "y") == ["Conv", "Add"]
    assert ops_into(plain, "y") == ["Conv"]
    assert [n.op_type for n in nudged.graph.node if n.output[0] != "y::nudged"] == \
        [n.op_type for n in plain.graph.node]
