"""A quantized graph whose activation parameters are inputs: one ONNX Runtime session scores
every precision the search tries.

``export_fake_quant(qgraph)`` is the QDQ export (`npubuild.quant.qdq`) of ``qgraph`` with each
activation's QuantizeLinear/DequantizeLinear pair replaced by float fake quantization whose
scale, zero point, integer bounds and an on/off switch are graph inputs
(``<tensor>::fq``, a float32 vector ``[scale, zero_point, qmin, qmax, on]``)::

    y = (clip(round(x / scale) + zero_point, qmin, qmax) - zero_point) · scale   if on else x

Weights and biases are the exported integers on the NPU and the float layer's own where a
choice moves the layer to the CPU (a switch input per conv layer), quantized constants keep
their integers, lookup tables and CPU layers their float fragments between the fake
quantizations, so one model computes the graph under any choice of int8, int16 and float per
tensor (`params_feed` turns the quantizer's parameters and placement into the inputs); the
search's models (`export_graphs`) take the switched weights and the quantized constants as
inputs too, which `FakeQuantPipeline` computes once per state of the switches, or takes
from the choice (`choice_inputs`: the biases, weight scales and constants that quantizing
the graph with the choice gives, so a score is what adopting the choice computes; a constant
the choice leaves no NPU layer to read is its float value, `float_constants`). It leaves
out what the integer reference adds below one step: fixed-point multipliers, the pow2
rounding-tie nudges, integer softmax; the search scores with it and confirms its choice on
the integer reference.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Mapping, Sequence

import numpy as np
import onnx
from onnx import TensorProto, helper

from npubuild import onnx_io
from npubuild.quant import qdq
from npubuild.quant.floatgraph import FLayer, FloatGraph
from npubuild.quant.qgraph import QGraph, QLayer
from npubuild.quant.schemes import QParams

PARAMS_SUFFIX = "::fq"
NPU_SUFFIX = "::npu"
W16_SUFFIX = "::w16"
CONSTANT_SUFFIX = "::c"     # a quantized constant's dequantized value (the search's models)
CHOICE_DELTA_SUFFIX = "::wd"  # a switched weight's delta (integers - real) under one choice
FLOAT_MAX = float(np.finfo(np.float32).max)
OFF = np.array([1.0, 0.0, -FLOAT_MAX, FLOAT_MAX, 0.0], np.float32)


@dataclass
class _FakeQuantBuilder(qdq._Builder):
    float_layers: Mapping[str, FLayer] | None = None
    # conv layer -> (its int16 weights dequantized, the float bias they are corrected to)
    wide_weights: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None
    weights_as_inputs: bool = False  # each switched weight an input (`SwitchedWeight`)
    # each conv weight's switched arrays by what they are computed from (`_kept`): the layers
    # reading one weight, and the choices that leave its integers, hold one set
    shared: dict | None = None

    def __post_init__(self):
        self.value_of: dict[str, str] = {}
        self.parameters: list[str] = []
        self.switched: list[str] = []
        self.wide: list[str] = []
        self.weight_inputs: list[SwitchedWeight] = []
        self.constant_inputs: dict[str, np.ndarray] = {}  # input -> its dequantized value

    def weight(self, key: str, layer: QLayer, arrange, scale: np.ndarray, axis: int) -> str:
        """int8 weights on the NPU, the float layer's own on the CPU: ``w + npu · (w_q - w)``
        with ``<layer>::npu`` an input (a layer touching a float tensor runs in float); with
        int16 weights exported too, ``+ w16 · (w_q16 - w_q)`` (``<layer>::w16`` an input)."""
        wide = (self.wide_weights or {}).get(layer.name)
        real = self.float_layers[layer.name].weights["weight"]
        scale = np.asarray(scale, np.float32)

        def values():
            wq = arrange(layer.arrays["weight"]).astype(np.float32)
            shape = [1] * wq.ndim
            shape[axis] = -1
            return _switched_values(wq * scale.reshape(shape), arrange(real),
                                    None if wide is None else arrange(wide[0]))

        # what ``arrange`` does is the layer's kind's and the axis' (`qdq._conv`)
        return self._switched(key, layer, "w", *self._kept(
            ("weight", axis, bool(layer.attrs.get("fc")), scale.tobytes()),
            (layer.arrays["weight"], real, None if wide is None else wide[0]), values))

    def bias(self, key: str, layer: QLayer, scale: np.ndarray) -> str:
        dequantized = layer.arrays["bias"].astype(np.float32) * np.asarray(scale, np.float32)
        wide = (self.wide_weights or {}).get(layer.name)
        return self._switched(key, layer, "b", *_switched_values(
            dequantized, self.float_layers[layer.name].weights["bias"],
            None if wide is None else wide[1]))

    def _kept(self, key: tuple, sources: tuple, values) -> tuple:
        """``values()``, once per ``key`` and the arrays ``sources`` it is computed from (by
        identity: the entry holds them, so no other array takes their ids) in `shared`, read
        only. A shared encoder layer applied 8 times, or a calibration method the search
        scores that leaves a weight's integers, then hands the arrays it had: rxnmap's search
        held each weight's float values and deltas per application and per choice."""
        if self.shared is None:
            return values()
        full = (*key, *map(id, sources))
        found = self.shared.get(full)
        if found is None or any(a is not b for a, b in zip(found[0], sources)):
            kept = tuple(values())
            for array in kept:
                if array is not None:
                    array.flags.writeable = False
            found = self.shared[full] = (sources, kept)
        return found[1]

    def _switched(self, key: str, layer: QLayer, part: str, real: np.ndarray,
                  delta: np.ndarray, wide: np.ndarray | None = None) -> str:
        """The switched value of ``real + npu · delta (+ w16 · wide)`` (`_switched_values`)."""
        switch = f"{layer.name}{NPU_SUFFIX}"
        if switch not in self.switched:
            self.switched.append(switch)
        if wide is not None:
            on = f"{layer.name}{W16_SUFFIX}"
            if on not in self.wide:
                self.wide.append(on)
        if self.weights_as_inputs:
            self.weight_inputs.append(SwitchedWeight(f"{key}::{part}", layer.name, real, delta,
                                                     wide))
            return f"{key}::{part}"
        delta = self.node("Mul", [self.const(f"{key}::{part}d", delta), switch],
                          [f"{key}::{part}s"])
        value = self.node("Add", [self.const(f"{key}::{part}f", real), delta], [f"{key}::{part}"])
        if wide is None:
            return value
        step = self.node("Mul", [self.const(f"{key}::{part}16d", wide), on],
                         [f"{key}::{part}16s"])
        return self.node("Add", [value, step], [f"{key}::{part}16"])

    def read(self, t: str) -> str:
        info = self.qgraph.tensors[t]
        if info.is_float:
            return self.float_name[t]
        if t in self.qgraph.constants:
            if not self.weights_as_inputs:
                return super().read(t)
            name = f"{t}{CONSTANT_SUFFIX}"
            if name not in self.constant_inputs:  # dequantized as DequantizeLinear does
                q = np.asarray(self.qgraph.constants[t]).astype(np.float32)
                self.constant_inputs[name] = np.asarray(  # a scalar stays an array for ORT
                    (q - np.float32(info.zero_point)) * np.float32(info.scale), np.float32)
            return name
        return self.value_of[t]

    def write(self, t: str, value: str, nudge=None, clamp=None) -> None:
        info = self.qgraph.tensors[t]
        if info.is_float:
            self.node("Identity", [value], [self.float_name[t]])
            return
        if clamp is not None:
            lo, hi = (self.const(f"{t}::lo", np.float32(clamp[0])),
                      self.const(f"{t}::hi", np.float32(clamp[1])))
            value = self.node("Clip", [value, lo, hi], [f"{t}::clipped"])
        self.value_of[t] = self.fake_quant(t, value)

    def clamp(self, layer: QLayer) -> tuple[float, float] | None:
        """The folded Relu/Clip itself, in real units (a tensor kept in float has no integer
        range to clip it): the tensor's own range comes from its parameters."""
        name, lo, hi = self.float_layers[layer.name].activation
        if name == "relu":
            lo, hi = 0.0, None
        elif name != "clip":
            return None
        return (-FLOAT_MAX if lo is None else float(lo), FLOAT_MAX if hi is None else float(hi))

    def fake_quant(self, t: str, value: str) -> str:
        """``y = (clip(round(x / scale) + zero_point, qmin, qmax) - zero_point) · scale`` where
        the tensor's switch is on, else ``x`` itself (an infinite float value, a Log of 0, must
        pass through untouched). An If runs only the branch the switch picks: a Where over
        both cost a pass over the tensor more, and the arithmetic for a tensor kept in float
        (basic-pitch's widest fake-quant graph: 33 -> 24 ms a run, the same values)."""
        if t not in self.parameters:
            self.parameters.append(t)
        k = len(self.nodes)
        p = f"{t}{PARAMS_SUFFIX}"
        scale, zp, lo, hi, on = self.node("Split", [p], [f"{p}:{i}:{k}" for i in range(5)],
                                          axis=0, num_outputs=5)
        if not self.qgraph.tensors[t].shape:  # a scalar: parameters of shape [1] make it [1]
            scale, zp, lo, hi = (self.node("Squeeze", [v], [f"{v}:0"]) for v in (scale, zp, lo, hi))
        d, r, z, c, u, y, x = (f"{t}::{step}{k}" for step in "drzcuyx")
        quantized = _branch(f"{t}::fq{k}", y, [
            helper.make_node("Div", [value, scale], [d]), helper.make_node("Round", [d], [r]),
            helper.make_node("Add", [r, zp], [z]), helper.make_node("Clip", [z, lo, hi], [c]),
            helper.make_node("Sub", [c, zp], [u]), helper.make_node("Mul", [u, scale], [y])])
        passed = _branch(f"{t}::off{k}", x, [helper.make_node("Identity", [value], [x])])
        switched = self.node("Greater", [on, self.const(f"{t}::half{k}", np.float32(0.5))],
                             [f"{t}::o{k}"])
        return self.node("If", [self.node("Squeeze", [switched], [f"{t}::s{k}"])],
                         [f"{t}::fq{k}"], then_branch=quantized, else_branch=passed)


def _switched_values(quantized: np.ndarray, real, wide) -> tuple:
    """A switched weight's float32 values: the float layer's (``real``), the dequantized
    integers less those, and the int16 weights' less the integers (None without)."""
    real = np.asarray(real, np.float32).reshape(quantized.shape)
    if wide is None:
        return real, quantized - real, None
    return real, quantized - real, np.asarray(wide, np.float32).reshape(quantized.shape) - quantized


def _branch(name: str, output: str, nodes: list) -> onnx.GraphProto:
    """An If branch: ``nodes`` reading the outer graph's values, giving ``output``."""
    return helper.make_graph(nodes, name, [],
                             [helper.make_tensor_value_info(output, TensorProto.FLOAT, None)])


def export_fake_quant(qg: QGraph, fg: FloatGraph, *, opset: int = 18,
                      wide_weights: Mapping[str, tuple[np.ndarray, np.ndarray]] | None = None,
                      weights_as_inputs: bool = False):
    """The model (float in, float out, as the QDQ export), the tensors whose parameters are
    inputs, the conv layers whose ``<layer>::npu`` switch is an input and those whose
    ``<layer>::w16`` switch is (``wide_weights``: per conv layer, its int16 weights
    dequantized and its corrected float bias, `quantizer.wide_weight_values`). ``fg``: the
    float graph ``qg`` was quantized from (the float weights a CPU layer uses).

    ``weights_as_inputs``: the switched weights and biases are inputs of the model instead of
    computed in it from the switches on every run (``w + npu · (w_q - w)``: on BirdNET's
    classifier graph those Mul and Add nodes were 630 of its 880 ms a run, its convolutions
    19 ms), and a fifth item lists them (`SwitchedWeight`): `FakeQuantPipeline` computes each
    once per state of its switches, with the same float32 operations. The quantized
    constants are inputs too (``<tensor>::c``, a sixth item: each name and its dequantized
    value), so a choice that quantizes them otherwise can feed its own (`choice_inputs`)."""
    b = _builder(qg, fg, opset=max(opset, 18, qdq.fragments_opset(qg)),  # Split's num_outputs
                 wide_weights=wide_weights, weights_as_inputs=weights_as_inputs, shared={})
    for t, info in qg.tensors.items():
        if not info.is_float and t in qg.constants:
            b.const(f"{t}::q", qg.constants[t])
    for t in qg.inputs:
        if not qg.tensors[t].is_float:
            b.value_of[t] = b.fake_quant(t, t)
    qdq._layers(b)
    for t in qg.outputs:
        if not qg.tensors[t].is_float:
            b.node("Identity", [b.read(t)], [t])
    value = lambda t: helper.make_tensor_value_info(t, TensorProto.FLOAT, qg.tensors[t].shape)  # noqa: E731
    params = [helper.make_tensor_value_info(f"{t}{PARAMS_SUFFIX}", TensorProto.FLOAT, [5])
              for t in b.parameters]
    switches = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [])
                for n in [*b.switched, *b.wide]]  # inputs still where weights are (unread)
    weights = [helper.make_tensor_value_info(w.name, TensorProto.FLOAT, list(w.real.shape))
               for w in b.weight_inputs]
    constants = [helper.make_tensor_value_info(name, TensorProto.FLOAT, list(v.shape))
                 for name, v in b.constant_inputs.items()]
    model = qdq._model(b, [value(t) for t in qg.inputs] + params + switches + weights
                       + constants, [value(t) for t in qg.outputs], b.opset)
    out = (model, list(b.parameters), [n[:-len(NPU_SUFFIX)] for n in b.switched],
           [n[:-len(W16_SUFFIX)] for n in b.wide])
    return ((*out, tuple(b.weight_inputs), tuple(b.constant_inputs.items()))
            if weights_as_inputs else out)


def _builder(qg: QGraph, fg: FloatGraph, **options) -> _FakeQuantBuilder:
    """The fake-quant builder of ``qg``: integer tensors read and written as ``<t>::q``,
    float ones by their own names, each CPU layer's float weights from ``fg``."""
    ints = [t for t, info in qg.tensors.items() if not info.is_float]
    return _FakeQuantBuilder(qg, {t: f"{t}::q" for t in ints}, {t: f"{t}::q" for t in ints},
                             {t: t for t, info in qg.tensors.items() if info.is_float},
                             float_layers={layer.name: layer for layer in fg.layers}, **options)


@dataclass(frozen=True, eq=False)
class SwitchedWeight:
    """A conv layer's weights or bias as one input of its fake-quant model: ``real`` (the
    float layer's, on the CPU) ``+ npu · delta`` (``<layer>::npu``: the integer layer's,
    dequantized) ``+ w16 · wide`` (``<layer>::w16``, where int16 weights are exported)."""

    name: str
    layer: str
    real: np.ndarray
    delta: np.ndarray
    wide: np.ndarray | None = None

    def value(self, npu: np.ndarray, w16: np.ndarray | None) -> np.ndarray:
        """The float32 operations the in-model form runs (Mul, then Add), so the same bits."""
        value = self.real + self.delta * np.float32(npu)
        if self.wide is not None:
            value = value + self.wide * np.float32(w16)
        return value


def params_feed(tensors: list[str], params: Mapping[str, QParams | None],
                layers: list[str] = (), cpu_layers: set[str] | frozenset = frozenset(),
                wide: Sequence[str] = (), int16_weights: set[str] | frozenset = frozenset(),
                arrays: dict | None = None) -> dict[str, np.ndarray]:
    """The inputs for one choice: each tensor's quantizer parameters, or off where it stays
    float (absent or None); each switched layer on the NPU unless in ``cpu_layers``; each
    layer with a ``<layer>::w16`` switch (``wide``) on its int16 weights where it is in
    ``int16_weights`` (and on the NPU). ``arrays``: where each value's array is kept (by the
    parameters, or ``("switch", on)``: one array per state of every switch; the feeds only
    read them), so the choices of a search
    hand a tensor the same array wherever its parameters stay (`ArrayPrints` hashes it once)."""
    arrays = {} if arrays is None else arrays

    def array(key, value) -> np.ndarray:
        found = arrays.get(key)
        if found is None:
            found = arrays[key] = np.array(value, np.float32)
        return found

    feed = {}
    for t in tensors:
        p = params.get(t)
        feed[f"{t}{PARAMS_SUFFIX}"] = OFF if p is None else array(
            p, [p.scale, p.zero_point, p.qmin, p.qmax, 1.0])
    for name in layers:
        on = name not in cpu_layers
        feed[f"{name}{NPU_SUFFIX}"] = array(("switch", on), float(on))
    for name in wide:
        on = name in int16_weights and name not in cpu_layers
        feed[f"{name}{W16_SUFFIX}"] = array(("switch", on), float(on))
    return feed


@dataclass(frozen=True)
class Exported:
    """One NPU graph as its fake-quant model: what `export_fake_quant` returns (picklable, so
    Dask workers can run it)."""

    model: onnx.ModelProto
    tensors: tuple[str, ...]   # whose ``<tensor>::fq`` parameters are inputs
    layers: tuple[str, ...]    # whose ``<layer>::npu`` switch is an input
    wide: tuple[str, ...] = ()  # whose ``<layer>::w16`` switch is an input
    weights: tuple[SwitchedWeight, ...] = ()  # inputs computed from the switches
    # the quantized constants as inputs: each name and the value fed unless a choice says
    constants: tuple[tuple[str, np.ndarray], ...] = ()

    @property
    def weight_keys(self) -> dict[str, str]:
        """Each layer with switched weights -> its key in the model (``L<i>``)."""
        return {w.layer: w.name.rsplit("::", 1)[0] for w in self.weights}

    def digest(self, hasher) -> None:
        """Feeds ``hasher`` (hashlib) with what the model computes: its bytes, its weights'."""
        hasher.update(self.model.SerializeToString())
        for w in self.weights:
            hasher.update(w.name.encode() + b"\0" + w.layer.encode())
            for array in (w.real, w.delta, *([] if w.wide is None else [w.wide])):
                hasher.update(np.ascontiguousarray(array).tobytes())
        for name, value in self.constants:
            hasher.update(name.encode() + b"\0" + np.ascontiguousarray(value).tobytes())


def export_graphs(graphs: Mapping[int, tuple]) -> dict[int, Exported]:
    """Each NPU graph (index -> its quantized and float graph, and optionally its conv
    layers' int16 weights for `export_fake_quant`) as its fake-quant model, its switched
    weights as inputs."""
    out = {}
    for index, (qg, fg, *wide) in graphs.items():
        model, tensors, layers, switched, weights, constants = export_fake_quant(
            qg, fg, wide_weights=wide[0] if wide else None, weights_as_inputs=True)
        out[index] = Exported(model, tuple(tensors), tuple(layers), tuple(switched), weights,
                              constants)
    return out


def choice_inputs(qg: QGraph, fg: FloatGraph, keys: Mapping[str, str],
                  memo: dict | None = None, shared: dict | None = None
                  ) -> dict[str, np.ndarray]:
    """What a choice quantizes otherwise than the graph a search model was exported from:
    the weights and biases of ``qg``'s layers (``<weight input>::wd``: the dequantized
    integers less the float layer's) and its quantized constants (``<tensor>::c``). ``qg``:
    the graph quantized under the choice, its conv layers at least (`Quantizer.weighted`);
    ``keys``: each conv layer's key in the search's model (`Exported.weight_keys`). A bias
    is quantized at its input's scale times its weights', and a weight scale widens where the
    bias would not fit that accumulator, so int16 on a conv's input moves both. Fed beside
    `params_feed`'s inputs, they make the search's model compute what the graph adopted with
    the choice computes (SwiftF0: its fake quantization passed at +0.0028 while the integer
    reference missed by 0.0152; with them both read -0.0152). ``memo``: each layer's
    inputs kept by the layer object and its input's scale (`Quantizer.weighted` hands the
    same object to every choice that leaves the layer's tensors alone; the layers it hands
    are never changed), and each constant's by its integers' object and parameters, so only
    a layer or constant the choice quantized otherwise is exported again. ``shared``: each
    weight's deltas by its integers, scales and float values (`_FakeQuantBuilder._kept`), so
    a layer exported again whose weights the choice left (only its input's scale and bias
    moved) hands the deltas it had, and layers reading one weight hand one array."""
    b = _builder(qg, fg, weights_as_inputs=True, shared=shared)
    weights: list[SwitchedWeight] = []
    for layer in qg.layers:
        if layer.name not in keys:
            continue
        key = (layer.name, id(layer), keys[layer.name], qg.tensors[layer.inputs[0]].scale)
        known = None if memo is None else memo.get(key)
        if known is None or known[0] is not layer:
            # the export's own fragment: the same weights, scales, bias
            b.value_of.update({t: t for t in layer.inputs})  # names only: nothing runs
            first = len(b.weight_inputs)
            qdq.FRAGMENTS[layer.kind](b, layer, keys[layer.name])
            known = (layer, b.weight_inputs[first:])
            if memo is not None:
                memo[key] = known
        weights.extend(known[1])
    constants = {}
    for t, values in qg.constants.items():  # a quantizer's memo hands the same integers
        info, name = qg.tensors[t], f"{t}{CONSTANT_SUFFIX}"
        key = (t, id(values), info.dtype, info.scale, info.zero_point)
        known = None if memo is None else memo.get(key)
        if known is None or known[0] is not values:
            b.read(t)
            known = (values, b.constant_inputs.get(name))
            if memo is not None:
                memo[key] = known
        if known[1] is not None:
            constants[name] = known[1]
    return {**{f"{w.name}{CHOICE_DELTA_SUFFIX}": w.delta for w in weights}, **constants}


def float_constants(qg: QGraph, fg: FloatGraph, exported: "Exported") -> dict[str, np.ndarray]:
    """The exported model's quantized constants that ``qg`` (a choice's graph) does not
    quantize, each as its float value: the choice runs every layer that reads it in float on
    the CPU, and a CPU layer reads the float model's constant (an int8 window or BatchNorm
    scale read by a float layer made "every candidate in float" differ from the float
    model). A constant that an NPU layer still reads stays quantized for every reader."""
    out = {}
    for name, value in exported.constants:
        t = name[:-len(CONSTANT_SUFFIX)]
        if t not in qg.constants and t in fg.constants:
            out[name] = np.asarray(fg.constants[t], np.float32).reshape(value.shape)
    return out


def quantizer_inputs(q, index: int, fg: FloatGraph, pipeline: "FakeQuantPipeline"
                     ) -> dict[str, np.ndarray]:
    """Graph ``index``'s inputs in ``pipeline`` as quantizer ``q`` (`npubuild.quant.quantizer.
    Quantizer`, a choice's or a change's configuration) builds it: every tensor's parameters,
    each layer's placement and int16 weights (`params_feed`), and the weights, biases and
    constants it quantizes otherwise than the exported graph (`choice_inputs`). One way for
    the precision search's choices and verify's measured hints."""
    params, cpu = q.tensor_params()
    wide = frozenset(q.int16_weight_layers() - set(cpu))
    qg = q.weighted(f"graph_{index}")
    own = {**float_constants(qg, fg, pipeline.exported[index]),
           **choice_inputs(qg, fg, pipeline.exported[index].weight_keys,
                           q.memo.setdefault(("choice inputs",), {}),
                           q.memo.setdefault(("switched weights",), {}))}
    return {**params_feed(pipeline.tensors(index), params, pipeline.layers(index), cpu,
                          pipeline.wide(index), wide, q.memo.setdefault(("feed arrays",), {})),
            **own}


class FakeQuantPipeline:
    """The split pipeline with each NPU graph run as its fake-quant model (CPU submodels in
    ONNX Runtime as deployed): ``run(samples, feeds)`` with each graph's parameter inputs.
    ``exported``: `export_graphs`'s models."""

    def __init__(self, split_dir, exported: Mapping[int, Exported]):
        from npubuild.runtime.runner import Runner

        self.exported = dict(exported)
        # each graph's model in parts run one after the other, each part's values kept per
        # sample: a choice reruns a graph from its first part whose parameters changed
        self.parts = {i: [Part(onnx_io.session(m), ins, outs, keys) for m, ins, outs, keys
                          in model_parts(e)] for i, e in self.exported.items()}
        self.inputs = {i: {n for part in parts for n in part.inputs}
                       for i, parts in self.parts.items()}
        self.part_runs = 0  # parts run by ONNX Runtime (the rest came from an earlier run)
        self.kept = KeptParts(KEPT_BYTES)  # every run's part values, by what decides them
        self._seen: set[tuple] = set()  # (graph, its inputs' print) run before
        self._part_prints: dict[int, list[bytes]] = {}  # graph -> each part's feeds' print
        self._feeds: dict[int, dict[str, np.ndarray]] = {}
        self._last: dict[int, tuple] = {}  # id(sample) -> (sample, its last run's steps)
        # (graph, a switched weight's arrays, its switches) -> its value: once per state
        self._weights: dict[tuple, np.ndarray] = {}
        self.prints = ArrayPrints()  # each feed array hashed once, however many runs it is in
        self.runner = Runner(split_dir, backends={"npu": self._npu})

    def tensors(self, index: int) -> list[str]:
        return list(self.exported[index].tensors)

    def layers(self, index: int) -> list[str]:
        return list(self.exported[index].layers)

    def wide(self, index: int) -> list[str]:
        return list(self.exported[index].wide)

    def _npu(self, graph, feeds):
        """Graph ``graph``'s fake-quant outputs on ``feeds``: its parts in order, the first
        ones taken from any earlier run that computed them on the same inputs and parameters
        (`KeptParts`; ONNX Runtime runs each node alone, optimisations off, so a part's values
        are the whole model's bit for bit)."""
        params = self._feeds[graph.index]
        inputs = self.inputs[graph.index]  # a choice's own values only where the model reads them
        # the export reads float32 (a model's int8 input holds integers: `ops.integer_io`)
        feeds = {k: np.asarray(v, np.float32) for k, v in feeds.items()}
        if graph.index not in self._run_weights:  # once per run, not per sample
            self._run_weights[graph.index] = self.weight_feeds(graph.index, params)
        given = {**dict(feeds), **dict(self.exported[graph.index].constants),
                 **{k: v for k, v in params.items() if k in inputs},
                 **self._run_weights[graph.index]}
        # each part's print: the graph's inputs and every parameter up to and with it (an
        # input a reused graph upstream made is the same array as in the run before)
        chains, chain = [], (start := _digest(sorted(
            (k, self.prints(k, v)) for k, v in feeds.items())))
        for own in self._part_prints[graph.index]:
            chain = _digest([("", chain), ("", own)])
            chains.append((graph.index, chain))
        reused = self.kept.taken(chains)
        first = (graph.index, start) not in self._seen  # a sample's first run (int8 everywhere)
        self._seen.add((graph.index, start))
        values = given
        for k, part in enumerate(self.parts[graph.index]):
            if k < len(reused):
                got = reused[k]
            else:
                got = dict(zip(part.outputs, part.session.run(
                    list(part.outputs), {n: values[n] for n in part.inputs})))
                self.part_runs += 1
                if first or k < len(chains) - 1:  # a last part again: the whole graph again
                    self.kept.keep(chains[k], got, first)
            values = {**values, **got}
        return {n: values[n] for n in graph.outputs}

    def weight_feeds(self, index: int, params: Mapping[str, np.ndarray]
                     ) -> dict[str, np.ndarray]:
        """Graph ``index``'s switched weights under the switches in ``params``, each computed
        the first time its layer's switches take those values; where ``params`` carries a
        choice's own integers (``<weight input>::wd``, `choice_inputs`), those on the NPU."""
        out, made = {}, {}  # made: this call's values of a choice's deltas
        for w in self.exported[index].weights:
            npu = params[f"{w.layer}{NPU_SUFFIX}"]
            delta = params.get(f"{w.name}{CHOICE_DELTA_SUFFIX}")
            if delta is not None:  # the float32 operations of an export of the choice's graph
                key = (id(w.real), id(delta), float(npu))  # both held while this call runs
                if key not in made:
                    made[key] = SwitchedWeight(w.name, w.layer, w.real, delta).value(npu, None)
                out[w.name] = made[key]
                continue
            w16 = None if w.wide is None else params[f"{w.layer}{W16_SUFFIX}"]
            # by the arrays (`exported` holds them): layers reading one weight share its value
            key = (index, id(w.real), id(w.delta), id(w.wide), float(npu),
                   None if w16 is None else float(w16))
            if key not in self._weights:
                self._weights[key] = w.value(npu, w16)
            out[w.name] = self._weights[key]
        return out

    def run_all(self, samples, feeds: Sequence[Mapping[int, dict[str, np.ndarray]]],
                kept) -> list[list[dict]]:
        """`run` under each of ``feeds`` (several choices), in order."""
        return [self.run(samples, one, kept) for one in feeds]

    def run(self, samples, feeds: Mapping[int, dict[str, np.ndarray]], kept) -> list[dict]:
        """Per sample, the ``kept`` tensors (model outputs, hand-overs) under ``feeds``. Only
        what a change of parameters can reach runs again: the submodels before the first NPU
        graph whose inputs changed are the sample's last run's (a choice in the last
        segments of a 40-segment pipeline reruns those). A sample is known by identity, so a
        subset of the samples (the search's worst ones) reuses their runs too."""
        self._feeds = dict(feeds)
        self._run_weights: dict[int, dict[str, np.ndarray]] = {}  # `weight_feeds` of this run
        # each input hashed once (a choice's feeds carry every conv's weights: CRAFT's VGG16
        # hashed twice a run was 5 % of its searched quantize), its print then combined; an
        # array an earlier run was fed (a graph's parameters the choice leaves as they were,
        # a layer's weights) keeps its print
        items = {i: {k: self.prints(k, v) for k, v in f.items()} for i, f in feeds.items()}
        prints = {i: _digest(sorted(own.items())) for i, own in items.items()}
        self._part_prints = {i: [_digest(sorted((k, own[k]) for k in part.keys if k in own))
                                 for part in self.parts[i]]
                             for i, own in items.items() if i in self.parts}
        wanted = set(kept)
        out = []
        for sample in samples:
            known = self._last.get(id(sample))
            last = known[1] if known is not None and known[0] is sample else []
            values = self.runner._checked_feeds(dict(sample))
            steps, same = [], True
            for step, graph in enumerate(self.runner.graphs):
                mark = prints.get(graph.index) if graph.device == "npu" else None
                same = same and step < len(last) and last[step][0] == mark
                got = last[step][1] if same else self.runner.backends[graph.device](
                    graph, {t: values[t] for t in graph.inputs})
                values.update({t: np.asarray(got[t]) for t in graph.outputs})
                steps.append((mark, {t: got[t] for t in graph.outputs}))
            self._last[id(sample)] = (sample, steps)
            out.append({k2: v for k2, v in values.items() if k2 in wanted})
        return out


# A fake-quant model of at least this many nodes per part runs in parts (at most MAX_PARTS):
# a choice that changes only a graph's later tensors reruns its later parts (CRAFT's one
# VGG16-BN U-Net graph: the ranking's blocks in pipeline order rerun the backbone before them).
NODES_PER_PART = 24
MAX_PARTS = 4


# The part values kept across runs (`KeptParts`), in bytes: past it the least recently used
# are dropped and computed again when a choice needs them (the same bits). CRAFT at 240x320
# (one VGG16-BN U-Net graph in 4 parts, six verify samples) reached it: its first run's
# values 152 MB, 290 later parts' kept, 314 dropped; the process's peak RSS 9.6 -> 11.7 GB.
KEPT_BYTES = 2 << 30


class KeptParts:
    """Each part's values of every run, by the print of what decides them (the graph's inputs
    and the parameters of that part and every part before it), within ``budget`` bytes: a
    choice reruns a graph from its first part no earlier run computed alike. Where the budget
    is reached the least recently used values go first, the first run's (int8 everywhere,
    from which the ranking's blocks each differ from their own first tensor on) last; a
    value past the budget alone is not kept."""

    def __init__(self, budget: int):
        from collections import OrderedDict

        self.budget = budget
        self.values: OrderedDict = OrderedDict()  # print -> (values, bytes), oldest first
        self.first: dict = {}                      # the first run's prints -> (values, bytes)
        self.bytes = 0
        self.peak = 0  # the most bytes kept at once
        self.dropped = 0  # values dropped or not kept for the budget (computed again if needed)

    def taken(self, prints: Sequence) -> list[dict]:
        """The kept values of the longest run of ``prints`` from the first, in order."""
        out = []
        for key in prints:
            if key in self.values:
                self.values.move_to_end(key)
                out.append(self.values[key][0])
            elif key in self.first:
                out.append(self.first[key][0])
            else:
                break
        return out

    def keep(self, key, values: dict, first: bool = False) -> None:
        """Keeps ``values`` under ``key``; ``first``: of a sample's first run, never dropped."""
        size = sum(np.asarray(v).nbytes for v in values.values())
        if key in self.values or key in self.first:
            return
        while self.values and self.bytes + size > self.budget:
            _, (_, dropped) = self.values.popitem(last=False)
            self.bytes -= dropped
            self.dropped += 1
        if self.bytes + size > self.budget:  # the first runs' values fill the budget
            self.dropped += 1
            return
        (self.first if first else self.values)[key] = (values, size)
        self.bytes += size
        self.peak = max(self.peak, self.bytes)


class ArrayPrints:
    """``_digest([(name, array)])`` of each feed, computed once per array object: a search's
    feeds hand the same arrays to run after run (each graph's parameters under a choice that
    leaves the graph alone, each conv layer's weights where its tensors keep their parameters,
    a sample's inputs to a graph whose upstream graphs were reused), and hashing every feed of
    every run was 1.8 of the selfie segmenter's 21 s of searched quantize under cProfile. An
    array is known by identity while it lives (a weak reference: a freed array's id may be
    reused), so the feeds must not change in place once fed (none is: each is made for its
    choice and only read after); ``computed`` counts the digests made."""

    def __init__(self):
        self.known: dict[tuple[str, int], tuple] = {}  # (name, id) -> (weak ref, print)
        self.computed = 0

    def __call__(self, name: str, value) -> bytes:
        key = (name, id(value))
        known = self.known.get(key)
        if known is not None and known[0]() is value:
            return known[1]
        digest = _digest([(name, value)])
        self.computed += 1
        try:
            ref = weakref.ref(value, lambda _, key=key, known=self.known: known.pop(key, None))
        except TypeError:  # not weakly referable (a numpy scalar, bytes): hashed every time
            return digest
        self.known[key] = (ref, digest)
        return digest


@dataclass(frozen=True)
class Part:
    """One part of a fake-quant model: its session, the names it reads (graph inputs and
    earlier parts' values) and writes (values later parts or the graph's outputs read), and
    the parameter inputs whose values decide it (`FakeQuantPipeline` feeds' keys)."""

    session: object
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    keys: frozenset[str]


def _digest(items) -> bytes:
    """One hash over (name, array) pairs, in the order given."""
    import hashlib

    h = hashlib.blake2b(digest_size=16)
    for name, value in items:
        h.update(name.encode() + b"\0")
        if isinstance(value, bytes):
            h.update(value)
        else:
            h.update(str(np.asarray(value).dtype).encode() + str(np.shape(value)).encode())
            h.update(np.ascontiguousarray(value).tobytes())
    return h.digest()


def _branch_types(node) -> list | None:
    """An If's outputs typed as both its branches declare them (each a tensor of one element
    type); None for any other node, or an If whose branches leave a type open or differ."""
    if node.op_type != "If" or node.domain not in onnx_io.STANDARD_DOMAINS:
        return None
    branches = {a.name: a.g for a in node.attribute if a.type == onnx.AttributeProto.GRAPH}
    declared = [[o.type.tensor_type.elem_type if o.type.HasField("tensor_type") else 0
                 for o in branches[b].output] for b in ("then_branch", "else_branch")
                if b in branches]
    if len(declared) != 2 or declared[0] != declared[1] or len(declared[0]) != len(node.output) \
            or not all(declared[0]):
        return None
    return [helper.make_tensor_value_info(out, elem, None)
            for out, elem in zip(node.output, declared[0]) if out]


def _inferred_types(model: onnx.ModelProto) -> list:
    """The value types ONNX infers for ``model``, each If that its branches type (a tensor's
    switch: fake quantization or the float value) taken out and its outputs given as inputs
    of those types: ONNX infers each branch with its own copy of every outer value's type,
    quadratic in the switches of a large model (GTCRN's 26,342 nodes, 5,361 Ifs: 89 s alone,
    most of its quantize stage). What is inferred is the same: an If's outputs have the
    types its branches declare, whose inference does not reach the outer graph."""
    graph = model.graph
    kept, stubs = [], []
    for node in graph.node:
        typed = _branch_types(node)
        if typed is None:
            kept.append(node)
        else:
            stubs.extend(typed)
    if not stubs:
        return list(onnx.shape_inference.infer_shapes(model).graph.value_info)
    flat = helper.make_graph(kept, graph.name, [*graph.input, *stubs], list(graph.output),
                             list(graph.initializer), value_info=list(graph.value_info))
    typed_model = helper.make_model(flat, opset_imports=list(model.opset_import),
                                    functions=list(model.functions))
    typed_model.ir_version = model.ir_version
    return [*onnx.shape_inference.infer_shapes(typed_model).graph.value_info, *stubs]


def model_parts(exported: Exported):
    """``exported``'s model cut into parts of about equal node counts (`NODES_PER_PART`, at
    most `MAX_PARTS`; one part for a small model): per part its model, the names it reads
    and writes, and the feed keys that decide its values (its parameter, switch, weight and
    constant inputs, and for a switched weight its layer's switches and delta)."""
    model = exported.model
    graph = model.graph
    nodes = list(graph.node)
    # cut only where a fake quantization begins (its Split of ``<t>::fq``): every value
    # crossing a cut is then a float tensor, never a switch's bool
    starts = [k for k, n in enumerate(nodes) if k and n.op_type == "Split"
              and n.input[0].endswith(PARAMS_SUFFIX)]
    count = max(1, min(MAX_PARTS, len(nodes) // NODES_PER_PART))
    cuts = sorted({next((k for k in starts if k >= len(nodes) * j / count), len(nodes))
                   for j in range(1, count)} - {len(nodes)})
    bounds = [0, *cuts, len(nodes)]
    count = len(bounds) - 1
    inits = {i.name: i for i in graph.initializer}
    graph_inputs = {v.name: v for v in graph.input}
    outputs = [o.name for o in graph.output]
    types = {v.name: v for v in [*graph.value_info, *graph.input, *graph.output]}
    if count > 1:  # a value a fragment makes that is not float (a shape) crosses with its type
        try:
            inferred = _inferred_types(model)
        except Exception:  # noqa: BLE001  (no types inferred: float, what fake quantization gives)
            inferred = []
        types = {**{v.name: helper.make_tensor_value_info(
            v.name, v.type.tensor_type.elem_type, None) for v in inferred
            if v.type.HasField("tensor_type")}, **types}
    weights = {w.name: w for w in exported.weights}
    reads = [onnx_io.node_uses(n) for n in nodes]  # a body's outer values too
    made_in = {out: k for k, n in enumerate(nodes) for out in n.output}
    parts = []
    for a, b in zip(bounds, bounds[1:]):
        read = list(dict.fromkeys(n for r in reads[a:b] for n in r))
        ins = ([n for n in read if n not in inits and (n in graph_inputs
                                                        or made_in.get(n, a) < a)]
               if count > 1 else list(graph_inputs))  # a whole model is fed every input
        later = {n for r in reads[b:] for n in r} | set(outputs)
        outs = [o for n in nodes[a:b] for o in n.output if o in later]
        keys = set()
        for n in ins:
            if n in graph_inputs:
                keys.add(n)
                w = weights.get(n)
                if w is not None:
                    keys.update({f"{w.layer}{NPU_SUFFIX}", f"{w.layer}{W16_SUFFIX}",
                                 f"{w.name}{CHOICE_DELTA_SUFFIX}"})
        if count == 1:
            parts.append((model, tuple(ins), tuple(outs), frozenset(keys)))
            continue
        value = lambda n: types.get(n) or helper.make_tensor_value_info(  # noqa: E731
            n, TensorProto.FLOAT, None)
        part = helper.make_graph(nodes[a:b], f"{graph.name}_part{len(parts)}",
                                 [value(n) for n in ins], [value(n) for n in outs],
                                 [inits[n] for n in read if n in inits])
        m = helper.make_model(part, opset_imports=list(model.opset_import),
                              functions=list(model.functions))
        m.ir_version = model.ir_version
        parts.append((m, tuple(ins), tuple(outs), frozenset(keys)))
    return parts
