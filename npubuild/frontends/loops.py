"""Loops of a static trip count (ONNX ``Loop`` and ``Scan``) unrolled at import.

No chip's op table has control flow, and a loop whose number of iterations the constants
decide is a fixed chain of its body's ops: tf2onnx writes a Keras RNN layer it cannot map to an
ONNX LSTM (a masked one: Keras 3's, nakdimon's) as a ``Loop`` whose condition compares a
counter with the sequence length, and a ``tf.while`` or a ``Scan`` over a sequence of a fixed
length is the same. Each iteration becomes a copy of the body with its names under
``<loop>/unroll/i<k>/``: the carried values of one iteration are the next one's inputs, the
iteration number is a constant, a scan output is the Concat of every iteration's (each
Unsqueezed on its axis; a Scan's in reverse where its direction says so), a Scan's input
element is a Gather of one index. The body's values that follow from constants alone (the
counter, the condition) are evaluated once per iteration by the ONNX reference; what they
feed is folded afterwards (`npubuild.stages.importer.unroll_loops`).

A ``Loop`` runs while its condition holds, up to its trip count: it unrolls when both its trip
count (or, without one, its condition) and every value its condition reads follow from
constants, carried values whose initial values are constants and the iteration number, so the
number of iterations is known at import; a ``Scan`` unrolls when its scanned axis is static.
A loop stays whole (on the CPU; `why_kept` says why, split repeats it) when its condition
depends on what the model computes (a decoder that stops on its end token), its trip count is
not a constant, it runs no iteration, or iterations x body nodes exceeds `MAX_UNROLLED_NODES`
(the limit `npubuild.frontends.recurrent` puts on a recurrent layer, at about five nodes per
gate and step).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import helper, numpy_helper

from npubuild import onnx_io
from npubuild.frontends.recurrent import MAX_UNROLLED_GATE_STEPS
from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.surgery.graph import Editor
from npubuild.surgery.opsets import attr, make_axes_node

LOOP_OPS = ("Loop", "Scan")
NODES_PER_GATE_STEP = 5  # recurrent.py's estimate of what one gate of one step writes out
MAX_UNROLLED_NODES = NODES_PER_GATE_STEP * MAX_UNROLLED_GATE_STEPS  # iterations x body nodes
SCAN_INPUTS_OPSET = 9  # Scan from opset 9: no batch axis, no sequence_lens
_RANDOM_OPS = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
               "Multinomial", "Bernoulli"}


@dataclass
class Plan:
    """How one loop unrolls: its iterations and, per iteration, the values of the carried
    inputs that follow from constants (by body input name)."""

    trips: int
    static: list[dict[str, np.ndarray]] = field(default_factory=list)


def why_kept(node: onnx.NodeProto, const, shape_of, opset: int) -> str | None:
    """Why import leaves this Loop or Scan whole (None: it unrolls it)."""
    return plan(node, const, shape_of, opset)[1]


def plan(node: onnx.NodeProto, const, shape_of, opset: int) -> tuple[Plan | None, str | None]:
    """The loop's `Plan`, or why it stays whole. ``const(name)`` is the value of an outer
    tensor when it is a constant (else None), ``shape_of(name)`` its shape when known."""
    body = onnx_io.subgraphs(node)[0]
    if node.op_type == "Scan":
        return _scan_plan(node, body, shape_of)
    return _loop_plan(node, body, const, opset)


def unroll(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, str], dict[str, int]]:
    """Each Loop and Scan of the main graph that `plan` accepts written out iteration by
    iteration (the module's text); the model unchanged when there is none. Also, by node name,
    why the others stayed whole, and how many iterations each unrolled one ran."""
    if not any(n.op_type in LOOP_OPS and n.domain in STANDARD_DOMAINS for n in model.graph.node):
        return model, {}, {}
    out = _Writer(onnx_io.clone(model))
    graph = out.model.graph
    shapes = {v.name: onnx_io.value_shape(v)
              for v in [*graph.input, *graph.value_info, *graph.output]}
    kept, trips, done = {}, {}, []
    for index, node in enumerate(list(graph.node)):
        if node.op_type not in LOOP_OPS or node.domain not in STANDARD_DOMAINS:
            continue
        name = node.name or node.output[0]
        found, reason = plan(node, out.constant, shapes.get, out.opset)
        if reason:
            kept[name] = reason
            continue
        base = f"{node.name or f'{node.op_type}_{index}'}/unroll"
        _Unroller(out, node, base, shapes).write(found)
        done.append(index)
        trips[name] = found.trips
    if not trips:
        return model, kept, {}
    for index in reversed(done):
        del graph.node[index]
    hoist_over_moves(out)
    return onnx_io.reinfer_shapes(Editor(out.model, "unroll_loops").finish()), kept, trips


class _Writer:
    """The model being written: what `npubuild.surgery.opsets`' makers ask of an Editor
    (``opset``, ``add_initializer``, ``make_node``) with the names taken indexed once (an
    Editor looks them all up for every new name: minutes for thousands of nodes)."""

    def __init__(self, model: onnx.ModelProto):
        self.model, self.opset = model, onnx_io.opset_of(model)
        graph = model.graph
        self.inits = {t.name: t for t in graph.initializer}
        self.constants = {n.output[0]: n for n in graph.node if n.op_type == "Constant"}
        self.taken = ({v.name for v in [*graph.input, *graph.output]} | set(self.inits)
                      | {o for n in graph.node for o in [*n.output, n.name]})

    def constant(self, name: str) -> np.ndarray | None:
        if name in self.inits:
            overridable = any(i.name == name for i in self.model.graph.input)
            return None if overridable else numpy_helper.to_array(self.inits[name])
        node = self.constants.get(name)
        if node is None or not node.attribute or node.attribute[0].name != "value":
            return None
        return numpy_helper.to_array(node.attribute[0].t)

    def unique(self, hint: str) -> str:
        name, k = hint, 1
        while name in self.taken:
            name, k = f"{hint}_{k}", k + 1
        self.taken.add(name)
        return name

    def add_initializer(self, value: np.ndarray, hint: str) -> str:
        name = self.unique(hint)
        self.model.graph.initializer.append(numpy_helper.from_array(np.asarray(value), name))
        self.inits[name] = self.model.graph.initializer[-1]
        return name

    def make_node(self, op_type: str, inputs: list[str], outputs: list[str], name_hint: str,
                  **attrs) -> onnx.NodeProto:
        node = helper.make_node(op_type, inputs, outputs, name=self.unique(name_hint), **attrs)
        self.model.graph.node.append(node)
        return node

    def extend(self, nodes: list[onnx.NodeProto]) -> None:
        self.taken.update(o for n in nodes for o in [*n.output, n.name])
        self.model.graph.node.extend(nodes)


# ---- how many iterations ------------------------------------------------------------------

def _loop_plan(node: onnx.NodeProto, body: onnx.GraphProto, const,
               opset: int) -> tuple[Plan | None, str | None]:
    given = [len(node.input) > i and bool(node.input[i]) for i in (0, 1)]
    limit = const(node.input[0]) if given[0] else None
    if given[0] and limit is None:
        return None, "its trip count is not a constant"
    cond = const(node.input[1]) if given[1] else np.array(True)
    if cond is None:
        return None, "its initial condition is not a constant"
    carried = list(node.input[2:])
    names = [i.name for i in body.input]
    outs = [o.name for o in body.output]
    initial = {names[2 + j]: const(x) for j, x in enumerate(carried) if x and const(x) is not None}
    static = _static_names(body, names[:2], initial, outs[1:1 + len(carried)], names[2:], const)
    if outs[0] not in static.tensors:
        return None, ("its condition depends on values the model computes (a data-dependent "
                      "loop: its body runs on the CPU)")
    found = Plan(0)
    run, values = static.evaluator(opset), {n: initial[n] for n in static.carried}
    nodes = max(len(body.node), 1)
    while bool(np.asarray(cond).all()) and (limit is None or found.trips < int(np.asarray(limit))):
        if (found.trips + 1) * nodes > MAX_UNROLLED_NODES:
            return None, (f"it runs more than {found.trips} iterations of {len(body.node)} body "
                          f"nodes, more than import unrolls ({MAX_UNROLLED_NODES} nodes)")
        found.static.append(dict(values))
        feeds = {names[0]: np.array(found.trips, np.int64), names[1]: np.array(True), **values}
        result = run(feeds)
        cond = result[outs[0]]
        values = {n: result[static.carried[n]] for n in static.carried}
        found.trips += 1
    if not found.trips:
        return None, "it runs no iteration"
    return found, None


@dataclass
class _Static:
    """The body's tensors that follow from constants, the iteration number and the carried
    values that do (body input -> body output), and the nodes that compute them."""

    body: onnx.GraphProto
    tensors: set[str]
    carried: dict[str, str]
    nodes: list[onnx.NodeProto]
    outer: dict[str, np.ndarray]
    inputs: list[str]

    def evaluator(self, opset: int):
        """A function from the static inputs to every static tensor, by the ONNX reference."""
        from onnx.reference import ReferenceEvaluator

        wanted = sorted({o for n in self.nodes for o in n.output if o})
        untyped = [helper.make_value_info(n, onnx.TypeProto()) for n in [*self.inputs, *wanted]]
        graph = helper.make_graph(
            self.nodes, "static", untyped[:len(self.inputs)], untyped[len(self.inputs):],
            [numpy_helper.from_array(np.asarray(v), n) for n, v in sorted(self.outer.items())]
            + list(self.body.initializer))
        ref = ReferenceEvaluator(graph, opsets={"": opset})

        def run(feeds: dict) -> dict:
            values = dict(zip(wanted, ref.run(wanted, feeds))) if wanted else {}
            return {**feeds, **self.outer, **values}
        return run


def _static_names(body: onnx.GraphProto, fixed: list[str], initial: dict, carried_out: list[str],
                  carried_in: list[str], const) -> _Static:
    """`_Static` of a Loop body: the carried values whose initial value is a constant stay
    static while their next value is (a fixed point)."""
    pairs = {i: o for i, o in zip(carried_in, carried_out) if i in initial}
    local = {o for n in body.node for o in n.output} | {i.name for i in body.input}
    while True:
        outer: dict[str, np.ndarray] = {}
        known = set(fixed) | set(pairs) | {t.name for t in body.initializer}
        nodes = []
        for node in body.node:
            ins = [i for i in node.input if i]
            captured = {i: const(i) for i in ins if i not in known and i not in local}
            if (node.op_type in _RANDOM_OPS or onnx_io.subgraphs(node)
                    or not all(i in known or captured.get(i) is not None for i in ins)):
                continue
            outer.update(captured)
            known.update(captured)
            nodes.append(node)
            known.update(o for o in node.output if o)
        lost = {i for i, o in pairs.items() if o not in known}
        if not lost:
            return _Static(body, known, pairs, nodes, outer, [*fixed, *pairs])
        pairs = {i: o for i, o in pairs.items() if i not in lost}


def _scan_plan(node: onnx.NodeProto, body: onnx.GraphProto,
               shape_of) -> tuple[Plan | None, str | None]:
    if len(body.input) != len(node.input) or not node.input:
        return None, "it is a Scan of opset 8 (a batch axis and sequence_lens)"
    scans = attr(node, "num_scan_inputs")
    axes = list(attr(node, "scan_input_axes", [0] * scans))
    lengths = set()
    for x, axis in zip(node.input[len(node.input) - scans:], axes):
        shape = shape_of(x)
        if not shape or not isinstance(shape[axis % len(shape)], int):
            return None, ("the length of its scanned axis is not static (fix the input shape "
                          "in the recipe)")
        lengths.add(shape[axis % len(shape)])
    trips = lengths.pop() if len(lengths) == 1 else 0
    if not trips:
        return None, "it runs no iteration"
    if trips * len(body.node) > MAX_UNROLLED_NODES:
        return None, (f"{trips} iterations x {len(body.node)} body nodes = "
                      f"{trips * len(body.node)} is more than import unrolls "
                      f"({MAX_UNROLLED_NODES})")
    return Plan(trips), None


# ---- writing the iterations out -----------------------------------------------------------

class _Unroller:
    """One loop written out in ``ed`` (the `_Writer` of the model) under ``base``."""

    def __init__(self, ed, node: onnx.NodeProto, base: str, shapes: dict):
        self.ed, self.node, self.base, self.shapes = ed, node, base, shapes
        self.body = onnx_io.subgraphs(node)[0]
        self.params: dict[tuple, str] = {}  # a value's dtype, shape and bytes -> its initializer

    def param(self, value: np.ndarray, hint: str) -> str:
        value = np.asarray(value)
        key = (value.dtype.str, value.shape, value.tobytes())
        if key not in self.params:
            self.params[key] = self.ed.add_initializer(value, f"{self.base}/{hint}")
        return self.params[key]

    def write(self, plan: Plan) -> None:
        inits = {t.name: self.param(numpy_helper.to_array(t), f"body/{t.name}")
                 for t in self.body.initializer}
        names = [i.name for i in self.body.input]
        outs = [o.name for o in self.body.output]
        if self.node.op_type == "Loop":
            state, first = names[2:], list(self.node.input[2:])
            carried_out = outs[1:1 + len(state)]
            scanned = outs[1 + len(state):]
        else:
            scans = attr(self.node, "num_scan_inputs")
            state, first = names[:len(names) - scans], list(self.node.input[:len(names) - scans])
            carried_out, scanned = outs[:len(state)], outs[len(state):]
        current = dict(zip(state, first))
        through = {i for i, o in zip(state, carried_out) if i == o}  # read, passed on unchanged
        steps = []
        for k in range(plan.trips):
            bound = {**inits, **current}
            if self.node.op_type == "Loop":
                bound[names[0]] = self.param(np.array(k, np.int64), f"i{k}/iteration")
                bound[names[1]] = self.param(np.array(True), "condition")
                for name, value in plan.static[k].items():
                    if name not in through:
                        bound[name] = self.param(value, f"i{k}/{name}")
            else:
                bound.update(self.scan_elements(k, plan.trips, names[len(state):]))
            mapped = self.inline(bound, f"{self.base}/i{k}/")
            current = {i: mapped.get(o, o) for i, o in zip(state, carried_out)}
            steps.append([mapped.get(o, o) for o in scanned])
        n_state = len(state)
        for out, src in zip(self.node.output[:n_state], [current[i] for i in state]):
            if out:
                self.ed.make_node("Identity", [src], [out], f"{self.base}/{out}")
        for s, out in enumerate(self.node.output[n_state:]):
            if out:
                self.stacked([step[s] for step in steps], s, len(scanned), out)

    def scan_elements(self, k: int, trips: int, inputs: list[str]) -> dict[str, str]:
        """A Scan's input elements of iteration k: one index Gathered on each scanned axis."""
        scans = len(inputs)
        axes = list(attr(self.node, "scan_input_axes", [0] * scans))
        backward = list(attr(self.node, "scan_input_directions", [0] * scans))
        bound = {}
        for name, x, axis, back in zip(inputs, self.node.input[len(self.node.input) - scans:],
                                       axes, backward):
            index = self.param(np.array(trips - 1 - k if back else k, np.int64), f"index{k}")
            out = self.ed.unique(f"{self.base}/i{k}/{name}")
            self.ed.make_node("Gather", [x, index], [out], f"{self.base}/i{k}/{name}", axis=axis)
            bound[name] = out
        return bound

    def inline(self, bound: dict[str, str], prefix: str) -> dict[str, str]:
        """The body's nodes copied with its names under ``prefix`` (its inputs as ``bound``
        says); the name each body tensor got."""
        names = dict(bound)
        copies = []
        for node in self.body.node:
            copy = onnx.NodeProto()
            copy.CopyFrom(node)
            copy.name = prefix + (node.name or node.output[0])
            copy.input[:] = [names.get(i, i) for i in node.input]
            for sub in onnx_io.subgraphs(copy):
                onnx_io.rename_outer_reads(sub, names)
            for o in node.output:
                if o:
                    names[o] = prefix + o
            copy.output[:] = [names.get(o, o) for o in node.output]
            copies.append(copy)
        self.ed.extend(copies)
        return names

    def stacked(self, parts: list[str], s: int, count: int, out: str) -> None:
        """Scan output s of ``count``: every iteration's value stacked on its axis (in order,
        or reversed)."""
        axis, back = 0, 0
        if self.node.op_type == "Scan":
            axes = list(attr(self.node, "scan_output_axes", [0] * count))
            directions = list(attr(self.node, "scan_output_directions", [0] * count))
            axis, back = axes[s], directions[s]
        if back:
            parts = parts[::-1]
        if axis < 0:  # the stacked rank is the element's plus one
            axis += len(self.shapes.get(out) or []) or 1
        hint = f"{self.base}/{out}"
        if len(parts) == 1:
            make_axes_node(self.ed, "Unsqueeze", parts, [out], [axis], f"{hint}/stack")
            return
        lifted = [self.ed.unique(f"{hint}/i{k}") for k in range(len(parts))]
        for k, (part, name) in enumerate(zip(parts, lifted)):
            make_axes_node(self.ed, "Unsqueeze", [part], [name], [axis], f"{hint}/i{k}")
        self.ed.make_node("Concat", lifted, [out], f"{hint}/stack", axis=axis)


HOISTED_OPS = ("Cast", "Not")  # element-wise, and no chip's NPU runs them
# data movement a per-element op commutes with (their other inputs constant)
MOVES = ("Gather", "Slice", "Squeeze", "Unsqueeze", "Reshape", "Flatten", "Transpose")


def hoist_over_moves(out: _Writer) -> None:
    """A Cast or Not of a moved part of a tensor (a Gather of one index, a Slice, a Squeeze...,
    with constant arguments) computed once over the whole tensor, then moved: an unrolled body
    reads one row of a loop-invariant tensor per iteration (tf2onnx's Keras mask: the step's
    row Gathered, Not, Cast to float), and each iteration's copy would be CPU work between NPU
    steps; hoisted, the CPU does it once before the loop and the per-step moves of a float
    tensor run on the NPU (import writes a one-index Gather as a Slice). Bit-identical."""
    graph = out.model.graph
    hoisted: dict[tuple, str] = {}
    while True:
        producer = {o: n for n in graph.node for o in n.output}
        changed = False
        for index, node in enumerate(graph.node):
            move = producer.get(node.input[0]) if node.op_type in HOISTED_OPS else None
            if (move is None or move.op_type not in MOVES or move.domain not in STANDARD_DOMAINS
                    or any(out.constant(i) is None for i in move.input[1:] if i)):
                continue
            key = (move.input[0], node.op_type,
                   tuple(a.SerializeToString(deterministic=True) for a in node.attribute))
            if key not in hoisted:
                name = out.unique(f"{move.input[0]}/{node.op_type.lower()}")
                whole = helper.make_node(node.op_type, [move.input[0]], [name], name=name)
                whole.attribute.extend(node.attribute)
                graph.node.append(whole)
                hoisted[key] = name
            moved = onnx.NodeProto()
            moved.CopyFrom(move)
            moved.input[0], moved.output[:], moved.name = hoisted[key], node.output, node.name
            graph.node[index].CopyFrom(moved)
            changed = True
        if not changed:
            return
