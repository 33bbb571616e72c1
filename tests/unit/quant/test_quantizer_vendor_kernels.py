"""`QuantConfig.vendor_kernels` (a chip op table's `vendor_kernel`): a node the chip's toolchain
runs on the NPU in its own kernel (a MatMul of two activations) — int8, from the Q/DQ around it
(rknn-toolkit2's exMatMul), or float16 with its output kept in float — rather than npubuild's
integer ``matmul``, and the precision search sees the same placement (`tensor_params`)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
from onnx import helper

from npubuild.quant import calibrate, quantizer
from npubuild.quant.lower import lower
from npubuild.quant.qdq import export_qdq
from tests.unit.quant.helpers import feeds_for, model, quantize

INT8 = (("MatMul", "int8"),)
FLOAT16 = (("MatMul", "float16"),)


def attention_scores():
    """q [1, 4, 16, 8] @ k^T [1, 4, 8, 16] (both activations: no integer kernel in npubuild),
    then an integer Add that reads the scores."""
    return model([helper.make_node("MatMul", ["q", "kt"], ["s"], name="scores"),
                  helper.make_node("Add", ["s", "s"], ["y"], name="twice")],
                 {"q": [1, 4, 16, 8], "kt": [1, 4, 8, 16]}, {"y": [1, 4, 16, 16]})


def scores_layer(qg):
    return next(layer for layer in qg.layers if layer.name == "scores")


def test_without_a_vendor_kernel_it_is_npubuilds_own_integer_matmul():
    m = attention_scores()
    qg, _, _ = quantize(m, feeds_for(m))
    assert (scores_layer(qg).kind, scores_layer(qg).device) == ("matmul", "npu")


def test_the_vendors_int8_kernel_runs_it_on_the_npu_between_int8_tensors():
    m = attention_scores()
    qg, _, _ = quantize(m, feeds_for(m), vendor_kernels=INT8)
    layer = scores_layer(qg)
    assert layer.kind == "float" and layer.device == "npu" and qg.cpu_layers() == []
    assert "runs it on the NPU in its own int8 kernel" in layer.attrs["reason"]
    assert "a MatMul of two activations" in layer.attrs["reason"]  # why not ours
    assert all(not qg.tensors[t].is_float for t in ("q", "kt", "s", "y"))
    # what the toolkit is handed: DequantizeLinear -> MatMul -> QuantizeLinear
    qdq = export_qdq(qg, ties=False)
    producer = {o: n.op_type for n in qdq.graph.node for o in n.output}
    matmul = next(n for n in qdq.graph.node if n.op_type == "MatMul")
    assert [producer[i] for i in matmul.input] == ["DequantizeLinear"] * 2
    assert [n.op_type for n in qdq.graph.node if matmul.output[0] in n.input] == ["QuantizeLinear"]


def test_the_vendors_float16_kernel_keeps_its_output_in_float():
    m = attention_scores()
    qg, _, _ = quantize(m, feeds_for(m), vendor_kernels=FLOAT16)
    layer = scores_layer(qg)
    assert layer.device == "cpu" and "in float16, its output kept in float" in layer.attrs["reason"]
    assert qg.tensors["s"].is_float and qg.tensors["y"].is_float  # and the Add reading it


def test_an_input_kept_in_float_turns_the_int8_kernel_into_float16():
    """The int8 kernel needs integer tensors on both sides: one kept in float (an override, or
    the precision search's choice) leaves float16, whose output stays float."""
    m = attention_scores()
    qg, _, _ = quantize(m, feeds_for(m), vendor_kernels=INT8, float_tensors=frozenset({"q"}))
    assert "in float16" in scores_layer(qg).attrs["reason"] and qg.tensors["s"].is_float


def test_a_float_override_on_the_node_is_not_a_vendor_kernel():
    m = attention_scores()
    feeds = feeds_for(m)
    fg, probe = lower(m, float_nodes={"scores"})
    stats = calibrate.observe(fg, probe, feeds, "minmax")
    config = quantizer.QuantConfig(scheme="symmetric", vendor_kernels=INT8)
    qg, _ = quantizer.quantize_graph(fg, stats, config, "g")
    assert scores_layer(qg).device == "cpu"
    assert scores_layer(qg).attrs["reason"] == "kept in float by a quantization override"


def test_beside_a_constant_it_is_no_vendor_kernel():
    """A MatMul by a constant 3-D operand (no integer kernel of ours either): the vendor's int8
    kernel is for activations; beside a float constant the toolkit stops on the result's
    QuantizeLinear, so it stays a float layer."""
    m = model([helper.make_node("MatMul", ["q", "k"], ["s"], name="scores"),
               helper.make_node("Add", ["s", "s"], ["y"], name="twice")],
              {"q": [1, 4, 16, 8]}, {"y": [1, 4, 16, 16]}, {"k": np.ones((1, 4, 8, 16))})
    qg, _, _ = quantize(m, feeds_for(m), vendor_kernels=INT8)
    assert scores_layer(qg).device == "cpu" and "vendor" not in str(scores_layer(qg).attrs)


def test_the_precision_search_sees_the_same_placement():
    """`tensor_params` names the layers the search prices as float: not one the vendor's int8
    kernel runs (nor npubuild's integer matmul), one it runs in float16 yes."""
    m = attention_scores()
    feeds = feeds_for(m)
    fg, probe = lower(m)
    stats = calibrate.observe(fg, probe, feeds, "minmax")
    base = quantizer.QuantConfig(scheme="symmetric")
    floats = {kernels: quantizer.Quantizer(fg, stats, replace(base, vendor_kernels=kernels))
              .tensor_params()[1] for kernels in ((), INT8, FLOAT16)}
    assert floats == {(): set(), INT8: set(), FLOAT16: {"scores", "twice"}}
    params, _ = quantizer.Quantizer(fg, stats, replace(base, vendor_kernels=INT8)).tensor_params()
    assert params["s"] is not None and params["s"].dtype == "int8"
