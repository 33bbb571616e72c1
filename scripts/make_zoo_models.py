"""Build the zoo's two hand-made models and their sample data (seeded, so every run writes the
same bytes) for recipes/zoo/speech-vad.yaml and recipes/zoo/transformer-encoder.yaml.

    python3 scripts/make_zoo_models.py [OUT_DIR]      # default: models/zoo/

* ``speech_vad.onnx``: a voice-activity model in the manner of Silero VAD: ``audio`` [1, 1, 512]
  float samples, ``sr`` a scalar int64 sample rate (8000 or 16000) that an ``If`` uses to pick
  the front-end filter bank, three 1-D convolutions, a GRU whose state ``h`` goes in and ``hn``
  comes out, and a 1-D convolution + Sigmoid head (``prob`` [1, 1, 32]).
* ``transformer_encoder.onnx``: ``ids`` [1, 16] int32 token ids, a Gather embedding plus a
  learned position table, two pre-norm encoder layers (LayerNormalization, 4-head attention
  from MatMul and Softmax, a GELU-tanh MLP), a final LayerNormalization (``hidden`` [1, 16, 64]).
* ``speech_<i>.npz`` / ``tokens_<i>.npz``: calibration and verify samples (every input by name):
  speech-like audio (harmonics, a noise floor, silent stretches) at both sample rates, random
  GRU state; token ids drawn over the whole vocabulary.
* ``textline_<H>x<W>_<i>.npy``: text-line crops of scikit-image's scanned ``page.png`` and
  ``text.png`` (upright and turned 180 degrees), preprocessed as RapidOCR feeds PP-OCR's
  recognizer (48x320) and direction classifier (48x192): ``(x / 255 - 0.5) / 0.5``, NCHW.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "models" / "zoo"
IR_VERSION = 8            # ONNX Runtime 1.31 reads IR <= 13; 8 matches opset 17
OPSET = 17
SAMPLES = 12              # per data set: the recipes take the first half to calibrate

AUDIO_LEN, FRONT_CH, HIDDEN = 512, 16, 32
VOCAB, SEQ, WIDTH, HEADS, MLP = 100, 16, 64, 4, 128


def _init(rng: np.random.Generator, name: str, shape: tuple[int, ...], fan_in: int,
          gain: float = 1.0) -> onnx.TensorProto:
    """A He-scaled random weight, so activations keep their size from layer to layer."""
    w = rng.normal(0.0, gain * np.sqrt(2.0 / fan_in), shape).astype(np.float32)
    return numpy_helper.from_array(w, name)


def _const(name: str, value) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value), name)


def _model(graph: onnx.GraphProto) -> onnx.ModelProto:
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)],
                              producer_name="npubuild-zoo")
    model.ir_version = IR_VERSION
    onnx.checker.check_model(model, full_check=True)
    return model


# ---- speech ---------------------------------------------------------------------------------

def _front_end(rng, tag: str) -> onnx.GraphProto:
    """One If branch: a strided 1-D filter bank (16 filters of 16 taps) over the raw audio."""
    w = _init(rng, f"front_{tag}_w", (FRONT_CH, 1, 16), 16)
    b = _const(f"front_{tag}_b", np.zeros(FRONT_CH, np.float32))
    node = helper.make_node("Conv", ["audio", w.name, b.name], [f"front_{tag}"],
                            name=f"front_{tag}", kernel_shape=[16], strides=[8], pads=[4, 4])
    out = helper.make_tensor_value_info(f"front_{tag}", TensorProto.FLOAT,
                                        [1, FRONT_CH, AUDIO_LEN // 8])
    return helper.make_graph([node], f"front_{tag}_graph", [], [out], [w, b])


def speech_model(seed: int = 0) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    nodes, inits = [], []

    def conv1d(name, x, cin, cout, k, s, p):
        w, b = _init(rng, f"{name}_w", (cout, cin, k), cin * k), _const(f"{name}_b",
                                                                         np.zeros(cout, np.float32))
        inits.extend([w, b])
        nodes.append(helper.make_node("Conv", [x, w.name, b.name], [name], name=name,
                                      kernel_shape=[k], strides=[s], pads=[p, p]))
        nodes.append(helper.make_node("Relu", [name], [f"{name}_relu"], name=f"{name}_relu"))
        return f"{name}_relu"

    inits.append(_const("sr_16k", np.array(16000, np.int64)))
    nodes.append(helper.make_node("Equal", ["sr", "sr_16k"], ["is_16k"], name="is_16k"))
    nodes.append(helper.make_node("If", ["is_16k"], ["front"], name="sample_rate_switch",
                                  then_branch=_front_end(rng, "16k"),
                                  else_branch=_front_end(rng, "8k")))
    nodes.append(helper.make_node("Relu", ["front"], ["front_relu"], name="front_relu"))
    x = conv1d("enc1", "front_relu", FRONT_CH, HIDDEN, 3, 2, 1)           # [1, 32, 32]
    x = conv1d("enc2", x, HIDDEN, HIDDEN, 3, 1, 1)
    x = conv1d("enc3", x, HIDDEN, HIDDEN, 3, 1, 1)
    frames = AUDIO_LEN // 16
    inits.append(_init(rng, "gru_w", (1, 3 * HIDDEN, HIDDEN), HIDDEN, 0.5))
    inits.append(_init(rng, "gru_r", (1, 3 * HIDDEN, HIDDEN), HIDDEN, 0.5))
    inits.append(_const("gru_b", np.zeros((1, 6 * HIDDEN), np.float32)))
    nodes += [
        helper.make_node("Transpose", [x], ["seq"], name="to_sequence", perm=[2, 0, 1]),
        helper.make_node("GRU", ["seq", "gru_w", "gru_r", "gru_b", "", "h"], ["gru_y", "hn"],
                         name="gru", hidden_size=HIDDEN, linear_before_reset=1),
        helper.make_node("Squeeze", ["gru_y", "axis_1"], ["gru_seq"], name="drop_direction"),
        helper.make_node("Transpose", ["gru_seq"], ["gru_ncw"], name="to_ncw", perm=[1, 2, 0]),
    ]
    inits.append(_const("axis_1", np.array([1], np.int64)))
    head_w = _init(rng, "head_w", (1, HIDDEN, 1), HIDDEN)
    inits += [head_w, _const("head_b", np.zeros(1, np.float32))]
    nodes += [helper.make_node("Conv", ["gru_ncw", "head_w", "head_b"], ["logit"], name="head",
                               kernel_shape=[1]),
              helper.make_node("Sigmoid", ["logit"], ["prob"], name="prob")]
    graph = helper.make_graph(
        nodes, "speech_vad",
        [helper.make_tensor_value_info("audio", TensorProto.FLOAT, [1, 1, AUDIO_LEN]),
         helper.make_tensor_value_info("sr", TensorProto.INT64, []),
         helper.make_tensor_value_info("h", TensorProto.FLOAT, [1, 1, HIDDEN])],
        [helper.make_tensor_value_info("prob", TensorProto.FLOAT, [1, 1, frames]),
         helper.make_tensor_value_info("hn", TensorProto.FLOAT, [1, 1, HIDDEN])],
        inits)
    return _model(graph)


def speech_samples(seed: int = 1) -> list[dict[str, np.ndarray]]:
    """Voiced chunks (a pitch and its harmonics under a syllable envelope, plus noise) and
    near-silent ones, alternating 16 kHz and 8 kHz."""
    rng = np.random.default_rng(seed)
    samples = []
    for i in range(SAMPLES):
        sr = 16000 if i % 2 == 0 else 8000
        t = np.arange(AUDIO_LEN) / sr
        voiced = i % 3 != 2
        pitch = rng.uniform(90, 260)
        wave = sum(rng.uniform(0.2, 1.0) / k * np.sin(2 * np.pi * k * pitch * t + rng.uniform(0, 6))
                   for k in range(1, 6)) if voiced else 0.0
        envelope = np.sin(np.pi * np.linspace(0, 1, AUDIO_LEN)) ** 2
        audio = 0.5 * envelope * wave + rng.normal(0, 0.02, AUDIO_LEN)
        samples.append({"audio": audio.astype(np.float32).reshape(1, 1, AUDIO_LEN),
                        "sr": np.array(sr, np.int64),
                        "h": rng.normal(0, 0.3, (1, 1, HIDDEN)).astype(np.float32)})
    return samples


# ---- transformer ----------------------------------------------------------------------------

class _Encoder:
    """Builds the encoder's nodes one block at a time (names say where each tensor comes from)."""

    def __init__(self, rng: np.random.Generator):
        self.rng, self.nodes, self.inits = rng, [], []

    def node(self, op: str, inputs: list[str], name: str, **attrs) -> str:
        self.nodes.append(helper.make_node(op, inputs, [name], name=name, **attrs))
        return name

    def const(self, name: str, value) -> str:
        self.inits.append(_const(name, value))
        return name

    def weight(self, name: str, shape: tuple[int, ...], gain: float = 0.5) -> str:
        self.inits.append(_init(self.rng, name, shape, shape[0], gain))
        return name

    def linear(self, name: str, x: str, cin: int, cout: int) -> str:
        y = self.node("MatMul", [x, self.weight(f"{name}.weight", (cin, cout))], f"{name}/MatMul")
        bias = self.const(f"{name}.bias", self.rng.normal(0, 0.02, cout).astype(np.float32))
        return self.node("Add", [y, bias], f"{name}/Add")

    def layer_norm(self, name: str, x: str) -> str:
        scale = self.const(f"{name}.weight", (1 + self.rng.normal(0, 0.05, WIDTH)).astype(np.float32))
        bias = self.const(f"{name}.bias", self.rng.normal(0, 0.05, WIDTH).astype(np.float32))
        return self.node("LayerNormalization", [x, scale, bias], f"{name}/LayerNorm", axis=-1,
                         epsilon=1e-5)

    def gelu_tanh(self, name: str, x: str) -> str:
        """0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))), as PyTorch exports GELU(tanh)."""
        cube = self.node("Pow", [x, self.const(f"{name}.three", np.float32(3))], f"{name}/Pow")
        inner = self.node("Mul", [cube, self.const(f"{name}.c", np.float32(0.044715))],
                          f"{name}/Mul")
        inner = self.node("Add", [x, inner], f"{name}/Add")
        inner = self.node("Mul", [inner, self.const(f"{name}.k", np.float32(np.sqrt(2 / np.pi)))],
                          f"{name}/Mul_1")
        t = self.node("Tanh", [inner], f"{name}/Tanh")
        t = self.node("Add", [t, self.const(f"{name}.one", np.float32(1))], f"{name}/Add_1")
        half = self.node("Mul", [x, self.const(f"{name}.half", np.float32(0.5))], f"{name}/Mul_2")
        return self.node("Mul", [half, t], f"{name}/Mul_3")

    def heads(self, name: str, x: str) -> str:
        """[1, S, W] -> [1, H, S, W/H]."""
        shape = self.const(f"{name}.shape", np.array([1, SEQ, HEADS, WIDTH // HEADS], np.int64))
        r = self.node("Reshape", [x, shape], f"{name}/Reshape")
        return self.node("Transpose", [r], f"{name}/Transpose", perm=[0, 2, 1, 3])

    def attention(self, name: str, x: str) -> str:
        q = self.heads(f"{name}/q", self.linear(f"{name}.q", x, WIDTH, WIDTH))
        k = self.heads(f"{name}/k", self.linear(f"{name}.k", x, WIDTH, WIDTH))
        v = self.heads(f"{name}/v", self.linear(f"{name}.v", x, WIDTH, WIDTH))
        kt = self.node("Transpose", [k], f"{name}/k/Transpose_1", perm=[0, 1, 3, 2])
        scores = self.node("MatMul", [q, kt], f"{name}/scores")
        scale = self.const(f"{name}.scale", np.float32(1 / np.sqrt(WIDTH // HEADS)))
        scores = self.node("Mul", [scores, scale], f"{name}/scaled")
        probs = self.node("Softmax", [scores], f"{name}/Softmax", axis=-1)
        ctx = self.node("MatMul", [probs, v], f"{name}/context")
        ctx = self.node("Transpose", [ctx], f"{name}/context/Transpose", perm=[0, 2, 1, 3])
        ctx = self.node("Reshape", [ctx, self.const(f"{name}.merge", np.array([1, SEQ, WIDTH],
                                                                               np.int64))],
                        f"{name}/context/Reshape")
        return self.linear(f"{name}.out", ctx, WIDTH, WIDTH)

    def layer(self, name: str, x: str) -> str:
        a = self.attention(f"{name}.attn", self.layer_norm(f"{name}.ln1", x))
        x = self.node("Add", [x, a], f"{name}/residual1")
        h = self.linear(f"{name}.fc1", self.layer_norm(f"{name}.ln2", x), WIDTH, MLP)
        h = self.linear(f"{name}.fc2", self.gelu_tanh(f"{name}.gelu", h), MLP, WIDTH)
        return self.node("Add", [x, h], f"{name}/residual2")


def transformer_model(seed: int = 0, layers: int = 2) -> onnx.ModelProto:
    enc = _Encoder(np.random.default_rng(seed))
    table = enc.const("embed.weight", enc.rng.normal(0, 1, (VOCAB, WIDTH)).astype(np.float32))
    x = enc.node("Gather", [table, "ids"], "embed/Gather", axis=0)
    pos = enc.const("pos.weight", enc.rng.normal(0, 0.3, (1, SEQ, WIDTH)).astype(np.float32))
    x = enc.node("Add", [x, pos], "embed/Add")
    for i in range(layers):
        x = enc.layer(f"layer{i}", x)
    out = enc.layer_norm("final_ln", x)
    enc.nodes.append(helper.make_node("Identity", [out], ["hidden"], name="hidden"))
    graph = helper.make_graph(
        enc.nodes, "transformer_encoder",
        [helper.make_tensor_value_info("ids", TensorProto.INT32, [1, SEQ])],
        [helper.make_tensor_value_info("hidden", TensorProto.FLOAT, [1, SEQ, WIDTH])], enc.inits)
    return _model(graph)


def token_samples(seed: int = 2) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"ids": rng.integers(0, VOCAB, (1, SEQ)).astype(np.int32)} for _ in range(SAMPLES)]


# ---- text lines for PP-OCR -----------------------------------------------------------------

TEXT_WINDOWS = {"page.png": [(4, 36), (44, 76), (84, 116), (124, 156), (150, 185)],
                "text.png": [(0, 60), (40, 100), (90, 150)]}


def text_lines(height: int, width: int) -> list[np.ndarray]:
    """Horizontal strips of the scanned pages resized to ``height x width``; every second one
    turned 180 degrees (what the direction classifier tells apart)."""
    from PIL import Image
    from skimage import data

    crops = []
    for name, windows in TEXT_WINDOWS.items():
        page = Image.open(Path(data.__file__).parent / name).convert("RGB")
        for top, bottom in windows:
            crops.append(page.crop((0, top, page.width, bottom)))
    lines = []
    for i, crop in enumerate(crops):
        img = crop.resize((width, height), Image.BILINEAR)
        x = np.asarray(img, np.float32)
        x = x[::-1, ::-1] if i % 2 else x
        lines.append(((x / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)[None].copy())
    return lines


# ---- files ----------------------------------------------------------------------------------

def _write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    tmp = path.with_name(path.name + ".tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)


def _write_npy(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(path.name + ".tmp.npy")
    np.save(tmp, array)
    tmp.replace(path)


def main(argv: list[str]) -> Path:
    out = Path(argv[0]) if argv else DEFAULT_OUT
    out.mkdir(parents=True, exist_ok=True)
    _write_bytes(out / "speech_vad.onnx", speech_model().SerializeToString())
    _write_bytes(out / "transformer_encoder.onnx", transformer_model().SerializeToString())
    for i, sample in enumerate(speech_samples()):
        _write_npz(out / f"speech_{i:02d}.npz", sample)
    for i, sample in enumerate(token_samples()):
        _write_npz(out / f"tokens_{i:02d}.npz", sample)
    for height, width in ((48, 320), (48, 192)):
        for i, line in enumerate(text_lines(height, width)):
            _write_npy(out / f"textline_{height}x{width}_{i:02d}.npy", line)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1:]))
