"""The cost model behind ``split.policy: min_cost``: is an NPU island worth its data movement?

An island (connected NPU nodes within one segment) stays on the NPU when

    npu_seconds + move_seconds < cpu_seconds

- ``npu_seconds``: its MACs at the chip's peak (lanes × MACs/cycle/lane × clock) times
  `NPU_UTILISATION`;
- ``cpu_seconds``: its MACs at `CPU_MACS_PER_SECOND`;
- ``move_seconds``: every tensor crossing the island's boundary (float32, `BOUNDARY_BYTES`
  per element) over the chip's GMEM bandwidth, plus `SWITCH_SECONDS` for handing work to the
  NPU and back.

MACs: Conv / ConvTranspose / Gemm / MatMul by their multiply-accumulates, LSTM / GRU / RNN by
their gates' products over every step; every other op one per output element; a fused op the sum of its body. These are estimates for choosing a split, not
performance figures (the compile stage's simulator gives those).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from npubuild.fusions import FUSED_DOMAIN
from npubuild.targets.model import Chip
from npubuild.targets.view import NodeView, is_static

CPU_MACS_PER_SECOND = 8e9
"""Host CPU fp32 throughput: a quad-core Cortex-A55-class CPU at ~1.8 GHz has a NEON peak of
~29 GMAC/s; real kernels reach roughly a quarter to a third of it."""

NPU_UTILISATION = 0.5
"""Fraction of the NPU's peak MAC rate a typical layer sustains."""

BOUNDARY_BYTES = 4
"""Bytes per element moved across an island boundary (float32 on the CPU side)."""

SWITCH_SECONDS = 20e-6
"""Fixed cost of one CPU→NPU→CPU hand-over (launch, synchronisation, cache maintenance)."""


def elements(shape) -> int:
    """Element count of a static shape, else 0."""
    return math.prod(shape) if is_static(shape) else 0


def node_macs(view: NodeView) -> int:
    """Estimated multiply-accumulates of one node (0 when shapes are unknown)."""
    out = view.shape(view.node.output[0]) if view.node.output else None
    if view.op in ("Conv", "ConvTranspose"):
        w = view.shape(view.input(1))
        if not (is_static(w) and is_static(out)):
            return 0
        per = math.prod(w[1:])  # Cin/group × kernel
        if view.op == "Conv":
            return elements(out) * per
        return elements(view.shape(view.input(0))) * w[1] * math.prod(w[2:])
    if view.op in ("Gemm", "MatMul"):
        a = view.shape(view.input(0))
        k = (a[0] if view.attr("transA", 0) else a[-1]) if is_static(a) else 0
        return elements(out) * k
    if view.op in RECURRENT_OPS:
        return recurrent_macs(view)
    if view.node.domain == FUSED_DOMAIN:
        from npubuild.targets.fused import body_views

        return sum(node_macs(v) for v in body_views(view) or [])
    return elements(out)


RECURRENT_OPS = ("LSTM", "GRU", "RNN")


def recurrent_macs(view: NodeView) -> int:
    """An ONNX LSTM / GRU / RNN's multiply-accumulates: at every step of every sequence, each
    direction's gates multiply the input by W [dirs, gates·hidden, input] and the state by
    R [dirs, gates·hidden, hidden] (0 when shapes are unknown). Counted as output elements,
    NSNet2's two GRUs of 400 over 100 frames were 120,000 MACs instead of 192 million."""
    x, w, r = (view.shape(view.input(i)) for i in range(3))
    if not (is_static(x) and is_static(w) and is_static(r)) or len(x) != 3:
        return 0
    steps_times_batch = x[0] * x[1]  # [seq, batch, input], or [batch, seq, input] (layout=1)
    return steps_times_batch * (elements(w) + elements(r))


def macs_per_node(model) -> list[tuple[str, int]]:
    """(node name, `node_macs`) of every node of ``model`` in order, after shape inference
    (nodes whose shapes stay unknown count 0)."""
    from npubuild.split.plan import infer
    from npubuild.targets.view import GraphFacts

    inferred = infer(model)
    facts = GraphFacts.from_model(inferred)
    return [(n.name, node_macs(NodeView(n, facts))) for n in inferred.graph.node]


def model_macs(model) -> int:
    """Estimated multiply-accumulates of a whole model (`node_macs` over its nodes)."""
    return sum(macs for _, macs in macs_per_node(model))


@dataclass(frozen=True)
class IslandCost:
    macs: int
    boundary_tensors: int
    boundary_bytes: int
    npu_seconds: float
    cpu_seconds: float
    move_seconds: float

    @property
    def worth_it(self) -> bool:
        return self.npu_seconds + self.move_seconds < self.cpu_seconds

    def explain(self) -> str:
        return (f"{self.macs:,} MACs take ~{_us(self.cpu_seconds)} on the CPU and "
                f"~{_us(self.npu_seconds)} on the NPU, but moving its {self.boundary_tensors} "
                f"boundary tensor{'s' * (self.boundary_tensors != 1)} "
                f"({self.boundary_bytes:,} bytes) costs ~{_us(self.move_seconds)}")


def _us(seconds: float) -> str:
    return f"{seconds * 1e6:.3g} µs"


def npu_macs_per_second(chip: Chip) -> float:
    """The MAC rate a typical layer sustains on ``chip`` (its peak × `NPU_UTILISATION`)."""
    return chip.lanes * chip.macs_per_cycle_per_lane * chip.clock_mhz * 1e6 * NPU_UTILISATION


def float_macs_per_second(chip: Chip) -> float:
    """Where layers kept in float run: the NPU's float16 rate where the chip has one (at
    `NPU_UTILISATION`), else the host CPU's."""
    if chip.float_macs_per_cycle_per_lane is None:
        return CPU_MACS_PER_SECOND
    return chip.lanes * chip.float_macs_per_cycle_per_lane * chip.clock_mhz * 1e6 * NPU_UTILISATION


def island_cost(chip: Chip, macs: int, boundary_elements: list[int]) -> IslandCost:
    clock = chip.clock_mhz * 1e6
    npu_rate = npu_macs_per_second(chip)
    moved = sum(boundary_elements) * BOUNDARY_BYTES
    move = moved / (chip.gmem_bandwidth_bytes_per_cycle * clock) + SWITCH_SECONDS
    return IslandCost(macs, len(boundary_elements), moved, macs / npu_rate,
                      macs / CPU_MACS_PER_SECOND, move)
