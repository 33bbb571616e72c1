"""The classes of int8 failure real models showed, each on a small model built here, through
the quantize stage as a user writes the recipe (no scheme, no method, no override): int8 misses
verify's bar and the precision search — which measures each tensor end to end, through the CPU
segments after it, on every verify sample — keeps the tensor the class needs out of int8.

- a log/power audio front end: STFT as a conv, the power spectrum on the NPU, Log on the CPU
  (int8 rounds the quiet bins the Log magnifies to 0);
- a concat of branches of very different ranges (one int8 scale for all: the small ones are
  lost);
- a regressor ending in Gemm (landmark coordinates: one int8 step of the whole range is a
  pixel, the small movements round away);
- recurrent state carried out of the model (an LSTM, unrolled at import, fed by NPU features).
"""

from __future__ import annotations

import json

import numpy as np
import onnx
import pytest

from tests.conftest import run_cli, write_recipe
from tests.unit.split.split_models import Net

RECIPE = """\
version: 1
name: {name}
model:
  path: {name}.onnx
  inputs: [{inputs}]
target: npu-16m
quantization:
{quantization}  calibration: {{data: "{name}/cal_*.npz", samples: 4}}
verify:
  data: "{name}/ver_*.npz"
  samples: 3
  min_cosine: 0.99
"""


def build(root, name: str, model: onnx.ModelProto, make, inputs: str, quantization: str = ""):
    """Write the model, 4 calibration and 3 verify samples (``make(rng)`` → feeds), run
    quantize; the report and search.json (empty without a search)."""
    onnx.save(model, root / f"{name}.onnx")
    (root / name).mkdir()
    rng = np.random.default_rng(7)
    for i in range(4):
        np.savez(root / name / f"cal_{i}.npz", **make(rng))
    for i in range(3):
        np.savez(root / name / f"ver_{i}.npz", **make(rng))
    recipe = write_recipe(root, RECIPE.format(name=name, inputs=inputs, quantization=quantization),
                          name=f"{name}.yaml")
    result = run_cli("run", str(recipe), "quantize", "--build-dir", str(root / "build"),
                     "--cache", str(root / "cache"))
    assert result.returncode == 0, result.stderr
    out = root / "build" / name
    report = json.loads((out / "report.json").read_text())
    search = out / "quantize" / "search.json"
    return report, json.loads(search.read_text()) if search.is_file() else {}


def chosen(search: dict) -> set[str]:
    return {c["tensor"] for c in search.get("chosen", [])}


# A toy model runs in well under a microsecond on the NPU, so one CPU hand-over (the search
# prices each at `npubuild.split.cost.SWITCH_SECONDS`, 20 µs) is hundreds of times its int8
# time: these tests are about which tensors fix each class, so they accept that cost; the
# budget has its own test below.
TOY_BUDGET = "  auto: {max_slowdown: 100000}\n"


def searched(root, name: str, model: onnx.ModelProto, make, inputs: str,
             quantization: str = TOY_BUDGET) -> set[str]:
    """``build``, checking int8 alone misses verify's bar and the search reaches it: the
    tensors the search kept out of int8."""
    report, search = build(root, name, model, make, inputs, quantization)
    assert not report["quantization"]["int8_verdict"]["passed"]
    assert search["passed"] and search["chosen"], search
    return chosen(search)


@pytest.fixture(scope="module")
def root(tmp_path_factory):
    return tmp_path_factory.mktemp("classes")


def stft_power_log() -> onnx.ModelProto:
    """audio [1, 1, 1, 512] → a conv whose 32 kernels are a Hann-windowed cosine and sine
    per bin (an STFT) → re² + im² on the NPU → Log on the CPU → [1, 16, 1, 29]."""
    net = Net()
    x = net.input("audio", [1, 1, 1, 512])
    n = np.arange(64)
    window = np.hanning(64)
    kernels = [np.cos(2 * np.pi * k * n / 64) * window for k in range(1, 17)]
    kernels += [np.sin(2 * np.pi * k * n / 64) * window for k in range(1, 17)]
    w = net.init("stft.w", np.asarray(kernels, np.float32).reshape(32, 1, 1, 64))
    spec = net.op("Conv", [x, w], name="stft", kernel_shape=[1, 64], strides=[1, 16])
    re, im = net.op("Split", [spec, net.init("halves", np.array([16, 16]))], name="split",
                    outputs=2, axis=1)
    power = net.op("Add", [net.op("Mul", [re, re], name="re2"), net.op("Mul", [im, im], name="im2")],
                   name="power")
    floor = net.op("Add", [power, net.init("eps", np.float32(1e-6))], name="floor")
    return net.model([net.op("Log", [floor], name="log_power")])


def tones(rng) -> dict:
    """Two loud partials and many quiet ones (a voice over a noise floor)."""
    t = np.arange(512) / 512
    x = 0.8 * np.sin(2 * np.pi * 48 * t) + 0.3 * np.sin(2 * np.pi * rng.integers(60, 120) * t)
    x += sum(rng.uniform(0.002, 0.01) * np.sin(2 * np.pi * f * t + rng.uniform(0, 6))
             for f in range(8, 256, 8))
    return {"audio": x.astype(np.float32).reshape(1, 1, 1, 512)}


def test_a_power_spectrum_feeding_a_log_on_the_cpu(root):
    found = searched(root, "stft", stft_power_log(), tones, "{name: audio, shape: [1, 1, 1, 512]}")
    # what the Log reads: the power (or the Add in front of it) leaves int8
    assert found & {"power_out", "floor_out"}, found


def unlike_branches() -> onnx.ModelProto:
    """A 3x3-conv feature extractor (most of the work, as in a real network), then three
    1x1-conv branches whose outputs span 100, 1 and 0.01 → Concat → 1x1 conv head."""
    net = Net(seed=2)
    x = net.input("x", [1, 4, 8, 8])
    x = net.op("Relu", [net.conv(x, 4, 32, name="features0")], name="relu0")
    x = net.conv(x, 32, 4, name="features1")
    branches = []
    for i, gain in enumerate((100.0, 1.0, 0.01)):
        w = net.init(f"b{i}.w", net.rng.normal(0, gain, (4, 4, 1, 1)).astype(np.float32))
        branches.append(net.op("Conv", [x, w], name=f"branch{i}", kernel_shape=[1, 1]))
    cat = net.op("Concat", branches, name="cat", axis=1)
    scale = np.repeat([0.01, 1.0, 100.0], 4).astype(np.float32)
    w = net.init("head.w", (net.rng.normal(0, 1, (6, 12)) * scale).astype(np.float32)
                 .reshape(6, 12, 1, 1))
    return net.model([net.op("Conv", [cat, w], name="head", kernel_shape=[1, 1])])


def test_a_concat_of_branches_of_very_different_ranges(root):
    """The fix is the concat and the layers around it in float (the head reads 100 and 0.01
    at once): many times int8's time on a model this small, accepted here; the next test
    shows the default budget refusing it."""
    make = lambda rng: {"x": rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)}  # noqa: E731
    found = searched(root, "concat", unlike_branches(), make, "{name: x, shape: [1, 4, 8, 8]}")
    assert "cat_out" in found, found


def test_a_float_choice_over_the_slowdown_budget_keeps_int8_and_says_what_would_pass(root):
    make = lambda rng: {"x": rng.normal(0, 1, (1, 4, 8, 8)).astype(np.float32)}  # noqa: E731
    inputs = "{name: x, shape: [1, 4, 8, 8]}"
    report, search = build(root, "budget", unlike_branches(), make, inputs)  # as a user writes it
    assert not search["passed"] and search["chosen"] == []
    reach = search["what_would_reach"]
    accept = (reach.get("cheapest") or reach["needed"])["max_slowdown_to_accept"]
    assert reach["needed"]["passes"] and 10 < reach["needed"]["slowdown"] and 10 < accept
    assert "quantization.auto.max_slowdown: 10)" in search["note"]
    assert f"set quantization.auto.max_slowdown: {accept:g}" in search["note"]
    report, search = build(root, "accepted", unlike_branches(), make, inputs,
                           quantization=f"  auto: {{max_slowdown: {accept}}}\n")
    assert search["passed"] and "cat_out" in chosen(search)


def landmark_regressor() -> onnx.ModelProto:
    """conv → Relu → global pool → Gemm to 24 coordinates near 100 px that move by a few."""
    net = Net(seed=4)
    x = net.input("x", [1, 3, 16, 16])
    h = net.op("GlobalAveragePool", [net.op("Relu", [net.conv(x, 3, 16, name="features")])])
    flat = net.op("Flatten", [h], name="flat")
    w = net.init("fc.w", net.rng.normal(0, 0.5, (24, 16)).astype(np.float32))
    b = net.init("fc.b", np.full(24, 100.0, np.float32))
    return net.model([net.op("Gemm", [flat, w, b], name="coords", transB=1)])


def test_a_regressor_ending_in_gemm(root):
    make = lambda rng: {"x": rng.uniform(0, 1, (1, 3, 16, 16)).astype(np.float32)}  # noqa: E731
    found = searched(root, "landmarks", landmark_regressor(), make, "{name: x, shape: [1, 3, 16, 16]}")
    assert "coords_out" in found, found


def conv_lstm() -> onnx.ModelProto:
    """features [1, 4, 16] → Conv1d → Relu → Conv1d → Relu → the 16 steps → LSTM with its
    state in (h, c) and out (hn, cn): Silero VAD's shape. Import unrolls the LSTM, so its
    state is quantized on the NPU too (once it ran whole on the CPU)."""
    net = Net(seed=8)
    x = net.input("features", [1, 4, 16])
    h0, c0 = net.input("h", [1, 1, 8]), net.input("c", [1, 1, 8])
    h = x
    for i, cin in enumerate((4, 8)):
        w = net.init(f"enc{i}.w", net.rng.normal(0, 0.6, (8, cin, 3)).astype(np.float32))
        h = net.op("Relu", [net.op("Conv", [h, w], name=f"enc{i}", kernel_shape=[3], pads=[1, 1])],
                   name=f"relu{i}")
    seq = net.op("Transpose", [h], name="to_steps", perm=[2, 0, 1])
    rng = net.rng
    wx = net.init("lstm.W", rng.normal(0, 0.8, (1, 32, 8)).astype(np.float32))
    wh = net.init("lstm.R", rng.normal(0, 0.8, (1, 32, 8)).astype(np.float32))
    y, hn, cn = net.op("LSTM", [seq, wx, wh, "", "", h0, c0], name="lstm", outputs=3, hidden_size=8)
    return net.model([hn, cn])


def test_recurrent_state_carried_out_of_the_model(root):
    def make(rng):  # features with a rare spike (speech onset) beside quiet frames
        features = rng.normal(0, 0.3, (1, 4, 16)).astype(np.float32)
        features[0, rng.integers(4), rng.integers(16)] = 25.0
        return {"features": features,
                "h": rng.normal(0, 0.3, (1, 1, 8)).astype(np.float32),
                "c": rng.normal(0, 0.6, (1, 1, 8)).astype(np.float32)}
    inputs = ("{name: features, shape: [1, 4, 16]}, {name: h, shape: [1, 1, 8]}, "
              "{name: c, shape: [1, 1, 8]}")
    # the recipe as a user writes it: the default budget (quantization.auto.max_slowdown:
    # 10). Its int16 gate tables were priced at their 65,536 entries read every frame, an
    # estimated 91x its int8 time (TOY_BUDGET was needed); stored and priced over the span
    # where Sigmoid and Tanh still change (`schemes.trim_lut`), int16 gates fit
    report, search = build(root, "lstm", conv_lstm(), make, inputs)
    outputs = report["accuracy"]["outputs"]
    assert {"lstm_out1", "lstm_out2"} <= set(outputs)
    if report["quantization"]["int8_verdict"]["passed"]:
        pytest.skip("int8 already keeps this LSTM's state")
    assert search["passed"] and search["chosen"], search
    assert all(min(m["cosine"], m["min_sample_cosine"] or 1) >= 0.99 for m in outputs.values())
