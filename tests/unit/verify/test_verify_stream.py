"""verify's figures streamed sample by sample (`judge.TensorStream`, `verdict.Streamed`): the
same bytes as `judge.tensor_metrics` over every sample's arrays, holding one sample at a time."""

from __future__ import annotations

import gc
import json
import weakref

import numpy as np
import pytest

from npubuild.verify import judge as judge_module
from npubuild.verify.judge import PairwiseSums, TensorStream, tensor_metrics

RNG = np.random.default_rng(7)


def streamed(refs, gots, axis=1, count=None):
    stream = TensorStream(len(refs) if count is None else count, axis)
    for r, g in zip(refs, gots):
        stream.add(r, g)
    return stream.metrics()


def same(a: dict, b: dict) -> None:
    assert json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)


@pytest.mark.parametrize("total", [1, 7, 8, 100, 128, 129, 1000, 4099, 65536 + 13])
def test_pairwise_sums_are_numpys_sum_of_the_whole_run(total):
    values = RNG.standard_normal(total) * 10.0 ** RNG.uniform(-4, 4, total)
    rows = RNG.standard_normal((3, total))
    cuts = sorted(set(RNG.integers(0, total, 5).tolist()) | {0, total})
    sums = PairwiseSums(total)
    for a, b in zip(cuts, cuts[1:]):
        sums.add(values[a:b], rows[:, a:b])
    whole, per_row = sums.sums()
    assert whole == np.sum(values)  # the bits, not approximately
    assert np.array_equal(per_row, np.sum(rows, axis=1))


CASES = {
    "conv maps": ([1, 8, 12, 12], 4, 0.01),
    "a long output": ([1, 40, 700], 3, 0.001),
    "one element": ([1], 5, 0.1),
    "channels last": ([1, 30, 5], 2, 0.05),
    "channels last, long rows": ([1, 300, 7], 3, 0.01),
    "a batch": ([2, 5, 40], 3, 0.01),
    "a quiet sample": ([1, 4, 9, 9], 4, 0.02),
    "float32 odd sizes": ([1, 3, 37, 53], 6, 0.003),
    "a dead channel": ([1, 6, 50], 3, 0.0),
}


@pytest.mark.parametrize("name", sorted(CASES))
@pytest.mark.parametrize("held", [True, False])
def test_a_stream_gives_tensor_metrics_bytes(name, held, monkeypatch):
    if not held:  # never held: every figure from the streamed sums
        monkeypatch.setattr(judge_module, "HELD_BYTES", -1)
    shape, count, noise = CASES[name]
    refs = [RNG.standard_normal(shape).astype(np.float32) * RNG.uniform(0.5, 3) for _ in range(count)]
    if name == "a quiet sample":
        refs[1] *= 1e-4
    gots = [(r + RNG.normal(0, noise, r.shape)).astype(np.float32) for r in refs]
    if name == "a dead channel":
        refs[0][:, 2] += np.linspace(0, 1e-2, 50)
        for g in gots:
            g[:, 2] = 0.25
    axis = -1 if name.startswith("channels last") else 1
    same(streamed(refs, gots, axis), tensor_metrics(refs, gots, axis))


@pytest.mark.parametrize("case", ["sizes vary", "not finite", "integers", "shapes differ"])
def test_what_the_tree_cannot_sum_is_judged_from_the_held_samples(case):
    refs = [RNG.standard_normal((1, 4, n)) for n in (10, 10, 10)]
    gots = [r + RNG.normal(0, 0.01, r.shape) for r in refs]
    if case == "sizes vary":
        refs[1], gots[1] = refs[1][..., :7], gots[1][..., :7]
    elif case == "not finite":
        refs[2][0, 1, 3] = gots[2][0, 1, 3] = -np.inf
    elif case == "integers":
        refs, gots = [np.round(r * 9).astype(np.int64) for r in refs], [
            np.round(g * 9).astype(np.int64) for g in gots]
    else:
        gots[1] = gots[1][..., :8]
    same(streamed(refs, gots), tensor_metrics(refs, gots))


def test_past_the_held_bytes_the_exceptions_are_judged_in_sample_order(monkeypatch):
    monkeypatch.setattr(judge_module, "HELD_BYTES", -1)
    refs = [RNG.standard_normal((1, 4, n)) for n in (10, 7, 10)]
    gots = [r + RNG.normal(0, 0.01, r.shape) for r in refs]
    mine, theirs = streamed(refs, gots), tensor_metrics(refs, gots)
    assert mine.keys() == theirs.keys()
    for key, value in theirs.items():
        if isinstance(value, (float, dict)):
            assert mine[key] == pytest.approx(value, rel=1e-12), key
        else:
            assert mine[key] == value, key


def test_a_stream_holds_no_sample_past_its_add(monkeypatch):
    """A sample's arrays are free once the next one is added: what the verify stage relies on
    to judge a 3-D U-Net's 128³ hand-over tensors one sample at a time."""
    monkeypatch.setattr(judge_module, "HELD_BYTES", -1)
    stream, alive = TensorStream(4), []
    for _ in range(4):
        ref = RNG.standard_normal((1, 8, 20, 20))
        got = ref + RNG.normal(0, 0.01, ref.shape)
        alive += [weakref.ref(ref), weakref.ref(got)]
        stream.add(ref, got)
        del ref, got
        gc.collect()
        assert not any(a() is not None for a in alive)
    assert stream.metrics()["cosine"] > 0.99


@pytest.mark.parametrize("held", [True, False])
def test_a_streamed_verdict_is_judges(held, monkeypatch):
    """Outputs (one the original lacks), hand-over tensors, a slice, the task and a reading
    under another spec: the same figures and lines as `verdict.judge` of every sample."""
    from npubuild.recipe.model import VerifySpec
    from npubuild.verify.verdict import Streamed, judge

    if not held:
        monkeypatch.setattr(judge_module, "HELD_BYTES", -1)
    spec = VerifySpec(min_cosine=0.999, task="classifier", handover={"min_cosine": 0.99},
                      slices=[{"tensor": "maps", "axis": 1, "start": 2, "name": "tail"}])
    refs, gots, floats = [], [], []
    for _ in range(5):
        logits, maps = RNG.standard_normal((1, 10)), RNG.standard_normal((1, 6, 9, 9))
        extra = RNG.standard_normal((1, 3, 40))
        refs.append({"logits": logits})
        floats.append({"logits": logits, "extra": extra, "maps": maps})
        gots.append({"logits": logits + RNG.normal(0, 0.05, logits.shape),
                     "extra": extra + RNG.normal(0, 0.01, extra.shape),
                     "maps": (maps + RNG.normal(0, 0.02, maps.shape)).astype(np.float32)})
    outputs, handed_over = ["logits", "extra"], ["maps"]
    theirs = judge(spec, refs, gots, floats, outputs, handed_over, ["extra"])
    streamed = Streamed(spec, 5, outputs, handed_over, ["extra"])
    for r, g, f in zip(refs, gots, floats):
        streamed.add(r, g, f)
    mine = streamed.verdict()
    for field in ("outputs", "npu_outputs", "slices", "task", "failures"):
        assert json.dumps(getattr(mine, field)) == json.dumps(getattr(theirs, field)), field
    assert mine.failures and mine.bisect() == theirs.bisect()
    other = spec.model_copy(update={"min_cosine": 0.5, "min_task_agreement": 0.1})
    assert streamed.verdict(other).failures == judge(other, refs, gots, floats, outputs,
                                                     handed_over, ["extra"]).failures
