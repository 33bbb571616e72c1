"""The NPU layer description the tiler works on, independent of any quantized graph format.

A `LayerSpec` is one NPU layer as the tiler sees it: its op family, its activation tensors
(NCHW, int8 unless ``act_bytes`` says otherwise), its weight bytes and MACs, and its geometry
along H — the only spatial axis the tiler slices. A `LayerGraph` is a topologically ordered list
of them with the tensors that cross its border; a `Group` is a contiguous run of it.

LMEM model (TPU style, documented once here and in ``plan.json``'s ``layout``): LMEM is
``lanes × lmem_bytes_per_lane``; channel ``c`` of an activation lives in lane ``c % lanes``, so
a buffer of shape (n, C, h, w) takes ``n · ceil(C / lanes) · h · w · act_bytes`` bytes in
*every* lane, at the same per-lane address. Weights are distributed by output channel the same
way (``ceil(C_out / lanes) · weight_bytes / C_out`` per lane); lookup tables (op ``lut``) are
replicated in every lane. All sizes the tiler and the allocator handle are bytes per lane.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from math import ceil
from typing import Any, Mapping

Shape = tuple[int, int, int, int]

#: Op families the tiler knows. Channel-wise ones can be sliced along C (input channel =
#: output channel); ``conv`` can be sliced along output channels (every slice reads all inputs).
OPS = ("conv", "dwconv", "pool", "add", "eltwise", "lut", "concat", "split", "resize", "move",
       "pad", "reshape", "softmax", "fc", "permute")
CHANNELWISE_OPS = frozenset({"dwconv", "pool", "add", "eltwise", "lut", "resize", "move"})
C_SLICEABLE_OPS = CHANNELWISE_OPS | {"conv"}


@dataclass(frozen=True)
class LayerSpec:
    """One NPU layer as the tiler sees it.

    ``kernel_h``/``stride_h``/``pad_top``/``pad_bottom``/``dilation_h`` describe H for ``conv``,
    ``dwconv``, ``pool`` and ``pad`` (a window of one row); ``scale_h`` is a ``resize``'s
    integer nearest-neighbour factor; a ``concat`` with ``axis`` 2 joins along H, a ``reshape``
    regroups H x W (N and C kept). An ``fc`` (a fully connected layer on a vector: one
    channel, its features along H) reads every input row for any output row, so a group holding
    one is never sliced along H; a ``permute`` reorders the channels, each output row the
    same input row (never sliced along C); an ``fc``'s weights are one record per output feature
    (``attrs["weights"]`` = (features, depth)), spread over the lanes as a conv's are.
    ``macs`` counts multiply-accumulates for convolutions and one operation per output element
    (per window element for pools) otherwise. ``scratch_elem_bytes`` > 0 means the layer needs a
    scratch buffer of its output slice's shape at that many bytes per element (e.g. int16
    intermediates). ``attrs`` carries op details the tiler ignores (W geometry, mode, group...).
    ``weight_key``: the name of the first layer (in graph order) whose weights GMEM holds as
    the same bytes as this one's, when another layer has them too (this layer's own name if it
    is that first one); empty when no other layer has them. An unrolled recurrence's steps
    share their recurrent weight this way: GMEM holds it once (`npubuild.npu.program`).
    """

    name: str
    op: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    in_shapes: tuple[Shape, ...]
    out_shapes: tuple[Shape, ...]
    weight_bytes: int = 0
    macs: int = 0
    kernel_h: int = 1
    stride_h: int = 1
    pad_top: int = 0
    pad_bottom: int = 0
    dilation_h: int = 1
    scale_h: int = 1
    act_bytes: int = 1
    scratch_elem_bytes: int = 0
    attrs: tuple[tuple[str, Any], ...] = ()
    weight_key: str = ""

    def __post_init__(self):
        if self.op not in OPS:
            raise ValueError(f"layer {self.name!r}: unknown op {self.op!r}; "
                             f"known: {', '.join(OPS)}")
        if len(self.inputs) != len(self.in_shapes) or len(self.outputs) != len(self.out_shapes):
            raise ValueError(f"layer {self.name!r}: one shape per input and per output")

    def attr(self, key: str, default: Any = None) -> Any:
        return dict(self.attrs).get(key, default)

    @property
    def precision(self) -> str:
        """The width of the layer's MAC operands: ``int8``, ``int16`` (16-bit activations) or
        ``w16a16`` (16-bit weights too); a quantized graph records the wide ones in ``attrs``
        (`npubuild.npu.from_qgraph`), and the estimate runs them at the chip's rate for it."""
        return self.attr("precision", "int8")

    @property
    def weights_id(self) -> str:
        """What names the layer's weights in GMEM: its `weight_key`, or its own name."""
        return self.weight_key or self.name

    @property
    def c_out(self) -> int:
        return self.out_shapes[0][1]

    @property
    def h_out(self) -> int:
        return self.out_shapes[0][2]

    @property
    def weight_channels(self) -> int:
        """How many output channels the weights hold, one record each: a fully connected
        layer's (``fc``: its output features, which its view holds along H) or ``c_out``."""
        return self.attr("weights")[0] if self.op == "fc" else self.c_out

    def weight_bytes_per_lane(self, lanes: int, c_out: int | None = None) -> int:
        """Weight bytes one lane holds when the layer computes ``c_out`` output channels."""
        if not self.weight_bytes:
            return 0
        if self.op == "lut":
            return self.weight_bytes
        c = self.weight_channels if c_out is None else c_out
        return ceil(ceil(c / lanes) * self.weight_bytes / self.weight_channels)

    @property
    def c_sliceable(self) -> bool:
        """Whether the layer can compute a range of its output channels alone: channel-wise
        layers and depthwise convs (each output channel reads its own input channel), and
        dense convs (each reads every input); a grouped conv's groups would be cut."""
        return self.op in C_SLICEABLE_OPS and (self.op == "dwconv" or self.attr("group", 1) == 1)

    def input_follows_channels(self, index: int) -> bool:
        """Whether a channel slice of the output reads the same channel slice of this input."""
        return self.op in CHANNELWISE_OPS and self.in_shapes[index][1] == self.c_out


def lane_bytes(n: int, c: int, rows: int, w: int, elem_bytes: int, lanes: int) -> int:
    """Bytes per lane of an (n, c, rows, w) block with channels spread over lanes."""
    return n * ceil(c / lanes) * rows * w * elem_bytes


def first_widths(layers) -> dict[str, int]:
    """Each tensor ``layers`` touch at the width (`LayerSpec.act_bytes`) of the first layer
    that touches it, in one pass."""
    widths: dict[str, int] = {}
    for layer in layers:
        for t in layer.inputs + layer.outputs:
            widths.setdefault(t, layer.act_bytes)
    return widths


@dataclass(frozen=True)
class LayerGraph:
    """NPU layers in topological order plus the tensors entering and leaving them."""

    layers: tuple[LayerSpec, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    shapes: Mapping[str, Shape]
    skipped: tuple[tuple[str, str], ...] = field(default=(), compare=False)
    constants: frozenset[str] = frozenset()  # inputs that are constants (kept with the weights)

    def __post_init__(self):
        known = set(self.inputs)
        for layer in self.layers:
            missing = [t for t in layer.inputs if t not in known]
            if missing:
                raise ValueError(f"layer {layer.name!r} reads {missing} before they are produced")
            known.update(layer.outputs)

    @cached_property
    def producer(self) -> dict[str, int]:
        return {t: i for i, layer in enumerate(self.layers) for t in layer.outputs}

    @cached_property
    def elem_bytes(self) -> dict[str, int]:
        """Bytes per element of every tensor a layer touches: the first such layer's width."""
        return first_widths(self.layers)

    @cached_property
    def consumers(self) -> dict[str, list[int]]:
        users: dict[str, list[int]] = {}
        for i, layer in enumerate(self.layers):
            for t in dict.fromkeys(layer.inputs):
                users.setdefault(t, []).append(i)
        return users

    def group(self, start: int, stop: int) -> "Group":
        """The contiguous run ``layers[start:stop]`` with the tensors crossing its border."""
        layers = self.layers[start:stop]
        produced = {t for layer in layers for t in layer.outputs}
        inputs = dict.fromkeys(t for layer in layers for t in layer.inputs if t not in produced)
        graph_outputs = set(self.outputs)
        outputs = [t for t in dict.fromkeys(t for layer in layers for t in layer.outputs)
                   if t in graph_outputs
                   or any(not start <= c < stop for c in self.consumers.get(t, []))]
        return Group(start, layers, tuple(inputs), tuple(outputs), self.shapes)

    @property
    def weight_bytes(self) -> int:
        """The weights' bytes in GMEM: layers sharing their weights (`LayerSpec.weight_key`)
        count them once."""
        return sum({layer.weights_id: layer.weight_bytes for layer in self.layers}.values())

    def tensor_bytes(self, tensor: str, elem_bytes: int = 1) -> int:
        n, c, h, w = self.shapes[tensor]
        return n * c * h * w * elem_bytes


@dataclass(frozen=True)
class Group:
    """A contiguous run of layers: inputs are loaded from GMEM, outputs stored to it."""

    start: int
    layers: tuple[LayerSpec, ...]
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    shapes: Mapping[str, Shape] = field(repr=False)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(layer.name for layer in self.layers)

    @cached_property
    def elem_bytes(self) -> dict[str, int]:
        """Bytes per element of every activation tensor the group touches."""
        return first_widths(self.layers)

    @cached_property
    def batches(self) -> tuple[int, ...]:
        """The batches (N of the 4-D view) of the tensors the group touches, each once,
        ascending. A layer's tensors share one (the tiler's rules); layers that share no tensor
        may not (GTCRN: [1, 33, 8] GRU states beside [33, 1, 8] ones)."""
        return tuple(sorted({self.shapes[t][0] for t in self.elem_bytes}))

    def __len__(self) -> int:
        return len(self.layers)
