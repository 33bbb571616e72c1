"""A model input normalised by its own statistics: the front end that stays in float on the CPU.

Some models normalise their raw input by a reduction over it: BirdNET V2.4 divides the audio
by its own peak-to-peak, ``(x - min(x)) / (max(x - min(x)) + eps)``; EfficientWord-Net's
ResNet-50 min-max normalises its filter banks; others divide by the standard deviation. Before
the division every tensor (the raw input, ``x - min``, the statistic itself) has the range of
the input's loudness, which is a property of the input, not of the model: quantized with the
range calibration saw, a louder input clips (BirdNET's peak-to-peak reached 2.06 on a wind
clip where calibration's songs gave 0.80, so int8 clipped the divisor and the waveform). After
the division the values are scale-free, whatever the input's level. The split keeps the
input's statistics and the normalisation, input to division, in float on the CPU, as the
source ran them; what follows the division goes to the NPU. These are a few elementwise ops
and reductions over the input, cheap on the CPU.
"""

from __future__ import annotations

from onnx import TensorProto

from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.split.graph import MOVEMENT, OpGraph
from npubuild.targets.view import GraphFacts

REASON = ("normalises the model input by its own statistics (a reduction over the input: min, "
          "max, mean, deviation): before the division its range is the input's level, not the "
          "model's, so int8 with calibration's range clips a louder input; it runs in float on "
          "the CPU")

# Reductions that give a per-input statistic of the input's level.
REDUCTIONS = frozenset({"ReduceMin", "ReduceMax", "ReduceMean", "ReduceSum", "ReduceSumSquare",
                        "ReduceL1", "ReduceL2"})
# Elementwise arithmetic between the input and its normalisation.
ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Abs", "Neg", "Sqrt", "Pow", "Max", "Min",
                         "Reciprocal", "Clip"})

SIGNAL, STATISTIC = "signal", "statistic"
FLOATS = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE,
                    TensorProto.BFLOAT16})


def self_normalised_inputs(og: OpGraph, facts: GraphFacts) -> list[int]:
    """The nodes, in order, of every normalisation of a model input by a statistic of itself:
    a ``Div`` of a value computed from the input alone (the signal) by a reduction over it
    (the statistic; or a ``Mul`` by the statistic's reciprocal), with every node between the
    input and that division."""
    kind: dict[str, str] = {name: SIGNAL for name in og.inputs
                            if facts.elem_type(name) in FLOATS}
    raw = [False] * len(og)
    normalisers = []
    for i, node in enumerate(og.nodes):  # topological order: inputs are decided first
        op = node.op_type if node.domain in STANDARD_DOMAINS else ""
        read = [t for t in node.input if t and not facts.is_const(t)]
        if not read or not all(t in kind for t in read):
            continue
        if op in MOVEMENT and node.input[0] not in kind:  # a table read at input indices
            continue
        if op in REDUCTIONS:
            out = STATISTIC
        elif op in MOVEMENT or op in ELEMENTWISE:
            out = SIGNAL if any(kind[t] == SIGNAL for t in read) else STATISTIC
        else:
            continue
        raw[i] = True
        for t in node.output:
            kind[t] = out
        if _normalises(og, i, op, kind):
            normalisers.append(i)
    chain: set[int] = set()
    for i in normalisers:
        chain |= _raw_ancestors(og, i, raw)
    return sorted(chain)


def _normalises(og: OpGraph, i: int, op: str, kind: dict[str, str]) -> bool:
    """``Div(signal, statistic)``, or ``Mul(signal, statistic)`` where the statistic is a
    reciprocal (``Reciprocal`` or ``Div`` of something by a statistic)."""
    inputs = list(og.nodes[i].input)
    if op == "Div" and len(inputs) == 2:
        return kind.get(inputs[0]) == SIGNAL and kind.get(inputs[1]) == STATISTIC
    if op != "Mul" or len(inputs) != 2:
        return False
    for signal, statistic in (inputs, inputs[::-1]):
        producer = og.producer.get(statistic)
        if (kind.get(signal) == SIGNAL and kind.get(statistic) == STATISTIC
                and producer is not None and og.nodes[producer].op_type in ("Reciprocal", "Div")):
            return True
    return False


def _raw_ancestors(og: OpGraph, start: int, raw: list[bool]) -> set[int]:
    """``start`` and every node before it that computes from the model input alone."""
    found, stack = set(), [start]
    while stack:
        i = stack.pop()
        if i in found or not raw[i]:
            continue
        found.add(i)
        stack.extend(og.preds[i])
    return found
