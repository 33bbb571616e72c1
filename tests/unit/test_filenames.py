"""File names from tensor names: plain short names kept, others safe, bounded and unique."""

from npubuild.filenames import MAX_STEM, safe_stem


def test_a_plain_short_name_is_kept():
    assert safe_stem("conv0_weight") == "conv0_weight"


def test_unsafe_or_long_names_are_sanitised_bounded_and_hashed():
    long = "/backbone/" + "scope:0/" * 100 + "Conv"
    stem = safe_stem(long)
    assert len(stem) <= MAX_STEM and "/" not in stem and ":" not in stem
    assert stem == safe_stem(long)  # deterministic
    assert safe_stem("a/b") != safe_stem("a_b") and safe_stem("a/b").startswith("a_b-")
    assert safe_stem(long + "x") != stem  # same truncated prefix, different names
    assert safe_stem("conv0", hashed=True).startswith("conv0-")
