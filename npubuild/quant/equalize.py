"""Cross-layer equalisation (Nagel et al. 2019, "Data-Free Quantization"; AIMET's cross-layer
scaling): rescale the channels between two consecutive convolutions so that both weight
tensors use their integer range evenly, without changing the float function.

For ``y = conv2(act(conv1(x)))`` with a positively homogeneous ``act`` (none, Relu, LeakyRelu,
PRelu: ``act(x / s) = act(x) / s`` for ``s > 0``), dividing output channel ``c`` of ``conv1``
(weights and bias) by ``s_c`` and multiplying every weight of ``conv2`` that reads channel
``c`` by ``s_c`` is exact algebra. ``s_c = sqrt(r1_c / r2_c)`` (``r1_c``: the largest |weight|
of conv1's output channel ``c``, ``r2_c``: of conv2's weights reading ``c``) makes both ranges
``sqrt(r1_c · r2_c)``. A depthwise convolution sits in two pairs (its input and its output
channels), so the pairs are swept until the factors settle, which equalises a
conv → depthwise → conv triplet as AIMET's closed form does.

Where it helps: per-tensor weights of depthwise networks, whose channels span ranges that
differ by orders of magnitude (one channel's range then sets every channel's step). Zero padding
and max pooling between them commute with the scaling too. Where it
cannot apply: an activation that is not positively homogeneous (Clip(0, 6) = ReLU6, sigmoid,
swish, hard-swish) or a tensor read by more than one node (a residual branch) sits between the
two convolutions; those pairs are left alone and counted.

The model must already be ``lower.prepare``d (opset ≥ 13, fused functions inlined): the
pass works on plain ONNX ``Conv`` nodes whose weights and biases are initializers read by
that node alone. An inference ``BatchNormalization`` that alone reads such a conv's output (a
Paddle or PyTorch export keeps them apart) is folded into the conv first (``W·g/σ``,
``(b − μ)·g/σ + β``, in float64), so the pair sees the ranges the quantizer will: the folded
model equals the original within float32 rounding (`proves_equal` checks it on every build).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from npubuild.onnx_io import STANDARD_DOMAINS

# act(x / s) = act(x) / s per channel for s > 0 (Pad: with zeros; PRelu: a constant slope)
HOMOGENEOUS = {"Relu", "LeakyRelu", "PRelu", "MaxPool", "Pad"}
SWEEPS = 16
SETTLED = 1e-3          # stop when no factor moves by more than this (relative)
MIN_RANGE = 1e-12       # a channel whose weights are all zero is left alone


@dataclass
class Pair:
    """Two Conv nodes and the homogeneous nodes between them (in order)."""

    first: onnx.NodeProto
    second: onnx.NodeProto
    between: list[onnx.NodeProto] = field(default_factory=list)


@dataclass
class Result:
    """What the pass did: the pairs it equalised, and the candidates it could not."""

    pairs: list[tuple[str, str]]
    skipped: list[dict]
    sweeps: int
    folded: list[str] = field(default_factory=list)  # BatchNormalization nodes folded first

    def as_dict(self) -> dict:
        return {"pairs": [list(p) for p in self.pairs], "skipped": self.skipped,
                "sweeps": self.sweeps, "folded_batch_norms": self.folded}


def equalize(model: onnx.ModelProto) -> tuple[onnx.ModelProto, Result]:
    """A copy of ``model`` with every eligible conv pair equalised, and what was done."""
    out = onnx.ModelProto()
    out.CopyFrom(model)
    weights = _Weights(out.graph)
    folded = fold_batch_norms(out.graph, weights)
    pairs, skipped = find_pairs(out.graph, weights)
    sweeps = 0
    for sweeps in range(1, SWEEPS + 1):
        moved = max((_equalize_pair(p, weights) for p in pairs), default=0.0)
        if moved <= SETTLED:
            break
    weights.store()
    return out, Result([(p.first.name, p.second.name) for p in pairs], skipped,
                       sweeps if pairs else 0, folded)


PROOF_TOLERANCE = 1e-4  # largest output difference / the output's magnitude (float32 rounding)


def proof_failures(before: onnx.ModelProto, after: onnx.ModelProto,
                   feeds: dict[str, np.ndarray]) -> list[str]:
    """The graph outputs where ``after`` (equalised) differs from ``before`` on ``feeds`` by
    more than `PROOF_TOLERANCE` of the output's magnitude, each with its figures; empty when
    the rescaled model is the same function."""
    from npubuild import proofs

    names = [o.name for o in before.graph.output]
    _, bad = proofs.compare(proofs.run(before, feeds, names), proofs.run(after, feeds, names),
                            tolerance=PROOF_TOLERANCE)
    return [str(m) for m in bad]


def fold_batch_norms(graph: onnx.GraphProto, weights: "_Weights") -> list[str]:
    """Fold each constant ``BatchNormalization`` whose input only an owned Conv writes and only
    it reads into that conv (the conv then writes the BN's output); the BN nodes' names."""
    producers = {o: n for n in graph.node for o in n.output}
    folded, keep = [], []
    for node in graph.node:
        conv = producers.get(node.input[0]) if node.op_type == "BatchNormalization" else None
        if conv is None or not _foldable(node, conv, weights):
            keep.append(node)
            continue
        _fold_into(conv, node, graph, weights)
        folded.append(node.name)
    if folded:
        del graph.node[:]
        graph.node.extend(keep)
    return folded


def _foldable(bn: onnx.NodeProto, conv: onnx.NodeProto, weights: "_Weights") -> bool:
    """An inference BN (one output, every parameter an initializer) on an owned Conv's only
    output, read by nothing else and not a graph output."""
    params = list(bn.input[1:5])
    return (bn.domain in STANDARD_DOMAINS and len(bn.output) == 1 and len(params) == 4
            and all(p in weights.inits for p in params) and weights.owns(conv)
            and weights.readers.get(conv.output[0]) == 1
            and conv.output[0] not in {o.name for o in weights.graph.output}
            and not any(a.name == "training_mode" and a.i for a in bn.attribute))


def _fold_into(conv: onnx.NodeProto, bn: onnx.NodeProto, graph: onnx.GraphProto,
               weights: "_Weights") -> None:
    gamma, beta, mean, var = (numpy_helper.to_array(weights.inits[p]).astype(np.float64)
                              for p in bn.input[1:5])
    eps = next((a.f for a in bn.attribute if a.name == "epsilon"), 1e-5)
    scale = gamma / np.sqrt(var + eps)
    w = weights.values[conv.input[1]]
    weights.values[conv.input[1]] = w * scale.reshape(-1, *[1] * (w.ndim - 1))
    if len(conv.input) > 2 and conv.input[2]:
        bias = weights.values[conv.input[2]]
    else:
        bias = np.zeros(w.shape[0])
        name = weights.new_name(f"{conv.name}_bn_bias")
        graph.initializer.append(numpy_helper.from_array(bias.astype(np.float32), name))
        weights.adopt(name)
        del conv.input[2:]
        conv.input.append(name)
    weights.values[conv.input[2]] = (bias - mean) * scale + beta
    conv.output[0] = bn.output[0]


def find_pairs(graph: onnx.GraphProto, weights: "_Weights") -> tuple[list[Pair], list[dict]]:
    """Conv → [homogeneous activations] → Conv chains whose middle tensors have one reader."""
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    outputs = {o.name for o in graph.output}
    pairs, skipped = [], []
    for node in graph.node:
        if not weights.owns(node):
            continue
        between, tensor = [], node.output[0]
        while True:
            users = readers.get(tensor, [])
            if tensor in outputs or len(users) != 1:
                break
            user = users[0]
            if user.op_type in HOMOGENEOUS and _homogeneous(user, weights):
                between.append(user)
                tensor = user.output[0]
                continue
            if (user.op_type == "Conv" and weights.owns(user) and user.input[0] == tensor
                    and _channels_match(node, user, weights)):
                pairs.append(Pair(node, user, between))
            elif user.op_type == "Conv" or _feeds_a_conv(user, readers):
                skipped.append({"conv": node.name, "next": user.name,
                                "reason": _why_not(node, user, tensor, weights)})
            break
    return pairs, skipped


def _channels_match(first: onnx.NodeProto, second: onnx.NodeProto, weights: "_Weights") -> bool:
    """The second conv reads as many channels as the first writes (grouped convs included)."""
    w1, w2 = weights.values[first.input[1]], weights.values[second.input[1]]
    return w2.ndim == w1.ndim and w2.shape[1] * _group(second) == w1.shape[0]


def _feeds_a_conv(node: onnx.NodeProto, readers: dict[str, list[onnx.NodeProto]]) -> bool:
    users = readers.get(node.output[0], []) if node.output else []
    return len(users) == 1 and users[0].op_type == "Conv"


def _why_not(first: onnx.NodeProto, user: onnx.NodeProto, tensor: str, weights: "_Weights") -> str:
    if user.op_type != "Conv":
        return f"{user.op_type} between them is not positively homogeneous"
    if not weights.owns(user):
        return "the next Conv's weights are not initializers only it reads"
    if user.input[0] != tensor:
        return "the next Conv reads the tensor as a weight"
    return "the next Conv reads a different number of channels"


def _homogeneous(node: onnx.NodeProto, weights: "_Weights") -> bool:
    """PRelu only with a constant slope (a per-channel slope stays with its channel); Pad only
    with zeros (``constant`` mode, no or a zero pad value)."""
    if node.op_type == "PRelu":
        return len(node.input) > 1 and node.input[1] in weights.inits
    if node.op_type == "Pad":
        mode = next((a.s for a in node.attribute if a.name == "mode"), b"constant")
        value = node.input[2] if len(node.input) > 2 else ""
        return mode == b"constant" and (not value or (
            value in weights.inits and not np.any(numpy_helper.to_array(weights.inits[value]))))
    return True


def _equalize_pair(pair: Pair, weights: "_Weights") -> float:
    """Scale one pair in place; return the largest relative change of a factor."""
    w1 = weights.values[pair.first.input[1]]
    w2 = weights.values[pair.second.input[1]]
    groups = _group(pair.second)
    channels = w1.shape[0]
    r1 = np.abs(w1.reshape(channels, -1)).max(axis=1)
    r2 = _input_channel_ranges(w2, groups)
    ok = (r1 > MIN_RANGE) & (r2 > MIN_RANGE)
    s = np.ones(channels)
    s[ok] = np.sqrt(r1[ok] / r2[ok])
    _scale_outputs(pair.first, weights, 1.0 / s)
    _scale_inputs(pair.second, weights, s, groups)
    return float(np.max(np.abs(s - 1.0), initial=0.0))


def _group(node: onnx.NodeProto) -> int:
    return next((a.i for a in node.attribute if a.name == "group"), 1)


def _input_channel_ranges(w: np.ndarray, groups: int) -> np.ndarray:
    """Largest |weight| reading each input channel of a grouped conv ``w`` [Cout, Cin/g, ...]."""
    cout, cin_g = w.shape[:2]
    per = np.abs(w).reshape(groups, cout // groups, cin_g, -1).max(axis=(1, 3))  # [g, Cin/g]
    return per.reshape(-1)


def _scale_outputs(node: onnx.NodeProto, weights: "_Weights", factor: np.ndarray) -> None:
    w = weights.values[node.input[1]]
    weights.values[node.input[1]] = w * factor.reshape(-1, *[1] * (w.ndim - 1))
    if len(node.input) > 2 and node.input[2]:
        weights.values[node.input[2]] = weights.values[node.input[2]] * factor


def _scale_inputs(node: onnx.NodeProto, weights: "_Weights", factor: np.ndarray, groups: int) -> None:
    w = weights.values[node.input[1]]
    cout, cin_g = w.shape[:2]
    f = factor.reshape(groups, 1, cin_g, *[1] * (w.ndim - 2))
    weights.values[node.input[1]] = (w.reshape(groups, cout // groups, cin_g, *w.shape[2:]) * f
                                     ).reshape(w.shape)


class _Weights:
    """The float64 working copies of the initializers conv nodes own, written back once."""

    def __init__(self, graph: onnx.GraphProto):
        self.graph = graph
        self.inits = {t.name: t for t in graph.initializer}
        readers: dict[str, int] = {}
        for node in graph.node:
            for name in node.input:
                readers[name] = readers.get(name, 0) + 1
        self.readers = readers
        self.values: dict[str, np.ndarray] = {}
        self.dtypes: dict[str, np.dtype] = {}

    def owns(self, node: onnx.NodeProto) -> bool:
        """A Conv whose weight (and bias) are float initializers only it reads."""
        if node.op_type != "Conv" or node.domain not in STANDARD_DOMAINS or len(node.input) < 2:
            return False
        names = [n for n in node.input[1:3] if n]
        if not all(n in self.inits and self.readers.get(n) == 1 for n in names):
            return False
        for name in names:
            self._load(name)
        return all(np.issubdtype(self.dtypes[n], np.floating) for n in names)

    def new_name(self, stem: str) -> str:
        taken = {*self.inits, *self.readers}
        name, i = stem, 0
        while name in taken:
            i += 1
            name = f"{stem}_{i}"
        return name

    def adopt(self, name: str) -> None:
        """A new float initializer (a folded BN's bias) the conv that reads it owns."""
        self.inits = {t.name: t for t in self.graph.initializer}
        self.readers[name] = 1
        self._load(name)

    def _load(self, name: str) -> None:
        if name not in self.values:
            array = numpy_helper.to_array(self.inits[name])
            self.dtypes[name] = array.dtype
            self.values[name] = array.astype(np.float64)

    def store(self) -> None:
        for name, value in self.values.items():
            if np.issubdtype(self.dtypes[name], np.floating):
                self.inits[name].CopyFrom(numpy_helper.from_array(
                    value.astype(self.dtypes[name]), name))
