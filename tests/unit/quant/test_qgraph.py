"""The qgraph file format: save and load round trip, strict loading."""

from __future__ import annotations

import json

import numpy as np
import pytest

from npubuild.errors import BuildError
from npubuild.quant.qgraph import QGraph
from npubuild.quant.reference import quantize_inputs, run_reference
from tests.unit.quant.helpers import feeds_for, quantize
from tests.unit.quant.test_kernels_vs_ort import CASES


@pytest.mark.parametrize("case", ["conv_relu", "silu_pattern", "avgpool", "softmax_channels", "add_const"])
def test_round_trip_runs_identically(tmp_path, case):
    m = CASES[case]()
    feeds = feeds_for(m)
    qg, _, _ = quantize(m, feeds, scheme="pow2_symmetric")
    json_path, npz_path = qg.save(tmp_path / "graph_0.qgraph.json")
    assert npz_path.name == "graph_0.qgraph.npz"
    loaded = QGraph.load(json_path)
    with np.load(npz_path, allow_pickle=False) as npz:  # no pickled objects inside
        assert all(npz[k].dtype != object for k in npz.files)
    a = run_reference(qg, quantize_inputs(qg, feeds[0]))
    b = run_reference(loaded, quantize_inputs(loaded, feeds[0]))
    assert a.keys() == b.keys()
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_document_describes_layers_and_tensors(tmp_path):
    m = CASES["conv_relu"]()
    qg, _, _ = quantize(m, feeds_for(m), scheme="pow2_symmetric")
    path, _ = qg.save(tmp_path / "g.qgraph.json")
    doc = json.loads(path.read_text())
    assert doc["format"] == "npubuild.qgraph" and doc["rounding"] == "half_up"
    (layer,) = doc["layers"]
    assert layer["kind"] == "conv" and layer["params"]["activation"] == "relu"
    assert {"input_log2scale", "weight_log2scale", "output_log2scale", "output_shift"} <= set(layer["params"])
    assert layer["arrays"]["weight"]["dtype"] == "int8" and layer["arrays"]["bias"]["dtype"] == "int32"
    assert doc["tensors"]["y"]["log2scale"] is not None


def test_wrong_format_is_refused(tmp_path):
    path = tmp_path / "x.qgraph.json"
    path.write_text(json.dumps({"format": "something else"}))
    with pytest.raises(BuildError, match="not a npubuild.qgraph"):
        QGraph.load(path)


def test_layers_sharing_one_weight_store_it_once_and_load_it_read_only(tmp_path):
    """An unrolled recurrence's steps each hold the same recurrent weights (nakdimon: 256
    copies of four 400x1600 weights): the file keeps one, and the graph runs as before."""
    from onnx import helper

    from tests.unit.quant.helpers import model

    rng = np.random.default_rng(0)
    weight = rng.standard_normal((4, 4, 1, 1)).astype(np.float32)
    m = model([helper.make_node("Conv", ["x", "W"], ["h"]),
               helper.make_node("Conv", ["h", "W"], ["y"])],
              {"x": [1, 4, 3, 3]}, {"y": [1, 4, 3, 3]}, {"W": weight})
    feeds = feeds_for(m)
    qg, _, _ = quantize(m, feeds, scheme="symmetric")
    first, second = (layer.arrays["weight"] for layer in qg.layers)
    assert np.array_equal(first, second)
    json_path, npz_path = qg.save(tmp_path / "graph_0.qgraph.json")
    doc = json.loads(json_path.read_text())
    keys = [layer["arrays"]["weight"]["key"] for layer in doc["layers"]]
    assert keys == ["L0.weight", "L0.weight"]
    with np.load(npz_path, allow_pickle=False) as npz:
        assert "L1.weight" not in npz.files
    loaded = QGraph.load(json_path)
    assert not loaded.layers[1].arrays["weight"].flags.writeable
    a = run_reference(qg, quantize_inputs(qg, feeds[0]))
    b = run_reference(loaded, quantize_inputs(loaded, feeds[0]))
    assert all(np.array_equal(a[k], b[k]) for k in a)
