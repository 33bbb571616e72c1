"""The runner: submodels in order, one backend per device, the original model's outputs."""

from __future__ import annotations

import json

import numpy as np
import pytest

from npubuild import onnx_io, proofs
from npubuild.errors import BuildError, UserError
from npubuild.runtime import OnnxRuntimeBackend, Runner
from npubuild.split import split_model
from npubuild.targets import load_chip
from tests.unit.split.split_models import chain


@pytest.fixture(scope="module")
def split_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("split")
    model = chain("Conv", "Sin", "Conv", "Sin")
    split_model(model, load_chip("npu-16m"), None, out)
    return out, model


def test_npu_backend_is_pluggable(split_dir):
    out, model = split_dir
    calls, ort = [], OnnxRuntimeBackend()

    def simulator(graph, feeds):
        calls.append((graph.index, graph.device, sorted(feeds), graph.context_dir.name))
        return ort(graph, feeds)

    feeds = proofs.make_feeds(model, seed=4)
    got = Runner(out, backends={"npu": simulator}).run(feeds)
    assert calls == [(0, "npu", ["x"], "graph_ir_0"), (2, "npu", ["n1_out"], "graph_ir_2")]
    np.testing.assert_array_equal(got["n3_out"], onnx_io.run(model, feeds)["n3_out"])


def test_keep_intermediates_returns_every_boundary_tensor(split_dir):
    out, model = split_dir
    feeds = proofs.make_feeds(model)
    runner = Runner(out)
    assert sorted(runner.run(feeds)) == ["n3_out"]
    everything = runner.run(feeds, keep_intermediates=True)
    assert sorted(everything) == ["n0_out", "n1_out", "n2_out", "n3_out", "x"]
    reference = onnx_io.run(onnx_io.clone(model), feeds)
    np.testing.assert_array_equal(everything["n3_out"], reference["n3_out"])


@pytest.mark.parametrize("feeds,message", [
    ({}, r"takes inputs \['x'\]; missing \['x'\]"),
    ({"x": np.zeros((1, 4, 8, 8), np.float32), "y": 1}, r"unknown \['y'\]"),
    ({"x": np.zeros((1, 4, 4, 4), np.float32)}, r"input 'x' has shape \[1, 4, 4, 4\], the model expects \[1, 4, 8, 8\]"),
])
def test_bad_feeds_are_user_errors(split_dir, feeds, message):
    with pytest.raises(UserError, match=message):
        Runner(split_dir[0]).run(feeds)


def test_a_backend_that_drops_an_output_is_a_build_error(split_dir):
    runner = Runner(split_dir[0], backends={"npu": lambda graph, feeds: {}})
    with pytest.raises(BuildError, match="graph_0 \\(npu backend\\) returned no 'n0_out'"):
        runner.run({"x": np.zeros((1, 4, 8, 8), np.float32)})


def test_an_invalid_graph_infos_is_refused(tmp_path, split_dir):
    data = json.loads((split_dir[0] / "graph_infos.json").read_text())
    data["graphs"][0]["device"] = "tpu"
    (tmp_path / "graph_infos.json").write_text(json.dumps(data))
    with pytest.raises(UserError, match="not a valid graph_infos.json: graphs/0/device"):
        Runner(tmp_path)
    with pytest.raises(UserError, match="not found"):
        Runner(tmp_path / "nowhere")


def test_keep_returns_the_tensors_asked_and_lets_go_of_the_others_after_their_reader(split_dir):
    """verify's sample run keeps the outputs and the NPU hand-over tensors: a tensor between
    submodels that nothing keeps is freed once its last reader ran, not held to the end."""
    import gc
    import weakref

    out, model = split_dir
    feeds, ort, seen, alive_at = proofs.make_feeds(model), OnnxRuntimeBackend(), {}, {}

    def backend(graph, inputs):
        gc.collect()
        alive_at[graph.index] = sorted(t for t, ref in seen.items() if ref() is not None)
        got = ort(graph, inputs)
        seen.update({t: weakref.ref(got[t]) for t in graph.outputs})
        return got

    runner = Runner(out, backends={"npu": backend, "cpu": backend})
    got = runner.run(feeds, keep=["n1_out"])
    assert alive_at[3] == ["n1_out", "n2_out"]  # n0_out freed after graph 1 read it
    assert sorted(got) == ["n1_out", "n3_out"]
    everything = Runner(out).run(feeds, keep_intermediates=True)
    for name in got:
        np.testing.assert_array_equal(got[name], everything[name])
