"""`quantization.auto` where no single tensor is enough (int8 error spread over a whole depthwise
backbone, as PP-OCRv4's): the binary search over prefixes of the sensitivity ranking reaches the
target with the fewest, in about log2(candidates) + DROP_TRIES evaluations, and a limit that
cannot reach it keeps what helps most and says so."""

from __future__ import annotations

from npubuild.quant.workflow import DROP_TRIES, AutoSearch, AutoTarget

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
    assert search.evaluations <= 2 + 9 + DROP_TRIES      # before, whole prefix, bisection, drops


def test_max_overrides_stops_the_search_and_keeps_the_best():
    search = SpreadError()
    result = search.run(AutoTarget(min_cosine=0.99, max_overrides=40), [], None)
    assert not result.reached
    assert len(result.chosen) == 40 and abs(result.after - 0.94) < 1e-9
