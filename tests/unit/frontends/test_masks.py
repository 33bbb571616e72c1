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
    ("causal_position_bias", FINFO_MIN, 2),  # the causal mask folded into a position bias (T5)
    ("causal_position_bias", -1e9, 2),
    ("sliced", FINFO_MIN, 1),           # through Slices and a Concat (T5's encoder: a Slice)
    ("lookup", -np.inf, 1),             # a bias table's padding row (chython-rxnmap's distances)
    ("lookup", FINFO_MIN, 1),
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


def test_a_lookup_tables_masked_row_is_bounded_where_import_proves_it():
    """A bias table read by a Gather (a spatial encoding whose padding index is -inf): import
    derives its bound from the scores it masks and proves the attention, so calibration meets
    no infinity (chython-rxnmap stopped there: "has NaN or Inf values in the float model")."""
    from npubuild.stages import importer

    source = masked_attention("lookup", -np.inf)
    model, figures = importer.bounded_masks(source, feeds([1] * 5 + [0] * 3))
    assert model is not source and figures["constants"] == 1
    assert all(np.isfinite(v).all() for v in constants(model))


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


def scaled_feeds(scale: float) -> dict:
    """Five tokens kept of eight, ``x`` scaled: the scores (products of two projections of x)
    span scale² as much."""
    return {"x": feeds([1] * 5 + [0] * 3)["x"] * np.float32(scale),
            "attention_mask": np.array([[1] * 5 + [0] * 3], np.int64)}


@pytest.mark.parametrize("scale", [0.3, 1.0, 3.0])
def test_the_bound_is_the_least_power_of_two_that_keeps_each_masked_score_16_below_its_row(scale):
    """The bound is derived from the scores the mask joins on the given inputs: the smallest
    power of two (16 to 256) at least 16 above the largest (masked score - its row's largest
    kept score), so the masked sum spans as little as the proof allows (an int8 step of
    [-256 - s, s] is about 1 logit). Scores that span little get a small bound, scores that
    span much a large one, and the attention stays within the import proof's tolerance."""
    source = masked_attention("sub_mul")
    inputs = scaled_feeds(scale)
    scores = onnx_io.run(onnx_io.with_outputs(source, ["scores"]), inputs, ["scores"])["scores"]
    kept = inputs["attention_mask"][0] == 1
    spread = float((scores[..., ~kept].max(-1) - scores[..., kept].max(-1)).max())
    expected = min(2.0 ** np.ceil(np.log2(max(spread + 16, 16))), masks.MASK_BOUND)
    assert masks.derived_bounds(source, inputs) == {"neg": expected}
    bounded, _ = masks.bounded_masks(source, {"neg": expected})
    y, got = (onnx_io.run(m, inputs)["y"] for m in (source, bounded))
    assert np.abs(got - y).max() <= 1e-5 * np.abs(y).max()


def test_scores_that_span_little_get_a_small_bound_and_scores_that_span_much_a_large_one():
    source = masked_attention("sub_mul")
    assert masks.derived_bounds(source, scaled_feeds(0.3)) == {"neg": 32.0}
    assert masks.derived_bounds(source, scaled_feeds(3.0)) == {"neg": 128.0}


def test_a_masked_fill_bound_needs_only_the_kept_scores():
    """Where(masked, NEG, scores) replaces the masked scores: each becomes -bound whatever it
    was, so the least bound (16) keeps it below every row whose kept maximum is above 0."""
    inputs = scaled_feeds(3.0)
    assert masks.derived_bounds(masked_attention("masked_fill"), inputs) == {"neg": 16.0}


def test_each_of_two_masks_gets_its_own_bound_from_the_positions_it_masks():
    """A padding mask and a causal bias: each is derived from the positions it masks (written
    as 0 alone, it raises them), both at most ``MASK_BOUND``."""
    bounds = masks.derived_bounds(masked_attention("causal"), scaled_feeds(1.0))
    assert list(bounds) == ["neg", "causal_bias"]
    assert all(16 <= b <= masks.MASK_BOUND and np.log2(b) % 1 == 0 for b in bounds.values())


def test_a_row_masked_whole_gets_the_largest_bound():
    source = masked_attention("sub_mul")
    assert masks.derived_bounds(source, feeds([0] * TOKENS)) == {"neg": masks.MASK_BOUND}


@pytest.mark.parametrize("mask", ["sub_mul", "masked_fill"])
def test_a_mask_that_masks_nothing_on_the_proof_inputs_keeps_the_largest_bound(mask):
    """Every token kept (khmer-segmenter's package feeds its mask all true): the inputs say
    nothing of the scores a mask would meet, so it keeps ``MASK_BOUND``, not the least bound."""
    source = masked_attention(mask)
    assert masks.derived_bounds(source, feeds([1] * TOKENS)) == {"neg": masks.MASK_BOUND}


def test_a_model_without_a_mask_derives_no_bound():
    assert masks.derived_bounds(masked_attention("scaled_after"), feeds([1] * 5 + [0] * 3)) == {}


def test_import_falls_back_to_the_largest_bound_where_the_derived_one_fails_the_proof(monkeypatch):
    """Many masked positions near their row's maximum can add up past the proof's tolerance at
    the derived bound; import then proves -256 before it keeps the export's constant."""
    from npubuild.stages import importer

    monkeypatch.setattr(masks, "derived_bounds", lambda model, feeds: {"neg": 1.0})
    model, figures = importer.bounded_masks(masked_attention("sub_mul"), feeds([1] * 5 + [0] * 3))
    assert figures["bounds"] == {"neg": -masks.MASK_BOUND} and figures["bit_identical"]


def test_a_causal_mask_folded_into_a_position_bias_is_bounded_and_the_bias_kept():
    """T5's decoder at a fixed length: its causal mask and relative position bias fold into one
    constant [1, heads, T, T] of the bias's values (here -40 .. 10) and finfo.min above the
    diagonal. Import writes only the masked entries as the derived bound, the position bias as
    it was, within the proof's tolerance; the sum the Softmax reads then spans the bound plus
    the scores, not 3.4e38."""
    from npubuild.stages import importer

    source = masked_attention("causal_position_bias")
    inputs = scaled_feeds(1.0)
    model, figures = importer.bounded_masks(source, inputs)
    assert figures["constants"] == 2 and set(figures["bounds"]) == {"neg", "causal_bias"}
    folded = next(v for v in constants(source) if v.ndim == 4)
    written = next(v for v in constants(model) if v.ndim == 4)
    masked = folded < -masks.MASK_BOUND
    assert np.array_equal(written[~masked], folded[~masked])
    assert np.all(written[masked] == figures["bounds"]["causal_bias"])
    y, got = (onnx_io.run(m, inputs)["y"] for m in (source, model))
    assert np.abs(got - y).max() <= 1e-5 * np.abs(y).max()


def test_a_large_negative_bias_beside_a_mask_is_no_mask():
    """Values between -128 and -256 beside the masked ones: no clean gap between a bias and a
    mask, so the constant is left as written."""
    assert not masks.is_mask_constant(np.array([0.0, -200.0, FINFO_MIN], np.float32))
    assert masks.is_mask_constant(np.array([0.0, -100.0, 7.5, -3.4e38], np.float32))
