"""A channel one BatchNorm squeezes and the next amplifies (issue 21's class: MobileNet-style
depthwise networks, PP-OCRv2's `batch_norm_29.tmp_2`): beside channels spanning ±60 the
squeezed channel is a few int16 steps wide, so no per-tensor scale holds it, in int8 or int16,
and the layer that reads it multiplies its rounding back up. Cross-layer equalisation (its
BatchNorms folded into the convs first) moves the factor from the second conv to the first,
exactly in float; where the recipe leaves it unset, quantize measures it and keeps it because
it scores better, and the recipe as a user writes it passes in int8."""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from npubuild import onnx_io
from npubuild.quant.equalize import equalize, proof_failures
from npubuild.quant.lower import prepare
from tests.conftest import build_on_npy_data

C, SQUEEZED = 8, 3
SHAPE = [1, 3, 12, 12]

def squeezed_model() -> onnx.ModelProto:
    """x → Conv 1×1 (3→8) → BatchNorm (channel 3 scaled by 2e-4, the others by ~30) → Relu →
    depthwise 3×3 → BatchNorm (channel 3 scaled by 1e4) → Relu → Conv 1×1 (8→1, reading
    mostly channel 3): Paddle's layout, BatchNorms apart from their convs."""
    rng = np.random.default_rng(1)
    w1 = rng.normal(size=(C, 3, 1, 1))
    gamma1 = np.full(C, 30.0)
    gamma1[SQUEEZED] = 2e-4
    wd = np.abs(rng.normal(size=(C, 1, 3, 3))) / 9
    gamma2 = np.full(C, 0.05)
    gamma2[SQUEEZED] = 1e4
    w2 = np.full((1, C, 1, 1), 0.01)
    w2[0, SQUEEZED] = 1.0

    def bn(name, x, y, gamma):
        return helper.make_node("BatchNormalization", [x, f"{name}_g", f"{name}_b", f"{name}_m",
                                                       f"{name}_v"], [y], name=name)

    nodes = [helper.make_node("Conv", ["x", "w1"], ["c1"], name="conv1"),
             bn("bn1", "c1", "b1", gamma1), helper.make_node("Relu", ["b1"], ["a1"], name="relu1"),
             helper.make_node("Conv", ["a1", "wd"], ["c2"], name="dw", group=C, pads=[1, 1, 1, 1],
                              kernel_shape=[3, 3]),
             bn("bn2", "c2", "b2", gamma2), helper.make_node("Relu", ["b2"], ["a2"], name="relu2"),
             helper.make_node("Conv", ["a2", "w2"], ["y"], name="head")]
    params = {"w1": w1, "wd": wd, "w2": w2,
              "bn1_g": gamma1, "bn1_b": np.zeros(C), "bn1_m": np.zeros(C), "bn1_v": np.ones(C),
              "bn2_g": gamma2, "bn2_b": np.zeros(C), "bn2_m": np.zeros(C), "bn2_v": np.ones(C)}
    graph = helper.make_graph(
        nodes, "squeezed", [helper.make_tensor_value_info("x", 1, SHAPE)],
        [helper.make_tensor_value_info("y", 1, [1, 1, 12, 12])],
        [numpy_helper.from_array(np.asarray(v, np.float32), k) for k, v in params.items()])
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def _data() -> dict[str, list[np.ndarray]]:
    rng = np.random.default_rng(0)
    return {kind: [rng.uniform(0.0, 2.0, SHAPE) for _ in range(count)]
            for kind, count in (("cal", 4), ("ver", 3))}


def _run(root, name: str, extra: str = ""):
    return build_on_npy_data(root, name, "squeezed.onnx", squeezed_model, _data,
                             quantization=extra)


def test_folding_and_equalising_keep_the_float_function():
    m = prepare(squeezed_model())
    eq, result = equalize(m)
    assert result.folded == ["bn1", "bn2"]
    assert result.pairs == [("conv1", "dw"), ("dw", "head")]
    assert [n.op_type for n in eq.graph.node] == ["Conv", "Relu", "Conv", "Relu", "Conv"]
    rng = np.random.default_rng(2)
    feeds = {"x": rng.uniform(0.0, 2.0, SHAPE).astype(np.float32)}
    assert proof_failures(m, eq, feeds) == []
    ref, got = onnx_io.run(m, feeds)["y"], onnx_io.run(eq, feeds)["y"]
    np.testing.assert_allclose(got, ref, rtol=1e-5, atol=1e-5 * np.abs(ref).max())


def test_the_proof_names_a_rescaling_that_changed_the_function():
    m = prepare(squeezed_model())
    eq, _ = equalize(m)
    w = next(t for t in eq.graph.initializer if t.name == "w2")
    w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 1.01, "w2"))
    feeds = {"x": np.ones(SHAPE, np.float32)}
    assert proof_failures(m, eq, feeds) and "'y'" in proof_failures(m, eq, feeds)[0]


def test_lowering_proves_a_model_whose_batch_norms_were_folded_without_a_pair(monkeypatch):
    """Folding a BatchNorm changes the model even where no pair is then equalised, so lowering
    proves it too: a fold that changed the function stops the build."""
    import pytest

    from npubuild.quant import equalize as cross_layer
    from npubuild.quant.lower import EqualizationNotExact, lower

    def folded_wrongly(model):
        eq, result = equalize(model)
        w = next(t for t in eq.graph.initializer if t.name == "w2")
        w.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(w) * 1.01, "w2"))
        return eq, cross_layer.Result([], [], 0, result.folded)

    monkeypatch.setattr(cross_layer, "equalize", folded_wrongly)
    with pytest.raises(EqualizationNotExact):
        lower(squeezed_model(), equalize=True)


def test_without_equalisation_int8_and_int16_cannot_hold_the_channel(tmp_path):
    result, out = _run(tmp_path, "plain", "  cross_layer_equalization: false\n"
                                          "  auto: {precision: int16}\n")
    assert result.returncode == 1
    report = json.loads((out / "report.json").read_text())
    assert not report["quantization"]["int8_verdict"]["passed"]
    search = json.loads((out / "quantize" / "search.json").read_text())
    assert not search["passed"]


def test_the_squeezed_channel_passes_as_written_with_equalisation_chosen_by_measurement(tmp_path):
    result, out = _run(tmp_path, "written")
    assert result.returncode == 0, result.stderr
    report = json.loads((out / "report.json").read_text())
    quantization = report["quantization"]
    measured = quantization["equalization_measured"]
    assert measured["kept"] and measured["pairs"] == 2 and measured["folded_batch_norms"] == 2
    assert measured["with"][0] > 0 > measured["without"][0]
    assert quantization["cross_layer_equalization"] is True
    assert "search" not in quantization  # int8 passes once equalised: nothing kept wider
    assert report["simulator"]["bit_exact"]
    assert report["accuracy"]["outputs"]["y"]["cosine"] >= 0.99
    assert "cross_layer_equalization" in (out / "recipe.lock").read_text()
    calibration = json.loads((out / "quantize" / "calibration.json").read_text())
    assert calibration["graphs"]["graph_0"]["equalization"]["folded_batch_norms"] == ["bn1", "bn2"]
