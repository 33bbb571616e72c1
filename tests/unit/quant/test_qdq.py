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


def test_layers_sharing_one_weight_read_one_initializer_and_compute_the_same():
    """An unrolled recurrence's steps read the same weights: nakdimon's QDQ model held 256
    copies of four 400x1600 weights (184 MB)."""
    from npubuild import onnx_io
    from npubuild.quant.reference import quantize_inputs, run_reference

    weight = rng.normal(0, 0.3, (4, 4, 1, 1))
    m = model([helper.make_node("Conv", ["x", "w"], ["h"]),
               helper.make_node("Conv", ["h", "w"], ["y"])],
              {"x": [1, 4, 3, 3]}, {"y": None}, {"w": weight})
    feeds = feeds_for(m)
    qg, _, _ = quantize(m, feeds, scheme="symmetric")
    qdq = export_qdq(qg)
    weights = [t.name for t in qdq.graph.initializer if t.name.endswith("::w")]
    assert len(weights) == 1
    readers = [n for n in qdq.graph.node if n.op_type == "DequantizeLinear" and n.input[0] in weights]
    assert len(readers) == 2
    got = onnx_io.run(qdq, feeds[0])["y"]
    reference = run_reference(qg, quantize_inputs(qg, feeds[0]))
    want = (reference["y"].astype(np.float64) - qg.tensors["y"].zero_point) * qg.tensors["y"].scale
    np.testing.assert_allclose(got, want, atol=qg.tensors["y"].scale * 1.01)
