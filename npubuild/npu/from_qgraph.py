"""`LayerSpec`s from a quantized graph (``QGraph``), so the tiler plans the int8 graph.

Every tensor gets a 4-D NCHW *view* for the tiler and the simulator: a 4-D tensor is its own
view; a tensor of rank ≤ 3 is left-padded to rank 3, ``(N, C, L)``, and viewed as
``(N, C, L, 1)`` (so YOLO's ``[1, 82, 2100]`` head keeps its channels in lanes and its length
in H, where the tiler can slice it; numpy broadcasting between rank ≤ 3 operands is
unchanged); a rank > 4 tensor merges its leading axes (only group breakers touch those). A
view is a reshape of the C-order data, so a tensor's GMEM bytes are the same whichever shape
reads them.

A layer is *tiled* (it joins layer groups and runs from LMEM, sliced along N/H/C) when the tiler
can map its output rows to input rows: conv and pools on 4-D tensors, a fully connected layer
on one vector (its output rows read every input row: a group holding it is not sliced along H),
resize (exact per-row input spans), element-wise add/mul/rescale/lut whose operands broadcast
the same way in the view, concat/split/slice/pad that do not act along N or H (a concat or a
constant pad along H too), softmax along C or W, reshapes that keep N and C and regroup
H x W — unless no tiled layer other than a reshape is beside them: such a reshape is an alias
in GMEM — and chains of reshapes and transposes that permute the channels and keep every row
(a channel shuffle: one ``channel_permute`` layer, `fold_channel_permutations`). Every other
layer is a **group breaker**: the layer list is cut around it, it runs between groups as a
whole-tensor step on GMEM, and the tensors crossing it go through GMEM. Breakers execute as

- ``dma``: data movement (reshape, transpose, slice/split/pad along N or H, a concat that only
  copies): a GMEM → GMEM copy by the DMA engine, costing its bytes in the estimate;
- ``cpu``: ``float`` layers (no integer kernel), dequantized → ONNX node → quantized;
- ``npu``: integer arithmetic the tiler cannot slice (a fully connected layer on more than one
  vector, or one whose weights fit LMEM in no group (`layer_group`), a concat along H
  that requantizes an input, a rank mix in a broadcast): computed whole by the integer kernel
  from GMEM, its traffic counted like a DMA step (its compute cycles are not modelled).

Conv weights are stored per output channel as one record (int8 weights, then the int32 bias, the
requantization multiplier and shift), so a C slice of a layer loads a contiguous run of records
and the simulator reads every parameter from LMEM; a per-channel PRelu (a ``rescale`` with
``attrs.axis``) stores its negative side's multiplier and shift the same way; a lookup table is
copied to every lane.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field, replace
from math import prod
from typing import Any, Callable

import numpy as np

from npubuild.errors import working_on
from npubuild.npu.layer_group import (CpuLayer, GroupFits, LayerGroups, plan_groups,
                                      reads_whole_input, whole_step)
from npubuild.npu.layers import LayerGraph, LayerSpec, Shape
from npubuild.quant import reference
from npubuild.quant.qgraph import QGraph, QLayer
from npubuild.targets.model import Chip

ELEMENTWISE = {"add": "add", "mul": "eltwise", "rescale": "eltwise", "lut": "lut"}
MOVES = ("reshape", "transpose", "depth_to_space", "slice", "split", "pad",
         "channel_permute")  # no arithmetic: a DMA can do them
SPATIAL = ("conv", "maxpool", "avgpool")


class NotTiled(Exception):
    """Why a layer is a group breaker (the message is shown in plan.json and the report)."""


@dataclass(frozen=True)
class TensorInfo:
    """A tensor as the program sees it: real shape, 4-D view, integer type, quantization."""

    name: str
    shape: tuple[int, ...]
    view: Shape
    dtype: str
    scale: float | None
    zero_point: int
    log2scale: int | None
    constant: bool = False

    @property
    def itemsize(self) -> int:
        return np.dtype(self.dtype).itemsize

    def as_dict(self) -> dict:
        return {"shape": list(self.shape), "view": list(self.view), "dtype": self.dtype,
                "scale": self.scale, "zero_point": self.zero_point, "log2scale": self.log2scale,
                "constant": self.constant}


@dataclass(frozen=True)
class WeightRecord:
    """The bytes one output channel's parameters take in GMEM and LMEM, field by field.

    ``fields``: (array name, stored dtype, count per channel, the array's own dtype) in record
    order; ``replicated``: a table copied whole to every lane instead (lookup tables).
    """

    fields: tuple[tuple[str, str, int, str], ...]
    replicated: bool = False

    @property
    def bytes(self) -> int:
        return sum(np.dtype(dt).itemsize * n for _, dt, n, _ in self.fields)

    def as_dict(self) -> dict:
        return {"fields": [list(f) for f in self.fields], "replicated": self.replicated,
                "bytes": self.bytes}


@dataclass(frozen=True)
class Breaker:
    layer: str
    executes: str  # dma | cpu | npu
    reason: str


@dataclass
class QLayers:
    """A QGraph ready for the tiler: layer specs, the kernels the simulator runs, breakers."""

    qgraph: QGraph
    graph: LayerGraph
    kernels: dict[str, QLayer]  # attrs remapped to the views for tiled layers
    tensors: dict[str, TensorInfo]
    weights: dict[str, WeightRecord] = field(default_factory=dict)
    breakers: dict[str, Breaker] = field(default_factory=dict)

    def weight_bytes(self, layer: str) -> bytes:
        """The layer's weights as GMEM holds them (records in output channel order)."""
        return pack_weights(self.kernels[layer], self.weights[layer])

    def segments(self) -> list[list[LayerSpec]]:
        """Runs of tiled layers, with every breaker alone in its own run."""
        runs: list[list[LayerSpec]] = []
        for spec in self.graph.layers:
            if spec.name in self.breakers or not runs or runs[-1][0].name in self.breakers:
                runs.append([spec])
            else:
                runs[-1].append(spec)
        return runs


# ---- views --------------------------------------------------------------------------------

def view4(shape) -> Shape:
    shape = tuple(int(d) for d in shape)
    if len(shape) == 4:
        return shape
    if len(shape) > 4:
        return (prod(shape[:-3]), *shape[-3:])
    n, c, length = (1,) * (3 - len(shape)) + shape
    return (n, c, length, 1)


def view_axis(axis: int, rank: int) -> int:
    """Where axis ``axis`` of a rank-``rank`` tensor lands in its 4-D view."""
    axis %= max(rank, 1)
    if rank == 4:
        return axis
    if rank > 4:
        raise NotTiled(f"a rank-{rank} tensor")
    return axis + 3 - rank


def _tensor_infos(qgraph: QGraph) -> dict[str, TensorInfo]:
    return {name: _tensor_info(qgraph, name, t) for name, t in qgraph.tensors.items()}


def _tensor_info(qgraph: QGraph, name: str, t) -> TensorInfo:
    shape = tuple(t.shape) if t.shape or name not in qgraph.constants else \
        qgraph.constants[name].shape
    return TensorInfo(name, tuple(shape), view4(shape), t.dtype, t.scale,
                      int(t.zero_point or 0), t.log2scale, name in qgraph.constants)


# ---- the conversion -----------------------------------------------------------------------

def layers_from_qgraph(qgraph: QGraph, memo: LayerMemo | None = None) -> QLayers:
    """Every layer of ``qgraph`` as a `LayerSpec`; the ones the tiler cannot slice as breakers.
    ``memo``: each layer's conversion kept across graphs that share layer objects
    (`LayerMemo`: the precision search prices one graph under hundreds of choices)."""
    tensors = _tensor_infos(qgraph) if memo is None else memo.infos(qgraph)
    qgraph = fold_channel_permutations(qgraph, tensors, memo)
    specs, kernels, weights, breakers = [], {}, {}, {}
    for layer in qgraph.layers:
        converted = memo.get(layer, tensors) if memo is not None else None
        if converted is None:
            converted = _converted(layer, tensors)
            if memo is not None:
                memo.put(layer, tensors, converted)
        spec, kernel, record, breaker = converted
        if breaker is not None:
            breakers[layer.name] = breaker
        specs.append(spec)
        kernels[layer.name] = kernel
        if record is not None:
            weights[layer.name] = record
    for i in _lone_reshapes(qgraph, breakers):
        layer = qgraph.layers[i]
        specs[i], kernels[layer.name] = _breaker_spec(layer, tensors, "dma", None), layer
        breakers[layer.name] = Breaker(layer.name, "dma", LONE_RESHAPE)
    keys = weight_keys(specs, kernels, weights, memo)
    specs = [replace(spec, weight_key=keys[spec.name]) if spec.name in keys else spec
             for spec in specs]
    specs = breakers_first(specs, breakers)
    produced = {t for layer in qgraph.layers for t in layer.outputs}
    read = dict.fromkeys(t for layer in qgraph.layers for t in layer.inputs)
    inputs = [t for t in qgraph.inputs if t in read] + [
        t for t in read if t not in produced and t not in qgraph.inputs]
    shapes = {name: info.view for name, info in tensors.items()}
    graph = LayerGraph(tuple(specs), tuple(inputs), tuple(qgraph.outputs), shapes,
                       constants=frozenset(t for t in inputs if tensors[t].constant))
    return QLayers(qgraph, graph, kernels, tensors, weights, breakers)


def breakers_first(specs: list[LayerSpec], breakers) -> list[LayerSpec]:
    """The layers in an order where a breaker that reads nothing the run of tiled layers
    before it makes runs before that run, so the run goes on past it: an unrolled
    recurrence takes each step's slice of a tensor computed for every step at once (the
    input projection, the mask) between groups, which cut the steps into groups of one step
    each; before the steps, they leave the steps one run, whose groups keep the weights the
    steps share in LMEM. (A topological order still: what the breaker reads comes before the
    run, what reads it after.)"""
    order: list[LayerSpec] = []
    run: list[LayerSpec] = []
    made: set[str] = set()  # what the run makes
    for spec in specs:
        if spec.name not in breakers:
            run.append(spec)
            made.update(spec.outputs)
        elif made.isdisjoint(spec.inputs):
            order.append(spec)
        else:
            order += run + [spec]
            run, made = [], set()
    return order + run


def _converted(layer: QLayer, tensors: dict[str, TensorInfo]):
    """One layer as the tiler sees it: (spec, kernel, weight record, breaker or None)."""
    try:
        with working_on(node=(layer.source_nodes or [layer.name])[0],
                        tensor=layer.outputs[0] if layer.outputs else None):
            spec, kernel, record = _tiled(layer, tensors)
        return spec, kernel, record, None
    except NotTiled as exc:
        executes = _executes(layer)
        record = conv_record(layer) if layer.kind == "conv" else None
        spec = _breaker_spec(layer, tensors, executes, record)
        return spec, layer, record, Breaker(layer.name, executes, str(exc))


def weight_keys(specs: list[LayerSpec], kernels: dict[str, QLayer],
                records: dict[str, WeightRecord], memo: LayerMemo | None = None
                ) -> dict[str, str]:
    """Each layer whose weights GMEM holds as the same bytes as another layer's (the same
    record layout and the same values: `pack_weights` makes the same bytes) → the first such
    layer's name (`LayerSpec.weight_key`). Only layers whose record layout and size another
    layer has too are hashed, each once (with ``memo``, once across graphs)."""
    by_layout: dict[tuple, list[str]] = {}
    for spec in specs:
        if spec.weight_bytes and spec.name in records:
            by_layout.setdefault((records[spec.name], spec.weight_bytes), []).append(spec.name)
    keys: dict[str, str] = {}
    for names in by_layout.values():
        if len(names) < 2:
            continue
        by_digest: dict[bytes, list[str]] = {}
        for name in names:  # graph order: the first of a digest owns it
            digest = (memo.digest(kernels[name], records[name]) if memo is not None
                      else weight_digest(kernels[name], records[name]))
            by_digest.setdefault(digest, []).append(name)
        for same in by_digest.values():
            if len(same) > 1:
                keys.update(dict.fromkeys(same, same[0]))
    return keys


def weight_digest(kernel: QLayer, record: WeightRecord) -> bytes:
    """A digest of the bytes `pack_weights` makes of ``kernel``'s weights, from each record
    field's values in its stored type (no record interleaving: the arrays are hashed where
    they are, an int8 weight without a copy)."""
    digest = hashlib.blake2b(repr(record).encode(), digest_size=20)
    for name, stored, _, _ in record.fields:
        values = np.ascontiguousarray(np.asarray(kernel.arrays[name]).astype(stored, copy=False))
        digest.update(values.nbytes.to_bytes(8, "little"))
        digest.update(values.data)
    return digest.digest()


class LayerMemo:
    """`layers_from_qgraph`'s conversions by layer object and the `TensorInfo` of the
    layer's own tensors (what a conversion reads: its inputs' and outputs' shapes, widths and
    parameters), for graphs that share their unchanged layer objects (`price.GraphPricer`: a
    choice changes a few tensors' widths and moves a few layers to the CPU; the other 4,000
    of GTCRN's layers were converted again per price). Holds each layer it keys, so no other
    object takes its id while the entry lives. ``converted`` counts the conversions made,
    ``hashed`` the weights hashed (`weight_keys`)."""

    def __init__(self):
        self._found: dict[int, tuple[QLayer, tuple, tuple]] = {}
        self._infos_of: dict[int, tuple[object, TensorInfo]] = {}  # id(QTensor) -> its info
        self._digests: dict[int, tuple[QLayer, WeightRecord, bytes]] = {}  # id(kernel) ->
        self._permutes: dict[tuple[int, ...], tuple] = {}  # ids of a chain's layers ->
        self.hashed = 0
        self.converted = 0

    def infos(self, qgraph: QGraph) -> dict[str, TensorInfo]:
        """`_tensor_infos` of ``qgraph``, each kept by its `QTensor` object (a graph's
        constants and tensor names stay; the memo serves one graph's variants)."""
        infos = {}
        for name, t in qgraph.tensors.items():
            found = self._infos_of.get(id(t))
            if found is None or found[0] is not t:
                found = self._infos_of[id(t)] = (t, _tensor_info(qgraph, name, t))
            infos[name] = found[1]
        return infos

    @staticmethod
    def _infos(layer: QLayer, tensors: dict[str, TensorInfo]) -> tuple:
        return tuple(tensors[t] for t in (*layer.inputs, *layer.outputs))

    def get(self, layer: QLayer, tensors: dict[str, TensorInfo]):
        found = self._found.get(id(layer))
        if found is None or found[0] is not layer or found[1] != self._infos(layer, tensors):
            return None
        return found[2]

    def put(self, layer: QLayer, tensors: dict[str, TensorInfo], converted: tuple) -> None:
        self._found[id(layer)] = (layer, self._infos(layer, tensors), converted)
        self.converted += 1

    def permute_layer(self, members: list[QLayer], tensors: dict[str, TensorInfo]):
        """`permute_layer`, kept by the members' layer objects and their tensors' infos (the
        same layer object each time, so its conversion is kept too)."""
        key = tuple(id(layer) for layer in members)
        infos = (tensors[members[0].inputs[0]], tensors[members[-1].outputs[0]])
        found = self._permutes.get(key)
        if found is None or found[1] != infos or any(
                a is not b for a, b in zip(found[0], members)):
            found = self._permutes[key] = (tuple(members), infos,
                                           permute_layer(members, tensors))
        return found[2]

    def digest(self, kernel: QLayer, record: WeightRecord) -> bytes:
        """`weight_digest`, kept by the kernel object and its record (a converted layer's
        kernel and record stay the same objects while its conversion is kept)."""
        found = self._digests.get(id(kernel))
        if found is None or found[0] is not kernel or found[1] != record:
            found = self._digests[id(kernel)] = (kernel, record, weight_digest(kernel, record))
            self.hashed += 1
        return found[2]


LONE_RESHAPE = ("reshape with no tiled layer beside it: its output is an alias of its input in "
                "GMEM (no data moves), where a group of its own would load and store it")


def _lone_reshapes(qgraph: QGraph, breakers: dict[str, Breaker]) -> list[int]:
    """The tiled reshapes that no tiled layer other than a reshape produces or reads, through
    chains of reshapes: tiled, each would be a group of its own loading and storing its tensor
    (between two breakers, or between a breaker and a model input or output), where a breaker
    reshape is a GMEM alias that moves nothing. A reshape beside a tiled layer stays tiled: in
    that layer's group it costs no more than the alias and keeps the group whole."""
    layers = qgraph.layers
    tiled = {layer.name for layer in layers if layer.name not in breakers}
    producers, consumers = qgraph.producers(), qgraph.consumers()
    by_name = {layer.name: layer for layer in layers}
    reshapes = {name for name in tiled if by_name[name].kind == "reshape"}

    def neighbours(name: str) -> list[str]:
        layer = by_name[name]
        found = [producers[t].name for t in layer.inputs if t in producers]
        return found + [r.name for t in layer.outputs for r in consumers.get(t, [])]

    anchored, frontier = set(), [r for r in sorted(reshapes)
                                 if any(n in tiled and n not in reshapes for n in neighbours(r))]
    while frontier:  # reshapes joined to a tiled layer, directly or through other reshapes
        name = frontier.pop()
        if name not in anchored:
            anchored.add(name)
            frontier += [n for n in neighbours(name) if n in reshapes and n not in anchored]
    return [i for i, layer in enumerate(layers) if layer.name in reshapes - anchored]


def _executes(layer: QLayer) -> str:
    """cpu for float layers (npu for one on the NPU: the chip's toolchain runs it in its own
    int8 kernel, `OpSupport.vendor_kernel`); dma for pure data movement; npu for integer
    arithmetic."""
    if layer.device == "cpu":
        return "cpu"
    if layer.kind == "float":
        return "npu"
    if layer.kind == "concat":
        p = layer.params
        moves = all(m == 1 and n == 0 and zp == p.get("output_zp", 0) for m, n, zp in
                    zip(p["multipliers"], p["shifts"], p["input_zps"]))
        return "dma" if moves else "npu"
    if layer.kind == "resize":
        return "dma" if layer.attrs["mode"] == "nearest" else "npu"
    return "dma" if layer.kind in MOVES else "npu"


def _act_bytes(layer: QLayer, tensors: dict[str, TensorInfo]) -> int:
    return max(tensors[t].itemsize for t in [*layer.inputs, *layer.outputs])


def _precision(layer: QLayer, tensors: dict[str, TensorInfo]) -> tuple:
    """``(("precision", p),)`` for a layer whose MAC operands are 16-bit (`LayerSpec.precision`:
    ``int16`` for 16-bit activations, ``w16a16`` with 16-bit weights too); nothing for int8, so
    an int8 layer's attrs (and plan.json) stay as they were."""
    if layer.device != "npu" or layer.kind == "float":  # not on the integer MAC array
        return ()
    acts = any(_is_16bit(tensors[t].dtype) for t in layer.inputs if not tensors[t].constant)
    weight = layer.arrays.get("weight")
    wide = weight is not None and _is_16bit(weight.dtype)
    if acts and wide:
        return (("precision", "w16a16"),)
    return (("precision", "int16"),) if acts or wide else ()


def _is_16bit(dtype) -> bool:
    return np.dtype(dtype) in (np.int16, np.uint16)


def _breaker_spec(layer: QLayer, tensors: dict[str, TensorInfo], executes: str,
                  record: WeightRecord | None) -> LayerSpec:
    """A whole-tensor step between groups; a conv (a fully connected layer, or a conv on a
    tensor that is not 4-D) keeps its weights, which GMEM holds, and its MACs."""
    outs = [tensors[t].view for t in layer.outputs]
    macs, weight_bytes = sum(prod(o) for o in outs), 0
    if record is not None:
        weight = layer.arrays["weight"]
        cout = weight.shape[0]
        macs, weight_bytes = sum(prod(o) for o in outs) * (weight.size // cout), cout * record.bytes
    elif layer.kind == "float" and executes == "npu":
        macs = _node_macs(layer, tensors)
    attrs = (("kind", layer.kind), ("executes", executes)) + _precision(layer, tensors)
    if record is not None:  # (output channels, what each reads): the MAC array's shape of it
        attrs += (("weights", (cout, weight.size // cout)),)
    elif layer.kind == "matmul":  # the right operand's columns stand for output channels
        right = tensors[layer.inputs[1]].shape
        depth, columns = (right[-2], right[-1]) if len(right) > 1 else (right[0], 1)
        macs = sum(prod(o) for o in outs) * depth
        attrs += (("weights", (columns, depth)),)
    return LayerSpec(layer.name, "move", tuple(layer.inputs), tuple(layer.outputs),
                     tuple(tensors[t].view for t in layer.inputs), tuple(outs),
                     weight_bytes=weight_bytes, macs=macs, act_bytes=_act_bytes(layer, tensors),
                     attrs=attrs)


def _node_macs(layer: QLayer, tensors: dict[str, TensorInfo]) -> int:
    """The MACs of a float layer's ONNX node at its tensors' shapes (the split's one MAC
    rule, `node_macs`)."""
    import onnx

    from npubuild.split.cost import model_macs

    model = onnx.load_from_string(layer.arrays["model"].tobytes())
    for value in model.graph.input:
        value.CopyFrom(onnx.helper.make_tensor_value_info(
            value.name, onnx.TensorProto.FLOAT, list(tensors[value.name].shape)))
    return model_macs(model)


def _tiled(layer: QLayer, tensors: dict[str, TensorInfo]):
    if layer.device != "npu":
        raise NotTiled("no integer kernel: runs on the CPU between groups")
    if layer.kind == "float":
        raise NotTiled("the chip's toolchain runs it in its own kernel: a whole-tensor step "
                       "between groups")
    if layer.kind == "matmul":
        raise NotTiled("a MatMul of two activations: computed whole between groups")
    if layer.kind == "layernorm":
        raise NotTiled("a layer normalization: whole rows, computed between groups")
    if layer.kind == "lrn":
        raise NotTiled("a local response normalization: windows across channels, computed "
                       "between groups")
    convert = CONVERTERS.get(layer.kind)
    if convert is None:
        raise NotTiled(f"{layer.kind}: changes the tensor layout, runs as a whole-tensor DMA "
                       "step between groups")
    ranks = [len(tensors[t].shape) for t in [*layer.inputs, *layer.outputs]]
    if max(ranks) > 4:
        raise NotTiled(f"a rank-{max(ranks)} tensor: the tiler slices 4-D views only")
    kernel, extra, record = convert(layer, tensors)
    ins, outs = [tensors[t].view for t in layer.inputs], [tensors[t].view for t in layer.outputs]
    base = dict(name=layer.name, inputs=tuple(layer.inputs), outputs=tuple(layer.outputs),
                in_shapes=tuple(ins), out_shapes=tuple(outs),
                act_bytes=_act_bytes(layer, tensors))
    attrs = (("kind", layer.kind),) + extra.pop("attrs", ()) + _precision(layer, tensors)
    extra.setdefault("macs", sum(prod(o) for o in outs))
    spec = LayerSpec(**base, **extra, attrs=attrs)
    return spec, kernel, record


def _kernel(layer: QLayer, **attrs) -> QLayer:
    """The layer with some attrs replaced (the views' axes); arrays shared, not copied."""
    return QLayer(layer.name, layer.kind, list(layer.inputs), list(layer.outputs),
                  {**layer.attrs, **attrs}, dict(layer.params), dict(layer.arrays),
                  list(layer.source_nodes), layer.device)


def _rank(tensors, name) -> int:
    return len(tensors[name].shape)


def _need_4d(layer: QLayer, tensors) -> None:
    if any(_rank(tensors, t) != 4 for t in [layer.inputs[0], *layer.outputs]):
        raise NotTiled(f"{layer.kind} on a tensor that is not 4-D")


def _window(layer: QLayer) -> dict:
    a = layer.attrs
    return dict(kernel_h=int(a["kernel"][0]), stride_h=int(a["stride"][0]),
                pad_top=int(a["pads"][0]), pad_bottom=int(a["pads"][1]),
                dilation_h=int(a.get("dilation", [1, 1])[0]))


def _conv(layer: QLayer, tensors):
    if layer.attrs.get("fc"):
        return _fully_connected(layer, tensors)
    _need_4d(layer, tensors)
    w = layer.arrays["weight"]
    cout, cin_g, kh, kw = w.shape
    group = int(layer.attrs.get("group", 1))
    cin = tensors[layer.inputs[0]].view[1]
    n, _, ho, wo = tensors[layer.outputs[0]].view
    record = conv_record(layer)
    op = "dwconv" if group > 1 and group == cin == cout else "conv"
    extra = dict(_window(layer), op=op, weight_bytes=cout * record.bytes,
                 macs=n * cout * ho * wo * cin_g * kh * kw,
                 attrs=(("group", group), ("kernel", tuple(layer.attrs["kernel"]))))
    return layer, extra, record


def _fully_connected(layer: QLayer, tensors):
    """A fully connected layer on one vector (a rank ≤ 3 input of one row: its view is one
    channel, the features along H) joins layer groups as an ``fc``: in a group its weights stay
    in LMEM across the layers that share them (an unrolled recurrence's steps,
    `LayerSpec.weight_key`) instead of coming from GMEM at every step. On more vectors (their
    view spreads them over channels, each needing every weight) it runs whole between groups."""
    x, y = tensors[layer.inputs[0]], tensors[layer.outputs[0]]
    if len(x.shape) > 3 or len(y.shape) > 3 or x.view[:2] != (1, 1) or y.view[:2] != (1, 1):
        raise NotTiled("a fully connected layer: computed whole between groups")
    record = conv_record(layer)
    weight = layer.arrays["weight"]
    cout, depth = weight.shape[0], weight.size // weight.shape[0]
    extra = dict(op="fc", weight_bytes=cout * record.bytes, macs=cout * depth,
                 attrs=(("weights", (cout, depth)),))
    return layer, extra, record


RECORD_PARAM_BYTES = 4 + 4 + 1
"""A conv record's bytes past its int8 weights for a typical layer: int32 bias, int32
multiplier, int8 shift (`conv_record` stores each in the narrowest type that holds it)."""


def conv_record(layer: QLayer) -> WeightRecord:
    """Weights, bias, multiplier and shift of one output channel, narrowest exact types."""
    w = layer.arrays["weight"]
    weight = ("weight", str(w.dtype), int(np.prod(w.shape[1:])), str(w.dtype))
    return WeightRecord((weight, *channel_record(layer, ("bias", "multiplier", "shift")).fields))


NEGATIVE_SIDE = ("negative_multiplier", "negative_shift")
"""A per-channel PRelu's parameters (a ``rescale`` with ``attrs.axis``): one pair per channel."""


def channel_record(layer: QLayer, keys) -> WeightRecord:
    """One value of each array in ``keys`` per output channel, in the narrowest exact type."""
    fields = []
    for key in keys:
        values = np.asarray(layer.arrays[key])
        fields.append((key, _narrowest(values), 1, str(values.dtype)))
    return WeightRecord(tuple(fields))


def _narrowest(values: np.ndarray) -> str:
    values = np.asarray(values)
    for dtype in ("int8", "int16", "int32"):
        info = np.iinfo(dtype)
        if values.size == 0 or (values.min() >= info.min and values.max() <= info.max):
            return dtype
    return "int64"


def _pool(layer: QLayer, tensors):
    _need_4d(layer, tensors)
    n, c, ho, wo = tensors[layer.outputs[0]].view
    kh, kw = layer.attrs["kernel"]
    extra = dict(_window(layer), op="pool", macs=n * c * ho * wo * kh * kw,
                 attrs=(("kernel", tuple(layer.attrs["kernel"])),))
    if layer.kind == "avgpool":
        extra["scratch_elem_bytes"] = 2 if kh * kw * 256 < 2 ** 15 else 4
    return layer, extra, None


def _resize(layer: QLayer, tensors):
    _need_4d(layer, tensors)
    in_h = tensors[layer.inputs[0]].view[2]
    out_h = tensors[layer.outputs[0]].view[2]
    spans = tuple(reference.resize_input_rows(layer, r, r + 1, in_h) for r in range(out_h))
    scale = out_h // in_h if out_h % in_h == 0 else 1
    extra = dict(op="resize", scale_h=max(scale, 1),
                 attrs=(("row_spans", spans), ("mode", layer.attrs["mode"])))
    return layer, extra, None


def _elementwise(layer: QLayer, tensors):
    out = tensors[layer.outputs[0]]
    for t in layer.inputs:
        info = tensors[t]
        if len(info.shape) != len(out.shape) and len(out.shape) == 4 and prod(info.shape) != 1:
            raise NotTiled(f"operand {t!r} of rank {len(info.shape)} broadcasts onto a 4-D "
                           "tensor: computed whole between groups")
        if info.view[0] != out.view[0] or info.view[2] not in (1, out.view[2]):
            raise NotTiled(f"operand {t!r} broadcasts along N or H: computed whole between "
                           "groups")
    extra: dict[str, Any] = {"op": ELEMENTWISE[layer.kind]}
    if layer.kind == "lut":  # one table, copied to every lane
        table = layer.arrays["table"]
        extra["weight_bytes"] = table.nbytes
        return layer, extra, WeightRecord((("table", str(table.dtype), table.size,
                                            str(table.dtype)),), True)
    if layer.kind == "rescale" and "axis" in layer.attrs:  # a negative side per channel
        if view_axis(layer.attrs["axis"], _rank(tensors, layer.inputs[0])) != 1:
            raise NotTiled("one PRelu slope per index of an axis that is not the channel axis: "
                           "computed whole between groups")
        record = channel_record(layer, NEGATIVE_SIDE)
        extra["weight_bytes"] = tensors[layer.outputs[0]].view[1] * record.bytes
        return _kernel(layer, axis=1), extra, record
    if layer.kind == "mul":
        extra["scratch_elem_bytes"] = 2 * max(tensors[t].itemsize for t in layer.inputs)
    return layer, extra, None


def _view_axes(layer: QLayer, tensors, axes, allow_h: bool = False) -> list[int]:
    """The axes in the 4-D view; N (and H, unless ``allow_h``) cannot be tiled."""
    rank = _rank(tensors, layer.inputs[0])
    mapped = [view_axis(a, rank) for a in axes]
    bad = [a for a, m in zip(axes, mapped) if m == 0 or (m == 2 and not allow_h)]
    if bad:
        where = "N" if view_axis(bad[0], rank) == 0 else "H"
        raise NotTiled(f"{layer.kind} along axis {bad[0]} ({where} of the 4-D view): runs as a "
                       "whole-tensor DMA step between groups")
    return mapped


def _concat(layer: QLayer, tensors):
    """Along C or W: each input gives the same rows; along H (YOLO's three heads joined along
    their anchors) an output row comes from one input at its own offset."""
    (axis,) = _view_axes(layer, tensors, [layer.attrs["axis"]], allow_h=True)
    return _kernel(layer, axis=axis), {"op": "concat", "attrs": (("axis", axis),)}, None


def _split(layer: QLayer, tensors):
    """Along C or W each output keeps the rows it is given; along H (an LSTM cell's four gates
    out of one vector) every output reads the whole input, as a fully connected layer does."""
    (axis,) = _view_axes(layer, tensors, [layer.attrs["axis"]], allow_h=True)
    extra = {"op": "split", "attrs": (("axis", axis),)} if axis == 2 else {"op": "split"}
    return _kernel(layer, axis=axis), extra, None


def _slice(layer: QLayer, tensors):
    axes = _view_axes(layer, tensors, list(layer.attrs["axes"]))
    return _kernel(layer, axes=axes), {"op": "split"}, None


def _pad(layer: QLayer, tensors):
    """A constant pad of H is a window of one row with its own top and bottom padding (as a
    conv's); reflect or edge padding along H needs rows of other slices: a breaker."""
    rank = _rank(tensors, layer.inputs[0])
    pads = list(layer.attrs["pads"])
    moved = [a for a in range(rank) if pads[a] or pads[a + rank]]
    mapped = _view_axes(layer, tensors, moved, allow_h=True)
    if rank != 4:
        raise NotTiled("pad of a tensor that is not 4-D: runs as a whole-tensor DMA step")
    if 2 in mapped:
        if layer.attrs.get("mode", "constant") != "constant":
            raise NotTiled(f"{layer.attrs['mode']} pad along H reads rows of other H slices: "
                           "runs as a whole-tensor DMA step between groups")
        return layer, {"op": "pad", "pad_top": pads[2], "pad_bottom": pads[2 + rank]}, None
    op = "move" if tensors[layer.inputs[0]].view[1] == tensors[layer.outputs[0]].view[1] \
        else "split"
    return layer, {"op": op}, None


def _reshape(layer: QLayer, tensors):
    """A reshape that keeps N and C of the view and regroups H x W (a flatten of the spatial
    axes, as YOLO's heads do) keeps every channel's bytes in order: output rows map to a run of
    input rows. Any other reshape moves data across lanes: a breaker (an alias in GMEM)."""
    (n, c, h, w), (n2, c2, h2, w2) = tensors[layer.inputs[0]].view, tensors[layer.outputs[0]].view
    if (n, c) != (n2, c2) or h * w != h2 * w2:
        raise NotTiled("reshape: changes the tensor layout, runs as a whole-tensor DMA step "
                       "between groups")
    return layer, {"op": "reshape"}, None


def _softmax(layer: QLayer, tensors):
    """Along C or W every row is its own: the rows of a slice are enough. The scratch holds
    each ``e`` of the exp table: int32, or int64 where the table has 31 fraction bits or more
    (a long row at a fine output scale, ``npubuild.quant.quantizer.softmax_exp_bits``)."""
    (axis,) = _view_axes(layer, tensors, [layer.attrs["axis"]])
    e_bytes = 4 if int(layer.arrays["exp_table"].max()) < 2 ** 31 else 8
    return _kernel(layer, axis=axis), {"op": "softmax", "scratch_elem_bytes": e_bytes}, None


def _channel_permute(layer: QLayer, tensors):
    """A permutation of the view's channels (`fold_channel_permutations`): output row r of
    every channel is input row r of another, so H slices need their own rows only; every
    output channel may read any input channel, so it is never sliced along C."""
    return layer, {"op": "permute"}, None


CONVERTERS = {"conv": _conv, "maxpool": _pool, "avgpool": _pool, "resize": _resize,
              "add": _elementwise, "mul": _elementwise, "rescale": _elementwise,
              "lut": _elementwise, "concat": _concat, "split": _split, "slice": _slice,
              "pad": _pad, "softmax": _softmax, "reshape": _reshape,
              "channel_permute": _channel_permute}


# ---- channel permutations ------------------------------------------------------------------

PERMUTING = ("reshape", "transpose")
"""Data movement whose chains may compose to a permutation of the channels (ShuffleNet's
channel shuffle: Reshape to (N, g, C/g, H, W), a Transpose of the two channel axes, Reshape)."""


def fold_channel_permutations(qgraph: QGraph, tensors: dict[str, TensorInfo],
                              memo: LayerMemo | None = None) -> QGraph:
    """``qgraph`` with each data movement that permutes the channels of its input's 4-D view
    and keeps N, H and W as one ``channel_permute`` layer named after its last layer. The class
    is found by running the movement on element indices (`channel_order`), whatever its
    spelling: a chain of reshapes and transposes (ShuffleNet's channel shuffle), each reading
    the one before and read by nothing else; or slices of one tensor that only a concat along
    the channels reads, which moves them unchanged (import writes a Gather by constant channel
    indices so). Apart, a reshape or transpose across channels is a whole-tensor DMA step
    between groups, and a slice per channel a tensor and a layer each in the group; as one
    layer it keeps rows, so it is tiled (`_channel_permute`). The same graph object when there
    is none."""
    consumers, producers = qgraph.consumers(), qgraph.producers()
    outputs, folded, fused = set(qgraph.outputs), {}, set()
    layers = qgraph.layers

    def found(members: list[QLayer]) -> bool:
        permute = (permute_layer(members, tensors) if memo is None
                   else memo.permute_layer(members, tensors))
        if permute is not None:
            fused.update(member.name for member in members)
            folded[permute.name] = permute
        return permute is not None

    for layer in layers:
        if layer.kind == "concat" and layer.device == "npu":
            slices = _gathered_slices(layer, producers, consumers, outputs, tensors)
            if slices:
                found([*slices, layer])
    index = {layer.name: i for i, layer in enumerate(layers)}

    def only_reader(i: int) -> int | None:
        out = layers[i].outputs[0]
        readers = consumers.get(out, [])
        return None if out in outputs or len(readers) != 1 else index[readers[0].name]

    permutation_chains(len(layers), only_reader, lambda i: _permuting(layers[i]),
                       lambda chain: found([layers[i] for i in chain]))
    if not folded:
        return qgraph
    layers = [folded.get(layer.name, layer) for layer in layers
              if layer.name not in fused or layer.name in folded]
    return replace(qgraph, layers=layers)


def permutation_chains(size: int, only_reader: Callable[[int], int | None],
                       permuting: Callable[[int], bool],
                       permutes: Callable[[list[int]], bool]) -> list[list[int]]:
    """The chains of data movement that permute channels, of items ``0 .. size - 1`` in
    topological order: from each item not yet in a chain that is ``permuting`` (a reshape or a
    transpose), the items each the only reader of the one before (``only_reader``: None where
    the chain ends: no reader, several, or a graph output), their longest prefix of two or more
    that ``permutes``. The one search compile folds by (`fold_channel_permutations`) and split
    places by (`npubuild.split.shuffles`)."""
    chains: list[list[int]] = []
    taken: set[int] = set()
    for i in range(size):
        if i in taken or not permuting(i):
            continue
        chain = [i]
        while (j := only_reader(chain[-1])) is not None and permuting(j):
            chain.append(j)
        for stop in range(len(chain), 1, -1):  # the longest prefix that permutes channels
            if permutes(chain[:stop]):
                chains.append(chain[:stop])
                taken.update(chain[:stop])
                break
    return chains


def _permuting(layer: QLayer) -> bool:
    return layer.kind in PERMUTING and layer.device == "npu" and len(layer.outputs) == 1


def _gathered_slices(concat: QLayer, producers, consumers, outputs,
                     tensors: dict[str, TensorInfo]) -> list[QLayer]:
    """The slices (one per input, in order) of one tensor that ``concat`` joins unchanged
    (no requantization) when nothing else reads them; empty otherwise."""
    p, out = concat.params, tensors[concat.outputs[0]]
    if not all(m == 1 and n == 0 and zp == p.get("output_zp", 0) for m, n, zp in
               zip(p["multipliers"], p["shifts"], p["input_zps"])):
        return []
    slices = [producers.get(t) for t in concat.inputs]
    if not all(s is not None and s.kind == "slice" and s.device == "npu" for s in slices):
        return []
    if len({s.inputs[0] for s in slices}) != 1 or any(
            t in outputs or tensors[t].dtype != out.dtype
            or {c.name for c in consumers.get(t, [])} != {concat.name} for t in concat.inputs):
        return []
    return slices


def channel_order(members: list[QLayer], tensors: dict[str, TensorInfo]
                  ) -> tuple[int, ...] | None:
    """The input channel of each output channel of the 4-D view when ``members`` permute the
    channels of their input's view and keep N, H and W (`moved_channel_order`); None
    otherwise, or for the identity. ``members``: a chain of reshapes and transposes, each
    reading the one before; or slices of one tensor, then the concat that joins them (its
    inputs in order)."""
    if all(layer.kind == "reshape" for layer in members):  # reshapes keep the order
        return None

    def move(index: np.ndarray) -> np.ndarray:
        if members[-1].kind == "concat":  # its inputs pass unchanged (`_gathered_slices`)
            return np.concatenate([reference.run_layer(s, [index])[0] for s in members[:-1]],
                                  axis=members[-1].attrs["axis"])
        for layer in members:
            index = reference.run_layer(layer, [index])[0]
        return index

    return moved_channel_order(tensors[members[0].inputs[0]].shape,
                               tensors[members[-1].outputs[0]].shape, move)


def moved_channel_order(first: Shape | tuple[int, ...], last: Shape | tuple[int, ...],
                        move: Callable[[np.ndarray], np.ndarray]) -> tuple[int, ...] | None:
    """The input channel of each output channel of the 4-D view when ``move`` (data movement
    from a tensor of shape ``first`` to one of shape ``last``, both of rank 4 or less) permutes
    the channels of the input's view and keeps N, H and W; None otherwise, or for the
    identity. Found by moving element indices, whatever the spelling: the one test of a
    channel permutation, for compile (`channel_order`) and for split
    (`npubuild.split.shuffles`)."""
    view = view4(first)
    if view != view4(last) or max(len(first), len(last)) > 4:
        return None
    n, c, h, w = view
    if c < 2:
        return None
    index = move(np.arange(n * c * h * w).reshape(first))
    if index.size != n * c * h * w:
        return None
    moved = np.asarray(index).reshape(view)
    order = moved[0, :, 0, 0] // (h * w)
    if (order.max() >= c or (order == np.arange(c)).all()
            or not (np.sort(order) == np.arange(c)).all() or not np.array_equal(
                moved, np.arange(n * c * h * w).reshape(view)[:, order])):
        return None
    return tuple(int(i) for i in order)


def permute_layer(members: list[QLayer], tensors: dict[str, TensorInfo]) -> QLayer | None:
    """``members`` as one ``channel_permute`` layer when they permute channels
    (`channel_order`; the integer reference runs it on the real shapes), else None."""
    order = channel_order(members, tensors)
    if order is None:
        return None
    last = members[-1]
    out = tensors[last.outputs[0]]
    nodes = dict.fromkeys(node for layer in members for node in layer.source_nodes)
    return QLayer(last.name, "channel_permute", [members[0].inputs[0]], list(last.outputs),
                  {"order": list(order), "view": list(out.view), "shape": list(out.shape)},
                  {}, {}, list(nodes), "npu")


# ---- weights in GMEM / LMEM ---------------------------------------------------------------

def pack_weights(layer: QLayer, record: WeightRecord) -> bytes:
    """Records of every output channel, back to back (a replicated table: the table)."""
    if record.replicated:
        return np.ascontiguousarray(layer.arrays[record.fields[0][0]]).tobytes()
    cout = layer.arrays[record.fields[0][0]].shape[0]
    columns = [np.ascontiguousarray(np.asarray(layer.arrays[name]).reshape(cout, -1)
                                    .astype(dtype)).view(np.uint8)
               for name, dtype, _, _ in record.fields]
    return np.concatenate(columns, axis=1).tobytes()


def unpack_weights(raw: np.ndarray, record: WeightRecord) -> dict[str, np.ndarray]:
    """``raw``: uint8 [channels, record bytes] → the arrays in their own dtypes, channel-major
    (the inverse of `pack_weights`; a replicated table: ``raw`` is one copy)."""
    out, at = {}, 0
    for name, stored, count, dtype in record.fields:
        width = np.dtype(stored).itemsize * count
        block = np.ascontiguousarray(raw[:, at:at + width]).view(stored).astype(dtype)
        if record.replicated:
            out[name] = block.reshape(-1)
        else:
            out[name] = block.reshape(raw.shape[0], count) if count > 1 else block.reshape(-1)
        at += width
    return out


# ---- groups ---------------------------------------------------------------------------------

def plan_qgraph(layers: QLayers, chip: Chip, *, grouping: bool = True,
                on_no_fit: str = "error", fits: GroupFits | None = None) -> LayerGroups:
    """Layer groups per run of tiled layers; each breaker between runs stays on its own.
    ``fits``: group fits kept across plans on ``chip`` (`GroupFits`)."""
    graph, items = layers.graph, []
    for run in layers.segments():
        if run[0].name in layers.breakers:
            items.append(CpuLayer(run[0], layers.breakers[run[0].name].reason))
            continue
        for item in plan_groups(_sub_graph(graph, run), chip, grouping=grouping,
                                on_no_fit=on_no_fit, fits=fits).items:
            items += _aliases(item, layers) or [item]
    return LayerGroups(graph, chip, grouping, tuple(items))


LONE_WHOLE = ("alone in a group: computed whole between groups, where its loads overlap its "
              "compute (a group's timesteps would run them one after the other)")


def _aliases(item, layers: QLayers) -> list[CpuLayer]:
    """A group of nothing but reshapes (the search left them apart from the layers beside
    them, or there are none) as GMEM aliases between groups: in a group of their own they
    would load and store their tensor for nothing. A fully connected layer or a split along H
    alone in a group as the step between groups it was: the same bytes, fewer cycles. Empty for
    any other group."""
    group = getattr(item, "group", None)
    if group is not None and len(group) == 1 and reads_whole_input(group.layers[0]):
        return [CpuLayer(whole_step(group.layers[0]), LONE_WHOLE)]
    if group is None or any(spec.op != "reshape" for spec in group.layers):
        return []
    return [CpuLayer(_breaker_spec(layers.kernels[spec.name], layers.tensors, "dma", None),
                     LONE_RESHAPE) for spec in group.layers]


def _sub_graph(graph: LayerGraph, run: list[LayerSpec]) -> LayerGraph:
    """``run`` as a graph: its inputs, and its outputs the graph returns or a layer outside it
    reads (the graph's `consumers`, indexed once per plan: a scan of the whole graph per run
    was quadratic, GTCRN's 4,590 layers priced per choice)."""
    names = {spec.name for spec in run}
    produced = {t for spec in run for t in spec.outputs}
    inputs = dict.fromkeys(t for spec in run for t in spec.inputs if t not in produced)
    outputs = [t for t in dict.fromkeys(t for spec in run for t in spec.outputs)
               if t in graph.outputs
               or any(graph.layers[c].name not in names for c in graph.consumers.get(t, ()))]
    return LayerGraph(tuple(run), tuple(inputs), tuple(outputs), graph.shapes)
