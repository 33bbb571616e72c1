"""What a precision choice costs in time, priced as the compile stage will estimate it.

The precision search's ``quantization.auto.max_slowdown`` is judged on this figure, so it must
be compile's, not a cheaper story: pricing MACs alone plus a fixed hand-over per layer put
MediaPipe's hand landmark choice (58 int16 + 2 float tensors) at 5.1x int8's time where
compile's estimate of the built model said 2.9x, and a budget between the two refused a choice
the user would have taken.

- **NPU**: compile's own estimate (`npubuild.npu.from_qgraph.layers_from_qgraph` →
  `plan_qgraph` → `build_program` → `estimate`, the layer groups included) of each NPU graph's
  quantized graph with the choice applied: every tensor at the width the choice gives it (int16
  doubles its bytes: DMA, LMEM, slicing) and the layers the quantizer runs in float taken out
  as CPU steps between groups (their tensors cross GMEM). One plan per distinct graph choice,
  cached, and only for the choices a decision needs (`PrecisionSearch.slowdown`).
- **Host**: compile measures each float part (a CPU submodel, a float layer inside an NPU
  graph) with ONNX Runtime on the build machine, a figure that changes from run to run and so
  can never steer a search whose choice must be reproducible. Here each part costs what that
  measurement finds for it: `CPU_RUN_SECONDS` (one ONNX Runtime run: ~7 µs for a one-node
  model on the 2-core build machine, 7-9 µs for hand landmark's float layers in compile's
  report) plus its MACs at the host's rate (`npubuild.split.cost.CPU_MACS_PER_SECOND`, the
  split's one figure). A chip that runs float layers in float16 on its NPU runs them at that
  rate with no run of their own.
"""

from __future__ import annotations

import weakref
from collections import OrderedDict
from dataclasses import replace
from typing import Mapping

import numpy as np
import onnx
from onnx import numpy_helper

from npubuild.quant import schemes
from npubuild.quant.qgraph import QGraph
from npubuild.quant.quantizer import onnx_function
from npubuild.split.cost import CPU_MACS_PER_SECOND

CPU_RUN_SECONDS = 8e-6
"""One ONNX Runtime run of a float part on the host (its dispatch, whatever its MACs)."""

CPU_LOOP_NODE_SECONDS = 1e-6
"""One body node of one iteration of a ``Loop`` ONNX Runtime runs on the host: toy Loops of 100
and 960 iterations of 10 and 41 elementwise nodes ran 0.3-2 µs a node on the 2-core build
machine under load; SleepECG's GRU steps (41 nodes) 1.1 µs a node in compile's timing."""


def host_seconds(macs: int, float_seconds_per_mac: float = 1.0 / CPU_MACS_PER_SECOND,
                 run_seconds: float = CPU_RUN_SECONDS) -> float:
    """One float part on the host: a run plus its MACs."""
    return run_seconds + macs * float_seconds_per_mac


def loop_seconds(graph: onnx.GraphProto) -> float:
    """The host's time for the iterations of ``graph``'s ``Loop``s whose trip count is a
    constant (an initializer or a Constant node): each iteration runs every node of the body
    (`CPU_LOOP_NODE_SECONDS` each) and the body's own such loops. A part's MACs price a Loop as
    one node: SleepECG's four masked GRUs, 960 iterations of 41 nodes kept as Loops on the
    CPU, were 425 µs for the whole model in float where ONNX Runtime took 383 ms, and the
    search advised running it all on the CPU. A trip count is an upper bound where the body's
    condition may stop the loop sooner (a decoder's end token: SLANet's table decoder ran 45 ms
    of its steps on the CPU); a Loop without one, or a Scan, is priced as before."""
    constants = {t.name: t for t in graph.initializer}
    constants.update({n.output[0]: n.attribute[0].t for n in graph.node
                      if n.op_type == "Constant" and n.output and n.attribute
                      and n.attribute[0].name == "value"})
    total = 0.0
    for node in graph.node:
        if node.op_type != "Loop" or not node.input or node.input[0] not in constants:
            continue
        trips = numpy_helper.to_array(constants[node.input[0]])
        body = next((a.g for a in node.attribute if a.name == "body"), None)
        if body is None or trips.size != 1:
            continue
        total += int(trips.reshape(-1)[0]) * (len(body.node) * CPU_LOOP_NODE_SECONDS
                                              + loop_seconds(body))
    return total


def with_choice(qgraph: QGraph, dtypes: Mapping[str, str], cpu_layers: frozenset[str],
                int16_weights: frozenset[str] = frozenset(),
                tables: Mapping[str, int] | None = None) -> QGraph:
    """``qgraph`` with each tensor of ``dtypes`` at that width, the ``cpu_layers`` run by the
    host, the ``int16_weights`` conv layers holding int16 weights (twice the weight bytes in
    GMEM, LMEM and DMA) and each table of ``tables`` (`TableSpans`) holding that many entries
    (a copy: the graph itself is not changed)."""
    tensors = {name: (replace(info, dtype=dtypes[name])
                      if name in dtypes and dtypes[name] != info.dtype else info)
               for name, info in qgraph.tensors.items()}
    layers = [replace(layer, device="cpu", kind="float")
              if layer.name in cpu_layers and layer.device != "cpu"
              else _wide_weights(layer) if layer.name in int16_weights and layer.kind == "conv"
              else _sized_table(layer, qgraph.tensors, tensors, tables or {}) or layer
              for layer in qgraph.layers]
    return replace(qgraph, tensors=tensors, layers=layers)


def _wide_weights(layer):
    """A conv layer as W16A16 holds it, for its price: its weights int16 (the values stay
    int8's; the plan reads sizes)."""
    arrays = {**layer.arrays, "weight": layer.arrays["weight"].astype(np.int16)}
    return replace(layer, arrays=arrays)


def _table_form(layer, own, tensors, tables: Mapping[str, int]) -> tuple[int, str] | None:
    """A lookup table's entries and entry type under ``tensors``' widths, where they differ
    from the table the layer holds (None: the same, or no table). Its entries are the span
    ``tables`` gives it (`TableSpans`: the table built for the choice's parameters, over the
    input integers where its output changes); without one, the table's own where its input
    keeps its width (``own``: the graph's tensors), else every integer of the new width
    (65,536 for int16: the most it can hold)."""
    if layer.kind != "lut" or "table" not in layer.arrays:
        return None
    table = layer.arrays["table"]
    x = layer.inputs[0]
    entries = tables.get(layer.name)
    if entries is None:
        entries = (table.size if tensors[x].dtype == own[x].dtype
                   else 2 ** (16 if tensors[x].dtype == "int16" else 8))
    dtype = "int16" if tensors[layer.outputs[0]].dtype == "int16" else "int8"
    return None if (table.size, str(table.dtype)) == (entries, dtype) else (entries, dtype)


def _sized_table(layer, own, tensors, tables: Mapping[str, int]):
    """A table layer as the choice's widths build it, for its price: `_table_form`'s entries
    (an int16 input's table over its span, read whole from GMEM every frame), of the output's
    type. Its values repeat the table the layer holds: compile stores equal weights once, so
    tables of one value (zeros) would be priced as one table for every layer (madmom: 2.7 µs
    where compile said 33.4). None: it stays as it is."""
    form = _table_form(layer, own, tensors, tables)
    if form is None:
        return None
    table = np.resize(layer.arrays["table"], form[0]).astype(form[1])
    return replace(layer, arrays={**layer.arrays, "table": table})


def table_params(qgraph: QGraph, params: Mapping[str, object]) -> tuple:
    """``(layer, input QParams, output QParams)`` of each lookup table of ``qgraph`` whose
    input or output the quantizer's ``params`` (None: float) give another width than the
    graph's: the tables a choice builds again, in layer order (what `TableSpans` sizes)."""
    found = []
    for layer in qgraph.layers:
        if layer.kind != "lut" or "model" not in layer.arrays:
            continue
        x, y = params.get(layer.inputs[0]), params.get(layer.outputs[0])
        if x is None or y is None:  # float: the layer leaves the integer kernels
            continue
        if (x.dtype, y.dtype) != (qgraph.tensors[layer.inputs[0]].dtype,
                                  qgraph.tensors[layer.outputs[0]].dtype):
            found.append((layer.name, x, y))
    return tuple(found)


class TableSpans:
    """The entries of ``qgraph``'s lookup tables built for other parameters (`table_params`),
    as the quantizer builds and stores them (`schemes.build_lut` of the layer's own float
    fragment, then `schemes.trim_lut`): a saturating function of an int16 input holds only
    the span where its output changes (madmom's LSTM gates: tanh of a cell state of ±200 is
    ±1 past ±6, not 65,536 entries). Each (layer, parameters) is built once."""

    def __init__(self, qgraph: QGraph):
        self.layers = {layer.name: layer for layer in qgraph.layers if layer.kind == "lut"}
        self._functions: dict[str, object] = {}
        self._entries: dict[tuple, int] = {}

    def __call__(self, tables: tuple) -> dict[str, int]:
        """``table_params``' tables → their entries, by layer name."""
        return {name: self.entries(name, x, y) for name, x, y in tables}

    def entries(self, name: str, x, y) -> int:
        key = (name, x, y)
        if key not in self._entries:
            if name not in self._functions:
                model = onnx.load_from_string(self.layers[name].arrays["model"].tobytes())
                self._functions[name] = onnx_function(model)
            first, last = schemes.table_span(schemes.build_lut(self._functions[name], x, y))
            self._entries[key] = last - first + 1
        return self._entries[key]


def npu_seconds(qgraph: QGraph, chip, fits=None) -> float:
    """Compile's estimate of ``qgraph`` on ``chip``: its NPU cycles over the chip's clock
    (grouped as compile groups it; a group that does not fit LMEM runs its layer apart, as
    ``compile.on_no_fit: cpu`` would, so a price never fails). ``fits``: the
    `npubuild.npu.layer_group.GroupFits` of earlier prices on ``chip`` (choices of one graph
    share most of their groups)."""
    from npubuild.npu import build_program, estimate
    from npubuild.npu.from_qgraph import layers_from_qgraph, plan_qgraph

    program = build_program(plan_qgraph(layers_from_qgraph(qgraph), chip, on_no_fit="cpu",
                                        fits=fits))
    return estimate(program).cycles / (chip.clock_mhz * 1e6)


RUN_ITEMS_KEPT = 2048
"""How many planned items (groups) a `GraphPricer` keeps in the runs it remembers."""


class GraphPricer:
    """`npu_seconds` of one NPU graph under the precision search's choices, each price costing
    what its choice changes (GTCRN: 4,590 layers, ~1,100 runs between breakers; a price was a
    whole conversion, plan, program and estimate, ~2 s a trial, and the budget fit tries
    hundreds). The same figure as `npu_seconds` of `with_choice`'s graph, by construction:

    - tensors and layers a choice leaves as they are stay the same objects across prices, and
      each layer's conversion is kept by the layer and its tensors (`LayerMemo`);
    - each run of tiled layers between breakers is planned once per content (its layers, what
      it reads and writes): `plan_groups` of a run reads nothing else;
    - estimate's cycles are its groups' then its CPU steps' (`estimate.estimate`, summed in
      that order); a group's cycles come from its plan alone (GMEM addresses do not count), so
      each planned group is estimated once; a CPU step's are estimated per price (what it
      reads and writes depends on the GMEM layout of the whole plan).

    ``work`` counts what the prices did (layers converted, runs planned, groups estimated):
    what a test of a price's cost reads."""

    def __init__(self, qgraph: QGraph, chip, fits=None):
        from npubuild.npu.from_qgraph import LayerMemo

        self.qgraph, self.chip = qgraph, chip
        self.fits = fits if fits is not None else group_fits(chip)
        self.memo = LayerMemo()
        self._tensors: dict[tuple[str, str], object] = {}  # (tensor, width) -> its QTensor
        self._layers: dict[tuple[str, str], object] = {}  # (layer, how) -> the layer moved
        # a run's content -> its planned items, the most recently asked runs holding at most
        # ``keep`` items: one plan's worth (GTCRN's: 1,134 groups) beside what `GroupFits`
        # holds (4,096 kept beside its own lifted iris landmark's search from 671 to 1,231 MiB
        # of peak RSS: its one run differs per trial); a dropped run is planned again, the
        # same answer
        self._runs: OrderedDict[tuple, tuple] = OrderedDict()
        self.keep, self._held = RUN_ITEMS_KEPT, 0
        # id(plan) -> (a weak reference to it, its cycles), dropped with the plan
        self._group_cycles: dict[int, tuple[weakref.ref, int]] = {}
        self.runs_planned = self.groups_estimated = 0

    @property
    def work(self) -> dict[str, int]:
        return {"layers_converted": self.memo.converted, "runs_planned": self.runs_planned,
                "groups_estimated": self.groups_estimated}

    def seconds(self, dtypes: Mapping[str, str], cpu_layers: frozenset[str],
                int16_weights: frozenset[str] = frozenset(),
                tables: Mapping[str, int] | None = None) -> float:
        """`npu_seconds(with_choice(qgraph, dtypes, cpu_layers, int16_weights, tables),
        chip)`."""
        from npubuild.npu.estimate import _step_estimate
        from npubuild.npu.from_qgraph import layers_from_qgraph
        from npubuild.npu.layer_group import CpuLayer, LayerGroups
        from npubuild.npu.program import CpuStep, Program, gmem_layout

        layers = layers_from_qgraph(self._with_choice(dtypes, cpu_layers, int16_weights,
                                                      tables or {}), self.memo)
        groups = LayerGroups(layers.graph, self.chip, True, tuple(
            item for run in layers.segments() for item in self._planned(layers, run)))
        gmem = gmem_layout(groups)
        program = Program(self.chip, groups.graph, True, gmem, ())  # what a CPU step reads
        in_groups, in_steps = [], []
        for index, item in enumerate(groups.items):
            if isinstance(item, CpuLayer):
                in_steps.append(_step_estimate(CpuStep(index, item.layer, item.reason),
                                               program).cycles)
            else:
                in_groups.append(self._cycles(item, groups, gmem))
        return sum(in_groups + in_steps) / (self.chip.clock_mhz * 1e6)

    def _with_choice(self, dtypes: Mapping[str, str], cpu_layers: frozenset[str],
                     int16_weights: frozenset[str], tables: Mapping[str, int]) -> QGraph:
        """`with_choice`'s graph, built of the objects earlier prices made for the same
        tensor widths and layer moves."""
        tensors = {}
        for name, info in self.qgraph.tensors.items():
            dtype = dtypes.get(name, info.dtype)
            if dtype != info.dtype:
                key = (name, dtype)
                if key not in self._tensors:
                    self._tensors[key] = replace(info, dtype=dtype)
                info = self._tensors[key]
            tensors[name] = info
        layers = []
        for layer in self.qgraph.layers:
            how = ("cpu" if layer.name in cpu_layers and layer.device != "cpu" else
                   "wide" if layer.name in int16_weights and layer.kind == "conv" else
                   _table_form(layer, self.qgraph.tensors, tensors, tables))
            if how is not None:
                key = (layer.name, how)
                if key not in self._layers:
                    self._layers[key] = (replace(layer, device="cpu", kind="float")
                                         if how == "cpu" else _wide_weights(layer)
                                         if how == "wide" else
                                         _sized_table(layer, self.qgraph.tensors, tensors, tables))
                layer = self._layers[key]
            layers.append(layer)
        return replace(self.qgraph, tensors=tensors, layers=layers)

    def _planned(self, layers, run) -> tuple:
        """`plan_qgraph`'s items of one run of ``layers`` (a breaker alone, or tiled layers),
        planned once per content."""
        from npubuild.npu.from_qgraph import _aliases, _sub_graph
        from npubuild.npu.layer_group import CpuLayer, plan_groups

        if run[0].name in layers.breakers:
            return (CpuLayer(run[0], layers.breakers[run[0].name].reason),)
        # the run's layers are its key: a choice changes widths and devices, never which
        # tensors a layer reads and writes nor their shapes, so the layers (by name) fix what
        # the run reads and what its readers outside it need
        key = tuple(run)
        found = self._runs.get(key)
        if found is not None:
            self._runs.move_to_end(key)
            return found
        items = []
        sub = _sub_graph(layers.graph, run)
        for item in plan_groups(sub, self.chip, on_no_fit="cpu", fits=self.fits).items:
            items += _aliases(item, layers) or [item]
        found = self._runs[key] = tuple(items)
        self.runs_planned += 1
        self._held += len(found)
        while self._held > self.keep and len(self._runs) > 1:
            self._held -= len(self._runs.popitem(last=False)[1])
        return found

    def _cycles(self, plan, groups, gmem) -> int:
        """A planned group's cycles as `estimate` counts them (kept per plan object)."""
        from npubuild.npu.estimate import _group_estimate
        from npubuild.npu.program import GroupProgram, _slice_program

        key = id(plan)
        found = self._group_cycles.get(key)
        if found is not None and found[0]() is plan:
            return found[1]
        slices = tuple(_slice_program(plan, piece, gmem, self.chip.lanes)
                       for piece in plan.tiling.slices)
        layers = {layer.name: layer for layer in plan.group.layers}  # all it reads
        cycles = _group_estimate(GroupProgram(0, plan, slices), self.chip, layers,
                                 groups.graph.constants).cycles
        memo = self._group_cycles

        def forget(ref, key=key):  # the plan is gone: its id may be another's next
            if memo.get(key, (None,))[0] is ref:
                del memo[key]

        memo[key] = (weakref.ref(plan, forget), cycles)
        self.groups_estimated += 1
        return cycles


def group_fits(chip):
    """The `npubuild.npu.layer_group.GroupFits` that `npu_seconds` keeps across the prices
    of one search on ``chip`` (None without a chip)."""
    if chip is None:
        return None
    from npubuild.npu.layer_group import GroupFits

    return GroupFits(chip)


def dtypes_of(params: Mapping[str, object]) -> dict[str, str]:
    """Each tensor's width under the quantizer's parameters (None: kept in float), in name
    order: the precision search keys its prices by these items sorted, and a sort of items
    already in order is one pass (GTCRN's 5,000 tensors in shuffled order: ~20 ms a sort,
    four per budget trial)."""
    return {t: ("float32" if params[t] is None else params[t].dtype) for t in sorted(params)}
