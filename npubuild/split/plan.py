"""Where every node runs, and why: the chip's support check, the recipe's policy, the cut.

`plan_split` is the whole decision: check each node against the chip, apply ``split:``
(policy, force_cpu / force_npu / placement, min_npu_nodes, min_cost), cut into segments and,
while an NPU island is too small or not worth its data movement, move it to the CPU and cut
again. Every node ends with a device and, when it is not on the NPU, the reasons.
"""

from __future__ import annotations

import fnmatch
from collections import Counter
from dataclasses import dataclass, field

import onnx

from npubuild.errors import UserError, did_you_mean
from npubuild.recipe.load import dotted
from npubuild.recipe.model import SplitSpec
from npubuild.split.cost import elements, island_cost, node_macs
from npubuild.split.graph import MOVEMENT, OpGraph, build_op_graph
from npubuild.split import input_statistics, legalize, shuffles, spectrum
from npubuild.split.aliases import legal_aliases
from npubuild.split.batchnorms import legal_batchnorms
from npubuild.split.einsum import legal_einsums
from npubuild.split.groups import legal_groups
from npubuild.split.reductions import legal_reductions
from npubuild.split.partition import CPU, NPU, Segment, npu_islands, partition, segment_of
from npubuild.split.spectrum import log_power_spectra
from npubuild.targets.constraints import layout_noop_reasons, node_reasons, op_label
from npubuild.targets.model import Chip
from npubuild.targets.view import GraphFacts, NodeView

CONSTANT_REASON = "constant: copied into every submodel that reads it"


class SelectorError(UserError):
    """A ``split:`` entry names no node; ``path`` is its field path in the recipe."""

    def __init__(self, message: str, path: tuple):
        super().__init__(message, field=dotted(path), hint="use node names, op types or output tensor names from the fusion stage's "
                 "model (`npubuild targets --check` lists them)")
        self.path = path


@dataclass
class NodePlacement:
    """One node's answer: its device, its submodel and why it is not on the NPU."""

    name: str
    op: str
    device: str
    reasons: list[str] = field(default_factory=list)
    graph: int | None = None

    def as_dict(self) -> dict:
        return {"name": self.name, "op": self.op, "device": self.device, "graph": self.graph,
                "reasons": self.reasons}


@dataclass
class SplitPlan:
    model: onnx.ModelProto      # the shape-inferred model the plan is about
    graph: OpGraph
    facts: GraphFacts
    chip: Chip
    spec: SplitSpec
    on_npu: list[bool]
    reasons: list[list[str]]
    segments: list[Segment]
    legal_convs: list[str] = field(default_factory=list)  # convs and pools `legalize` rewrote

    @property
    def placements(self) -> list[NodePlacement]:
        """Every node of the model, constants included, in topological order."""
        seg_of = segment_of(self.segments, len(self.graph))
        out = [NodePlacement(self.graph.label(i), op_label(n), NPU if self.on_npu[i] else CPU,
                             self.reasons[i], seg_of[i]) for i, n in enumerate(self.graph.nodes)]
        first_reader = self._constant_readers(seg_of)
        for name, node in self.graph.free_consts.items():
            seg = first_reader.get(name)
            out.append(NodePlacement(node.name or name, "Constant",
                                     self.segments[seg].device if seg is not None else CPU,
                                     [CONSTANT_REASON], seg))
        return out

    def _constant_readers(self, seg_of: list[int]) -> dict[str, int]:
        first: dict[str, int] = {}
        for i, used in enumerate(self.graph.uses):
            for t in used:
                if t in self.graph.free_consts:
                    first[t] = min(first.get(t, seg_of[i]), seg_of[i])
        return first

    def summary(self) -> dict:
        count = Counter(s.device for s in self.segments)
        npu_nodes = sum(self.on_npu)
        cpu_ops = Counter(n.op_type for n, npu in zip(self.graph.nodes, self.on_npu) if not npu)
        macs = [node_macs(NodeView(n, self.facts)) for n in self.graph.nodes]
        npu_macs = sum(m for m, npu in zip(macs, self.on_npu) if npu)
        return {"chip": self.chip.name, "policy": self.spec.policy,
                "npu_segments": count[NPU], "cpu_segments": count[CPU],
                "npu_nodes": npu_nodes, "cpu_nodes": len(self.graph) - npu_nodes,
                "npu_macs": npu_macs, "cpu_macs": sum(macs) - npu_macs,
                "graphs": [{"index": s.index, "device": s.device, "nodes": len(s.nodes)}
                           for s in self.segments],
                "cpu_ops": dict(cpu_ops.most_common()),
                **({"legal_convs": {"convs": self.legal_convs}} if self.legal_convs else {})}


def infer(model: onnx.ModelProto) -> onnx.ModelProto:
    """Shapes as far as ONNX can infer them (constant shape arithmetic included)."""
    try:
        return onnx.shape_inference.infer_shapes(model, data_prop=True)
    except Exception:  # a model inference rejects still splits; unknown shapes are reported
        return model


def plan_split(model: onnx.ModelProto, chip: Chip, spec: SplitSpec | None = None) -> SplitPlan:
    """Decide every node's device and cut the model into segments. Convs the chip refuses for
    their stride, kernel, dilation or padding, pools it refuses for their kernel or stride,
    reductions it has no kernel for (a Max of tensors, a ReduceMax, a ReduceSum:
    `reductions.legal_reductions`), grouped convs it refuses for their groups
    (`groups.legal_groups`), ops it lacks that are an op it has (a Sum of two tensors:
    `aliases.legal_aliases`), inference BatchNormalizations it refuses (as a depthwise 1x1 conv
    or a Mul and an Add: `batchnorms.legal_batchnorms`) and linear layers written as an Einsum (`einsum.legal_einsums`),
    are first written as ones it runs, where it runs every node of the rewrite
    (`legalize.legal_convs`; the plan is about that model), unless the recipe places nodes by
    hand or forces the node to the CPU."""
    spec = spec or SplitSpec()
    rewritten: list[str] = []
    if spec.policy not in ("cpu_only", "manual"):  # a conv the recipe sends to the CPU stays whole
        keep: set[str] = set()
        if spec.force_cpu:  # the op graph below is of the rewritten model; this one only selects
            og = build_op_graph(model.graph)
            keep = {og.nodes[i].output[0] for i in Selector(og).all(spec.force_cpu, "force_cpu")}
        model, linear = legal_einsums(model, chip, keep=keep)
        model, reduced = legal_reductions(model, chip, keep=keep)
        model, aliased = legal_aliases(model, chip, keep=keep)
        model, normed = legal_batchnorms(model, chip, keep=keep)
        model, grouped = legal_groups(model, chip, keep=keep)
        model, rewritten = legalize.legal_convs(model, chip, keep=keep)
        reduced = linear + reduced + aliased + normed + grouped
        rewritten = reduced + [name for name in rewritten if name not in reduced]
    inferred = infer(model)
    og = build_op_graph(inferred.graph)
    facts = GraphFacts.from_model(inferred)
    on_npu, reasons, pinned = _initial(og, facts, chip, spec)
    if spec.policy != "cpu_only":
        _channel_permutations_on_npu(og, facts, chip, on_npu, reasons, pinned)
    _log_power_spectra_on_cpu(og, facts, on_npu, reasons, pinned)
    _self_normalised_inputs_on_cpu(og, facts, on_npu, reasons, pinned)
    if spec.policy != "cpu_only":
        _integer_io_on_npu(og, facts, chip, on_npu, reasons, pinned)
        _layout_noops_between_npu_ops(og, facts, chip, on_npu, reasons, pinned)
    while True:
        segments = partition(og.preds, on_npu)
        moved = _demote_islands(og, facts, chip, spec, segments, on_npu, reasons, pinned)
        if not moved:
            return SplitPlan(inferred, og, facts, chip, spec, on_npu, reasons, segments, rewritten)


def check_placement(model: onnx.ModelProto, chip: Chip,
                    spec: SplitSpec | None = None) -> list[NodePlacement]:
    """Per node: device, submodel and reasons (what ``npubuild targets --check`` prints)."""
    return plan_split(model, chip, spec).placements


def _initial(og: OpGraph, facts: GraphFacts, chip: Chip, spec: SplitSpec):
    """Devices before the cut: the support check, then the recipe's overrides."""
    select = Selector(og)
    force_cpu = select.all(spec.force_cpu, "force_cpu")
    force_npu = select.all(spec.force_npu, "force_npu")
    manual = select.placement(spec.placement) if spec.policy == "manual" else {}
    both = set(force_cpu) & set(force_npu)
    if both:
        i = min(both)
        raise SelectorError(f"node {og.label(i)!r} is matched by both {force_cpu[i]} and "
                            f"{force_npu[i]}", ("split", "force_npu"))
    on_npu, reasons, pinned = [], [], set()
    for i, node in enumerate(og.nodes):
        checked = node_reasons(NodeView(node, facts), chip)
        if spec.policy == "cpu_only":
            device, why = CPU, ["split.policy is cpu_only"]
        elif i in manual:
            device, why = manual[i][0], [f"placed on the {manual[i][0].upper()} by {manual[i][1]}"]
            pinned.add(i)
        elif i in force_cpu:
            device, why = CPU, [f"forced to the CPU by {force_cpu[i]}"]
        elif i in force_npu:
            device, why = NPU, [f"forced onto the NPU by {force_npu[i]}"]
            why += [f"(the chip check says: {r})" for r in checked]
            pinned.add(i)
        else:
            device, why = (CPU, checked) if checked else (NPU, [])
        on_npu.append(device == NPU)
        reasons.append(why)
    return on_npu, reasons, pinned


def _channel_permutations_on_npu(og: OpGraph, facts: GraphFacts, chip: Chip,
                                 on_npu: list[bool], reasons: list[list[str]],
                                 pinned: set[int]) -> None:
    """Chains of Reshapes and Transposes that permute the channels (a channel shuffle) go to
    the NPU of a chip npubuild compiles for, whatever its table says of their ops and ranks:
    compile runs each as one channel permutation (`shuffles`). A chain the recipe forced or
    placed, any node of it, stays where the recipe put it."""
    for chain in shuffles.channel_permutations(og, facts, chip):
        if any(i in pinned or _forced(reasons[i]) for i in chain):
            continue
        for i in chain:
            on_npu[i], reasons[i] = True, []


def _layout_noops_between_npu_ops(og: OpGraph, facts: GraphFacts, chip: Chip,
                                  on_npu: list[bool], reasons: list[list[str]],
                                  pinned: set[int]) -> None:
    """Reshape-family nodes the chip check sent to the CPU but whose every producer and
    consumer runs on the NPU go to the NPU: there they move no data (chains of them too).

    Only nodes on the CPU for the chip check's reasons move; a recipe's force_cpu or manual
    placement stands. A node whose output leaves the model stays where it is.
    """
    candidates = {i for i, node in enumerate(og.nodes)
                  if not on_npu[i] and i not in pinned and not _forced(reasons[i])
                  and layout_noop_reasons(NodeView(node, facts), chip) == []
                  and not set(node.output) & set(og.outputs) and og.succs[i]}
    changed = True
    while changed:
        changed = False
        for i in sorted(candidates):
            producers = {og.producer.get(og.nodes[i].input[0])} - {None}
            neighbours = producers | set(og.succs[i])
            if not producers or not all(on_npu[j] or j in candidates for j in neighbours):
                candidates.discard(i)
                changed = True
    for i in candidates:
        on_npu[i], reasons[i] = True, []


INTEGER_IO_TYPES = (onnx.TensorProto.INT8,)


def integer_io(view: NodeView) -> bool:
    """Whether ``view`` is a model's integer I/O conversion: a DequantizeLinear reading an int8
    model input, or a QuantizeLinear writing an int8 model output, by a constant scalar scale
    and zero point (a full-integer TFLite export's, `frontends.dequantize`)."""
    node, facts = view.node, view.facts
    if node.op_type not in ("DequantizeLinear", "QuantizeLinear") or len(node.input) < 3:
        return False
    params = [view.const(1), view.const(2)]
    if any(p is None or p.size != 1 for p in params) or not float(params[0].reshape(())) > 0:
        return False
    integer = node.input[0] if node.op_type == "DequantizeLinear" else node.output[0]
    return facts.elem_type(integer) in INTEGER_IO_TYPES


def _integer_io_on_npu(og: OpGraph, facts: GraphFacts, chip: Chip, on_npu: list[bool],
                       reasons: list[list[str]], pinned: set[int]) -> None:
    """A model's integer I/O conversions (`integer_io`) run on the NPU of a chip npubuild
    compiles for, when the model input's DequantizeLinear feeds only NPU nodes or the model
    output's QuantizeLinear reads an NPU node: the NPU's input tensor is the model's integer
    input at its own scale and zero point, its output tensor the model's integer output
    (`quant.quantizer`), so no host part converts them. A recipe's placement stands."""
    from npubuild import backends

    if not backends.of(chip).plans_lmem:
        return
    inputs, outputs = set(og.inputs), set(og.outputs)
    for i, node in enumerate(og.nodes):
        if on_npu[i] or i in pinned or _forced(reasons[i]) or not integer_io(NodeView(node, facts)):
            continue
        if node.op_type == "DequantizeLinear":
            fits = (node.input[0] in inputs and not set(node.output) & outputs
                    and og.succs[i] and all(on_npu[j] for j in og.succs[i]))
        else:
            producer = og.producer.get(node.input[0])
            fits = (node.output[0] in outputs and not og.succs[i] and producer is not None
                    and on_npu[producer])
        if fits:
            on_npu[i], reasons[i] = True, []


def _log_power_spectra_on_cpu(og: OpGraph, facts: GraphFacts, on_npu: list[bool],
                              reasons: list[list[str]], pinned: set[int]) -> None:
    """Every node of a log power spectrum (`npubuild.split.spectrum`) runs in float on the CPU,
    unless the recipe placed it."""
    for i in log_power_spectra(og, facts):
        if on_npu[i] and i not in pinned:
            on_npu[i], reasons[i] = False, [spectrum.REASON]


def _self_normalised_inputs_on_cpu(og: OpGraph, facts: GraphFacts, on_npu: list[bool],
                                   reasons: list[list[str]], pinned: set[int]) -> None:
    """Every node that normalises a model input by its own statistics
    (`npubuild.split.input_statistics`) runs in float on the CPU, unless the recipe placed it."""
    for i in input_statistics.self_normalised_inputs(og, facts):
        if on_npu[i] and i not in pinned:
            on_npu[i], reasons[i] = False, [input_statistics.REASON]


def _forced(why: list[str]) -> bool:
    return any(r.startswith(("forced to the CPU", "placed on the")) for r in why)


def _demote_islands(og, facts, chip, spec, segments, on_npu, reasons, pinned) -> bool:
    """Move NPU islands that only move data, are too small or not worth it to the CPU; True
    when one moved."""
    if len(segments) < 2:
        return False  # one segment: nothing to hand over
    seg_of = segment_of(segments, len(og))
    moved = False
    for island in npu_islands(og.preds, on_npu, seg_of):
        if pinned.intersection(island):
            continue
        why = None
        if all(og.nodes[i].op_type in MOVEMENT for i in island):
            why = _MOVES_ONLY.format(n=len(island), s="s" * (len(island) != 1), ops=", ".join(
                sorted({og.nodes[i].op_type for i in island})))
        elif len(island) < spec.min_npu_nodes:
            why = (f"NPU island of {len(island)} node{'s' * (len(island) != 1)} is smaller "
                   f"than split.min_npu_nodes ({spec.min_npu_nodes})")
        elif spec.policy == "min_cost":
            cost = _island_cost(og, facts, chip, island)
            if not cost.worth_it:
                why = (f"kept on the CPU by split.policy min_cost: its NPU island of "
                       f"{len(island)} node{'s' * (len(island) != 1)}: {cost.explain()}")
        if why:
            moved = True
            for i in island:
                on_npu[i] = False
                reasons[i] = [why]
    return moved


_MOVES_ONLY = ("an NPU island of {n} node{s} that only move data ({ops}) between CPU parts or "
               "the model's inputs and outputs: it computes nothing, and on the NPU it costs a "
               "hand-over each way and a rounding to the NPU's integer type")


def _island_cost(og: OpGraph, facts: GraphFacts, chip: Chip, island: list[int]):
    members = set(island)
    crossing: set[str] = set()
    outputs = set(og.outputs)
    for i in island:
        crossing.update(t for t in og.uses[i] if og.producer.get(t) not in members
                        and not facts.is_const(t))
        crossing.update(o for o in og.nodes[i].output if o in outputs)
        for j in og.succs[i]:
            if j not in members:
                crossing.update(t for t in og.uses[j] if og.producer.get(t) in members)
    macs = sum(node_macs(NodeView(og.nodes[i], facts)) for i in island)
    return island_cost(chip, macs, [elements(facts.shape(t)) for t in sorted(crossing)])


class Selector:
    """Finds nodes by name, op type or output tensor name; glob patterns allowed."""

    def __init__(self, og: OpGraph):
        self.og = og
        self.index: dict[str, set[int]] = {}
        for i, node in enumerate(og.nodes):
            for key in (node.name, node.op_type, *node.output):
                if key:
                    self.index.setdefault(key, set()).add(i)

    def match(self, pattern: str) -> set[int]:
        if any(ch in pattern for ch in "*?["):
            return {i for key, hits in self.index.items() if fnmatch.fnmatchcase(key, pattern)
                    for i in hits}
        return self.index.get(pattern, set())

    def all(self, patterns: list[str], field_name: str) -> dict[int, str]:
        chosen: dict[int, str] = {}
        for k, pattern in enumerate(patterns):
            hits = self.match(pattern)
            if not hits:
                raise SelectorError(f"{pattern!r} matches no node name, op type or output "
                                    "tensor" + did_you_mean(pattern, self.index),
                                    ("split", field_name, k))
            for i in hits:
                chosen.setdefault(i, f"split.{field_name}[{k}] ({pattern!r})")
        return chosen

    def placement(self, placement: dict[str, str]) -> dict[int, tuple[str, str]]:
        chosen: dict[int, tuple[str, str]] = {}
        for pattern, device in placement.items():
            hits = self.match(pattern)
            if not hits:
                raise SelectorError(f"{pattern!r} matches no node name, op type or output "
                                    "tensor" + did_you_mean(pattern, self.index),
                                    ("split", "placement", pattern))
            for i in hits:
                chosen.setdefault(i, (device, f"split.placement[{pattern!r}]"))
        return chosen
