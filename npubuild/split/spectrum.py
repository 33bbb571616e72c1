"""Log power spectra: the audio front end that stays in float on the CPU.

A spectrogram is a transform by constant weights (a DFT basis as a MatMul or Gemm, maybe
reading its frames through a window of constant non-negative weights, maybe then
a filter bank of non-negative weights: BirdNET's mel filters read the real part), squared
(``Pow(x, 2)``, ``x · x``), summed or filtered, then compressed: ``Log``, or a power below 1
(BirdNET's ``Pow(x, 0.23)``, which magnifies the small bins as a Log does). The transform's outputs
cancel: each bin is a sum of large terms of both signs, and the bins the Log magnifies are the
small ones. With int8 weights that cancellation leaves a noise floor about 48 dB under the
largest bin; the Log turns it into the features (zoo ``word-activation``: the DFT on the NPU read
cosine 0.565 on the worst sample, and with every tensor in int16, the weights still int8, 0.48).
No activation precision recovers what the weights lost, so the precision search cannot find a
way back short of the float CPU. The split keeps the whole chain, window and transform to Log,
on the CPU in float, as the source ran it; what follows the Log (normalised, bounded features) goes to the
NPU.
"""

from __future__ import annotations

import numpy as np

from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.split.graph import MOVEMENT, OpGraph
from npubuild.targets.view import GraphFacts

REASON = ("part of a log power spectrum (a transform by constant weights, squared, then Log): "
          "int8 weights leave a noise floor the Log magnifies, so it runs in float on the CPU")

# between the transform and the square: values of both signs, moved or combined linearly
SIGNED = MOVEMENT | {"Mul", "Add", "Sub", "Neg"}
# between the square and the Log: non-negative energies, summed, filtered, bounded
ENERGY = MOVEMENT | {"Add", "Mul", "Div", "Sqrt", "Abs", "Max", "Clip", "ReduceSum", "ReduceMean",
                     "MatMul", "Gemm", "Conv"}
# A DFT as a matrix product (tf2onnx's RFFT, SwiftF0's STFT): int8 reads 0.565 and 0.55 on
# the zoo. An STFT or CQT as a Conv stays with the chip: on the zoo those pass in int8
# (basic-pitch 0.9994, Silero VAD, speech-vad), and on the CPU they would cost their fps.
TRANSFORMS = {"MatMul", "Gemm"}


def log_power_spectra(og: OpGraph, facts: GraphFacts) -> list[int]:
    """The nodes of every chain transform → square → Log (or a power below 1) in ``og``, in
    order."""
    to_log = [False] * len(og)
    to_square = [False] * len(og)
    for i in reversed(range(len(og))):  # topological order: successors are decided first
        op = _op(og, i)
        to_log[i] = (_compresses(og, facts, i)
                     or (op in ENERGY and any(to_log[s] for s in og.succs[i])))
        to_square[i] = ((_squares(og, facts, i) and any(to_log[s] for s in og.succs[i]))
                        or (_signed(og, facts, i) and any(to_square[s] for s in og.succs[i])))
    chain: set[int] = set()
    for i in range(len(og)):
        if _transform(og, facts, i) and any(to_square[s] for s in og.succs[i]):
            chain |= {i} | _forward(og, facts, i, to_square, to_log) | _window(og, facts, i)
    return sorted(chain)


def _window(og: OpGraph, facts: GraphFacts, start: int) -> set[int]:
    """The window the transform ``start`` reads its frames through: a product by a constant
    vector of non-negative weights (a Hann window), with the data movement between them. In
    int8 its rounding (1/255 of its peak) is a second window whose leakage the compression
    magnifies: BirdNET's 1024-point Hann window alone in int8, everything else in float, flips
    the top species on 2 of 6 clips (worst cosine 0.9953)."""
    between: list[int] = []
    i = start
    while True:
        activations = [t for t in og.nodes[i].input[:2] if t and not facts.is_const(t)]
        if len(activations) != 1 or activations[0] not in og.producer:
            return set()
        i = og.producer[activations[0]]
        if _op(og, i) in MOVEMENT and len(og.succs[i]) == 1:
            between.append(i)
            continue
        if _op(og, i) != "Mul" or len(og.succs[i]) != 1:
            return set()
        weights = [facts.value(t) for t in og.nodes[i].input[:2] if t and facts.is_const(t)]
        if (len(weights) == 1 and weights[0] is not None and np.size(weights[0]) > 1
                and float(np.min(weights[0])) >= 0.0):
            return {i, *between}
        return set()


def _forward(og: OpGraph, facts: GraphFacts, start: int, to_square: list[bool],
             to_log: list[bool]) -> set[int]:
    """The nodes after ``start`` on its paths to a square and on to a Log."""
    found: set[int] = set()
    seen: set[tuple[int, bool]] = set()
    stack = [(s, False) for s in og.succs[start]]
    while stack:
        i, squared = stack.pop()
        if (i, squared) in seen:
            continue
        seen.add((i, squared))
        op = _op(og, i)
        if squared and to_log[i]:
            found.add(i)
            nxt = [] if _compresses(og, facts, i) else og.succs[i]
        elif not squared and _squares(og, facts, i) and to_square[i]:
            found.add(i)
            nxt, squared = og.succs[i], True
        elif not squared and _signed(og, facts, i) and to_square[i]:
            found.add(i)
            nxt = og.succs[i]
        else:
            continue
        stack.extend((s, squared) for s in nxt)
    return found


def _op(og: OpGraph, i: int) -> str:
    node = og.nodes[i]
    return node.op_type if node.domain in STANDARD_DOMAINS else ""


def _signed(og: OpGraph, facts: GraphFacts, i: int) -> bool:
    """Between the transform and the square: data movement, a linear combination, or a filter
    bank (a product by constant non-negative weights, BirdNET's mel filters of the real part).
    A product by signed weights there is a stage of the transform itself (SwiftF0's FFT in
    stages of 32x32 products): the chain starts at its last stage, as the zoo measured it."""
    if _op(og, i) in SIGNED:
        return True
    if not _transform(og, facts, i):
        return False
    weights = [facts.value(name) for name in og.nodes[i].input[:2] if name and facts.is_const(name)]
    return all(w is not None and float(np.min(w)) >= 0.0 for w in weights)


def _compresses(og: OpGraph, facts: GraphFacts, i: int) -> bool:
    """``Log``, or ``Pow(x, p)`` with a constant 0 < p < 1: both magnify the small energies."""
    node, op = og.nodes[i], _op(og, i)
    if op == "Log":
        return True
    if op != "Pow":
        return False
    exponent = facts.value(node.input[1])
    return exponent is not None and exponent.size == 1 and 0.0 < float(exponent.reshape(-1)[0]) < 1.0


def _squares(og: OpGraph, facts: GraphFacts, i: int) -> bool:
    """``Pow(x, 2)`` or ``Mul(x, x)``."""
    node, op = og.nodes[i], _op(og, i)
    if op == "Mul":
        return len(node.input) == 2 and node.input[0] == node.input[1]
    if op == "Pow":
        exponent = facts.value(node.input[1])
        return exponent is not None and exponent.size == 1 and float(exponent.reshape(-1)[0]) == 2.0
    return False


def _transform(og: OpGraph, facts: GraphFacts, i: int) -> bool:
    """A MatMul or Gemm of an activation by constant weights of more than one value."""
    node = og.nodes[i]
    if _op(og, i) not in TRANSFORMS:
        return False
    weights = [facts.value(name) for name in node.input[:2] if name]
    activations = [name for name in node.input[:2] if name and not facts.is_const(name)]
    return bool(activations) and any(w is not None and np.size(w) > 1 for w in weights)
