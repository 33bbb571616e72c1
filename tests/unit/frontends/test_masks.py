"""`frontends.masks`: an additive attention mask's huge negative constant written as -256, so
the masked scores quantize, with the attention ONNX Runtime computes unchanged."""

import numpy as np
import onnx
import pytest

from npubuild import onnx_io
from npubuild.frontends import masks
from tests.unit.frontends.onnx_models import FINFO_MIN, masked_attention

TOKENS = 8


def feeds(kept: list[int], seed: int = 1) -> dict:
    x = np.random.default_rng(seed).normal(size=(1, TOKENS, 16)).astype(np.float32)
    return {"x": x, "attention_mask": np.array([kept], np.int64)}


def constants(model: onnx.ModelProto) -> list[np.ndarray]:
    values = [onnx.numpy_helper.to_array(t) for t in model.graph.initializer]
    values += [onnx.numpy_helper.to_array(n.attribute[0].t) for n in model.graph.node
               if n.op_type == "Constant"]
    return [v for v in values if v.dtype.kind == "f"]


@pytest.mark.parametrize("mask, neg, count", [
    ("sub_mul", FINFO_MIN, 1),          # Hugging Face: (1 - mask) · finfo(float32).min
    ("sub_mul", -10000.0, 1),           # older BERT exports
    ("sub_mul", -1e9, 1),
    ("where_bias", FINFO_MIN, 1),       # Where(mask, 0, NEG) added
    ("where_bias", -np.inf, 1),
    ("masked_fill", -1e9, 1),           # Where(not mask, NEG, scores)
    ("causal", FINFO_MIN, 2),           # the padding bias and a constant causal bias
])
def test_a_huge_negative_mask_is_bounded_and_the_attention_is_bit_identical(mask, neg, count):
    source = masked_attention(mask, neg)
    bounded, fired = masks.bounded_masks(source)
    assert fired == count
    assert min(float(v.min()) for v in constants(bounded)) == -masks.MASK_BOUND
    for kept in ([1] * 5 + [0] * 3, [1] * TOKENS, [1, 0] * 4):
        expected = onnx_io.run(source, feeds(kept))["y"]
        assert np.array_equal(onnx_io.run(bounded, feeds(kept))["y"], expected), kept


@pytest.mark.parametrize("mask", ["sub_mul", "where_bias"])
def test_a_row_masked_whole_attends_as_unmasked_not_nan(mask):
    """A row with no position kept (an empty input): the export's finfo.min swamps every score
    (each position 1/n); bounded, all scores shift alike and the row attends as if unmasked,
    as ONNX Runtime's Attention kernel (mask -10000) does. Finite either way."""
    bounded, _ = masks.bounded_masks(masked_attention(mask))
    unmasked = onnx_io.run(masked_attention(mask), feeds([1] * TOKENS))["y"]
    got = onnx_io.run(bounded, feeds([0] * TOKENS))["y"]
    assert np.isfinite(got).all()
    np.testing.assert_allclose(got, unmasked, rtol=1e-5, atol=1e-6)


def test_a_mask_scaled_after_it_is_added_is_left_alone():
    """A Mul between the mask and the Softmax would scale the bound down: not rewritten."""
    source = masked_attention("scaled_after")
    assert masks.bounded_masks(source) == (source, 0)


def test_a_mask_read_by_anything_but_a_softmax_is_left_alone():
    source = masked_attention("sub_mul")
    source.graph.output.append(onnx.helper.make_tensor_value_info("bias", onnx.TensorProto.FLOAT,
                                                                  None))
    assert masks.bounded_masks(source) == (source, 0)


def test_a_small_negative_constant_is_no_mask():
    """-100 already quantizes next to the scores (and may be a real bias): left as written."""
    source = masked_attention("sub_mul", -100.0)
    assert masks.bounded_masks(source) == (source, 0)


def test_import_keeps_the_exported_constant_where_its_proof_inputs_mask_a_row_whole():
    """The proof inputs decide: a sample with nothing kept (finfo.min: each position 1/n;
    bounded: as if unmasked) fails the proof, and import hands on the model as written,
    saying why."""
    from npubuild.stages import importer

    source = masked_attention("sub_mul")
    model, figures = importer.bounded_masks(source, feeds([0] * TOKENS))
    assert model is source and "kept" in figures
    model, figures = importer.bounded_masks(source, feeds([1] * 5 + [0] * 3))
    assert model is not source and figures["constants"] == 1 and figures["bit_identical"]
