"""Random DAGs with random support sets: every node in exactly one segment, no cycle between
segments, each submodel valid, and running them in order equals the original model."""

from __future__ import annotations

import tempfile

import numpy as np
import onnx
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npubuild import onnx_io, proofs
from npubuild.recipe.model import SplitSpec
from npubuild.runtime import Runner
from npubuild.split import plan_split, split_model
from npubuild.split import graph_infos
from npubuild.split.partition import segment_of
from npubuild.targets import load_chip
from tests.unit.split.split_models import Net

UNARY = ["Relu", "Sigmoid", "Neg", "Abs", "Sin"]  # Sin is not on npu-16m
BINARY = ["Add", "Mul"]


@st.composite
def dags(draw):
    n = draw(st.integers(1, 12))
    net = Net()
    tensors = [net.input("x", [1, 2, 3, 3])]
    read: set[str] = set()
    for i in range(n):
        op = draw(st.sampled_from(UNARY + BINARY))
        arity = 2 if op in BINARY else 1
        args = [draw(st.sampled_from(tensors)) for _ in range(arity)]
        read.update(args)
        tensors.append(net.op(op, args, name=f"v{i}"))
    sinks = [t for t in tensors[1:] if t not in read]
    extra = draw(st.lists(st.sampled_from(tensors[1:]), max_size=2, unique=True))
    model = net.model(list(dict.fromkeys(sinks + extra)))
    on_cpu = draw(st.lists(st.sampled_from([f"v{i}" for i in range(n)]), unique=True, max_size=n))
    spec = SplitSpec(force_cpu=on_cpu, min_npu_nodes=draw(st.integers(1, 3)),
                     policy=draw(st.sampled_from(["npu_first", "npu_first", "min_cost"])))
    return model, spec


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dags())
def test_random_dags_split_into_convex_ordered_segments_that_reproduce_the_model(case):
    model, spec = case
    chip = load_chip("npu-16m")
    plan = plan_split(model, chip, spec)
    og = plan.graph
    placed = sorted(i for s in plan.segments for i in s.nodes)
    assert placed == list(range(len(og)))                      # each node exactly once
    seg = segment_of(plan.segments, len(og))
    for i, preds in enumerate(og.preds):
        for p in preds:                                         # no edge goes back: no cycle
            assert seg[p] < seg[i] or (seg[p] == seg[i] and plan.on_npu[p] == plan.on_npu[i])
    for s in plan.segments:
        assert {plan.on_npu[i] for i in s.nodes} == {s.device == "npu"}
    with tempfile.TemporaryDirectory() as out:
        split_model(model, chip, spec, out)                     # proves equality itself
        infos = graph_infos.read(out)
        assert graph_infos.problems(infos) == []
        for g in infos["graphs"]:
            onnx.checker.check_model(onnx.load(f"{out}/{g['model_info']['model_path']}"))
        feeds = proofs.make_feeds(model, seed=11)
        expected = onnx_io.run(model, feeds)
        got = Runner(out).run(feeds)
        for name, value in expected.items():
            np.testing.assert_allclose(got[name], value, rtol=1e-5, atol=1e-6)
