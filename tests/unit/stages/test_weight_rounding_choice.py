"""quantize's choice of weight rounding where the recipe leaves it unset: judged where it will
be deployed (int16 everywhere only when the precision search will run and may use int16)."""

from __future__ import annotations

from types import SimpleNamespace

from npubuild.stages.quantize import measured_weight_rounding

# margins as BlazePose's landmark model measured them: GPTQ better with int16 activations,
# worse with int8 ones
MARGINS = {("int8", "nearest"): -0.376, ("int8", "gptq"): -0.406,
           ("int16", "nearest"): -0.174, ("int16", "gptq"): -0.097}


class Workflow:
    def __init__(self):
        self.options = SimpleNamespace(chip_int16=True)
        self.rounding = "nearest"

    def use_weight_rounding(self, rounding):
        self.rounding = rounding

    def deployed_values(self, samples, kept):
        return ("int8", self.rounding)

    def widest_integer_values(self, samples, kept):
        return ("int16", self.rounding)


def judge(values):
    return SimpleNamespace(passed=False, margin=lambda: MARGINS[values], values=values)


judge.kept = []


def test_gptq_is_kept_where_the_search_will_use_int16_and_gptq_scores_better_there():
    workflow = Workflow()
    verdict, measured = measured_weight_rounding(workflow, judge, [], judge(("int8", "nearest")))
    assert workflow.rounding == "gptq" and verdict.values == ("int8", "gptq")
    assert measured == {"judged_at": "int16 everywhere", "nearest": -0.174, "gptq": -0.097}


def test_without_the_search_the_rounding_is_judged_in_int8_as_deployed():
    workflow = Workflow()
    verdict, measured = measured_weight_rounding(workflow, judge, [], judge(("int8", "nearest")),
                                                 searched=False)
    assert workflow.rounding == "nearest" and verdict.values == ("int8", "nearest")
    assert measured == {"judged_at": "int8", "nearest": -0.376, "gptq": -0.406}
