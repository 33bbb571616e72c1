"""`quantization.auto` past one tensor at a time: when every tensor buys only a little (int8
error spread over a whole depthwise backbone), the k most sensitive tensors together reach the
target, with k within an eighth of the fewest."""

from __future__ import annotations

from npubuild.quant.workflow import AutoSearch, AutoTarget

TENSORS = [f"t{i}" for i in range(300)]


class SpreadError(AutoSearch):
    """Each int16 tensor adds 0.001 to an output cosine of 0.9, whichever it is."""

    def __init__(self):
        self.evaluations = 0

    def ranked(self, evaluation):
        return TENSORS

    def output_cosine(self, overrides):
        self.evaluations += 1
        return 0.9 + 0.001 * len({t for o in overrides for t in o.tensors})


def test_widening_reaches_a_target_single_tensors_cannot():
    search = SpreadError()
    result = search.run(AutoTarget(min_cosine=0.95, max_overrides=256, candidates=24), [], None)
    assert result.reached and result.after >= 0.95
    assert 50 <= len(result.chosen) <= 50 * 9 // 8
    assert search.evaluations < 24 + 12                  # greedy, doubling, bisection
    assert any("most_sensitive" in row for row in result.tried)


def test_widening_stops_at_max_overrides_and_keeps_the_best():
    search = SpreadError()
    result = search.run(AutoTarget(min_cosine=0.99, max_overrides=40, candidates=4), [], None)
    assert not result.reached
    assert len(result.chosen) == 40 and abs(result.after - 0.94) < 1e-9
