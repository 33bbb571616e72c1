"""`quantization.auto` where no single tensor is enough (int8 error spread over a whole depthwise
backbone, as PP-OCRv4's): the binary search over prefixes of the sensitivity ranking reaches the
target with the fewest, in about log2(candidates) + DROP_EVALUATIONS evaluations; where a few
tensors matter among many that do not, the drop pass keeps only the few; and a limit that
cannot reach it keeps what helps most and says so."""

from __future__ import annotations

from npubuild.quant.workflow import DROP_EVALUATIONS, AutoSearch, AutoTarget

TENSORS = [f"t{i}" for i in range(300)]


class SpreadError(AutoSearch):
    """Each int16 tensor adds 0.001 to an output cosine of 0.9, whichever it is."""

    def __init__(self):
        self.evaluations = 0
        self.tried = []

    def ranked(self, evaluation):
        return TENSORS

    def output_cosine(self, overrides):
        self.evaluations += 1
        return 0.9 + 0.001 * len({t for o in overrides for t in o.tensors})


def test_a_target_single_tensors_cannot_reach_is_reached_with_the_fewest():
    search = SpreadError()
    result = search.run(AutoTarget(min_cosine=0.95), [], None)
    assert result.reached and result.after >= 0.95
    assert len(result.chosen) == 50
    assert search.evaluations <= 2 + 9 + DROP_EVALUATIONS  # before, whole prefix, bisection, drops


class FewMatter(SpreadError):
    """Only t3 and t40 matter (0.05 each), and the ranking puts t40 40th: every prefix that
    reaches the target carries 39 tensors that buy nothing."""

    def output_cosine(self, overrides):
        self.evaluations += 1
        return 0.9 + 0.05 * len({t for o in overrides for t in o.tensors} & {"t3", "t40"})


def test_the_drop_pass_keeps_only_the_tensors_that_matter_from_a_long_prefix():
    search = FewMatter()
    result = search.run(AutoTarget(min_cosine=0.99), [], None)
    assert result.reached
    assert [o.tensors for o in result.chosen] == [("t3",), ("t40",)]
    assert search.evaluations <= 2 + 9 + DROP_EVALUATIONS


def test_max_overrides_stops_the_search_and_keeps_the_best():
    search = SpreadError()
    result = search.run(AutoTarget(min_cosine=0.99, max_overrides=40), [], None)
    assert not result.reached
    assert len(result.chosen) == 40 and abs(result.after - 0.94) < 1e-9
