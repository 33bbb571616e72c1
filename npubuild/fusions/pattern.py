"""Patterns of ONNX nodes and a matcher that explains why a candidate does not match.

A `Pattern` is a table of `Op`s, producers first, the op whose outputs the fusion keeps (the
*root*) last. Each op lists what feeds its inputs, in order:

- the ``id`` of another op of the pattern: that op's first output;
- a variable name (any other string): an input of the fused op; the same name twice means
  the same tensor; `Opt(name)` may also be absent;
- `Lit(v)`: a constant whose every element equals ``v`` (baked into the fused body);
- `Const(name)`: any constant (baked into the body; rules read its value).

Inputs a node has beyond those listed become inputs of the fused op (``<id>:in<k>``). Add and Mul are tried in
both input orders. Matching starts at every node of the root's op type, the last ones first
(so the largest match wins), walks producers, and then refuses a match when a tensor inside it
is a graph output or feeds a node outside it. A failed candidate becomes a `Miss` whose
``progress`` (how many ops matched) ranks how near it came.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Any, Callable, Mapping, Sequence, Union

import lazy_loader as lazy

from npubuild.fusions.graph import GraphView, attribute

np = lazy.load("numpy")
onnx = lazy.load("onnx")

COMMUTATIVE = frozenset({"Add", "Mul", "Max", "Min", "Sum", "And", "Or", "Xor", "Equal"})


@dataclass(frozen=True)
class Lit:
    value: float


@dataclass(frozen=True)
class Const:
    name: str
    optional: bool = False


@dataclass(frozen=True)
class Opt:
    name: str


Ref = Union[str, Lit, Const, Opt]


@dataclass(frozen=True)
class Op:
    """One node of a pattern; ``attrs`` maps attribute names to required values or predicates.

    ``expose`` is the prefix under which this op's attributes appear on the fused node
    (``None``: they stay fixed inside the body).
    """

    op: str
    inputs: tuple[Ref, ...] = ()
    id: str = ""
    attrs: Mapping[str, Any] = field(default_factory=dict)
    domain: str = ""
    expose: str | None = ""

    @property
    def commutative(self) -> bool:
        return self.domain == "" and self.op in COMMUTATIVE and len(self.inputs) == 2


@dataclass(frozen=True)
class Pattern:
    ops: tuple[Op, ...]
    tag: str = ""

    @property
    def root(self) -> Op:
        return self.ops[-1]

    @property
    def label(self) -> str:
        return " -> ".join(op.op for op in self.ops)

    def op(self, op_id: str) -> Op | None:
        return next((op for op in self.ops if op.id == op_id), None)

    @property
    def variables(self) -> list[str]:
        """Input variables in the order they first appear: the fused op's input order."""
        ids = {op.id for op in self.ops}
        names = [r if isinstance(r, str) else r.name for op in self.ops for r in op.inputs
                 if isinstance(r, Opt) or (isinstance(r, str) and r not in ids)]
        return list(dict.fromkeys(names))


def pattern(*ops: Op, tag: str = "") -> Pattern:
    """A pattern with default ids filled in (the op type; ``<op>_<k>`` when it repeats)."""
    counts: dict[str, int] = {}
    for op in ops:
        counts[op.op] = counts.get(op.op, 0) + 1
    named = []
    for k, op in enumerate(ops):
        default = op.op if counts[op.op] == 1 else f"{op.op}_{k}"
        named.append(op if op.id else replace(op, id=default))
    return Pattern(tuple(named), tag)


@dataclass
class Match:
    pattern: Pattern
    nodes: dict[str, int] = field(default_factory=dict)
    inputs: dict[str, str] = field(default_factory=dict)
    consts: dict[str, str] = field(default_factory=dict)
    info: Any = None

    @property
    def root(self) -> int:
        return self.nodes[self.pattern.root.id]

    def copy(self) -> "Match":
        return Match(self.pattern, dict(self.nodes), dict(self.inputs), dict(self.consts))


@dataclass(frozen=True)
class Miss:
    progress: float
    candidate: str
    reason: str

    def __str__(self) -> str:
        return f"{self.candidate}: {self.reason}"


Check = Callable[[GraphView, Match], Any]


def find_matches(view: GraphView, patterns: Sequence[Pattern],
                 check: Check | None = None) -> tuple[list[Match], list[Miss]]:
    """Non-overlapping matches of any of ``patterns`` (tried in order at each root), and misses.

    ``check(view, match)`` may refuse a structural match by returning a reason (a string);
    anything else it returns is kept as ``match.info``.
    """
    claimed: set[int] = set()
    matches: list[Match] = []
    misses: list[Miss] = []
    for index in reversed(range(len(view.nodes))):
        for pat in patterns:
            if not _is_op(view.nodes[index], pat.root):
                continue
            result = _match_root(view, pat, index, claimed, check)
            if isinstance(result, Miss):
                misses.append(result)
                continue
            matches.append(result)
            claimed.update(result.nodes.values())
            break
    matches.reverse()
    return matches, misses


def _match_root(view, pat, index, claimed, check) -> Match | Miss:
    result = _Matcher(view, pat, index).run()
    if isinstance(result, Miss):
        return result
    where = view.label(index)
    if claimed & set(result.nodes.values()):
        return Miss(0, where, f"{pat.label}: overlaps a larger match of the same rule")
    info = check(view, result) if check else None
    if isinstance(info, str):
        return Miss(len(pat.ops), where, f"{pat.label}: {info}")
    result.info = info
    return result


def nearest(misses: Sequence[Miss], limit: int = 3) -> list[Miss]:
    """The misses that came closest, nearest first (stable for ties)."""
    return sorted(misses, key=lambda m: -m.progress)[:limit]


def _is_op(node, op: Op) -> bool:
    domain = "" if node.domain == "ai.onnx" else node.domain
    return node.op_type == op.op and domain == op.domain


class _Matcher:
    def __init__(self, view: GraphView, pat: Pattern, root: int):
        self.view, self.pat, self.root = view, pat, root
        self.where = view.label(root)

    def miss(self, m: Match, reason: str, nearer: float = 0.0) -> Miss:
        return Miss(len(m.nodes) + nearer, self.where, f"{self.pat.label}: {reason}")

    def run(self) -> Match | Miss:
        result = self.node(self.pat.root, self.root, Match(self.pat))
        if isinstance(result, Miss):
            return result
        order = {name: k for k, name in enumerate(self.pat.variables)}
        result.inputs = dict(sorted(result.inputs.items(), key=lambda kv: order.get(kv[0], len(order))))
        return self.contained(result)

    def node(self, op: Op, index: int, m: Match) -> Match | Miss:
        node = self.view.nodes[index]
        if op.id in m.nodes:
            return m if m.nodes[op.id] == index else self.miss(m, f"{op.id} is not one node")
        reason = attribute_mismatch(node, op.attrs, self.view.opsets.get(op.domain, 1))
        if reason:
            return self.miss(m, f"{self.view.label(index)} {reason}", nearer=0.5)
        m = m.copy()
        m.nodes[op.id] = index
        orders = [op.inputs, op.inputs[::-1]] if op.commutative else [op.inputs]
        misses = []
        for refs in orders:
            result = self.inputs(refs, index, m.copy())
            if not isinstance(result, Miss):
                return result
            misses.append(result)
        return max(misses, key=lambda x: x.progress)

    def inputs(self, refs, index: int, m: Match) -> Match | Miss:
        node = self.view.nodes[index]
        actual = [*node.input, *[""] * max(0, len(refs) - len(node.input))]
        for k, (ref, tensor) in enumerate(zip(refs, actual)):
            m = self.ref(ref, tensor, m, f"input {k} of {self.view.label(index)}")
            if isinstance(m, Miss):
                return m
        for k, tensor in enumerate(actual[len(refs):], start=len(refs)):
            if tensor:
                m.inputs.setdefault(f"{self._id(index, m)}:in{k}", tensor)
        return m

    def _id(self, index: int, m: Match) -> str:
        return next(k for k, v in m.nodes.items() if v == index)

    def ref(self, ref: Ref, tensor: str, m: Match, where: str) -> Match | Miss:
        op = self.pat.op(ref) if isinstance(ref, str) else None
        if op is not None:
            return self.producer(op, tensor, m, where)
        if isinstance(ref, (str, Opt)):
            return self.variable(ref if isinstance(ref, str) else ref.name, tensor,
                                 isinstance(ref, Opt), m, where)
        value = self.view.constant(tensor) if tensor else None
        if isinstance(ref, Const):
            if value is None and (tensor or not ref.optional):
                return self.miss(m, f"{where} is not a constant")
            return self.bind(m.consts, ref.name, tensor, m, where)
        if value is None:
            return self.miss(m, f"{where} is not a constant {ref.value:g}")
        if value.size == 0 or not np.allclose(value, ref.value, rtol=1e-6, atol=0):
            return self.miss(m, f"{where} is {_short(value)}, the pattern needs {ref.value:g}")
        return m

    def producer(self, op: Op, tensor: str, m: Match, where: str) -> Match | Miss:
        index = self.view.producer.get(tensor) if tensor else None
        if index is None:
            kind = "missing" if not tensor else f"{tensor!r}, which no node produces"
            return self.miss(m, f"{where} is {kind}, the pattern needs {op.op}")
        if not _is_op(self.view.nodes[index], op):
            return self.miss(m, f"{where} comes from {self.view.label(index)}, not {op.op}")
        if self.view.nodes[index].output[0] != tensor:
            return self.miss(m, f"{where} is not the first output of {self.view.label(index)}")
        return self.node(op, index, m)

    def variable(self, name: str, tensor: str, optional: bool, m: Match, where: str):
        if not tensor and not optional:
            return self.miss(m, f"{where} is missing")
        return self.bind(m.inputs, name, tensor, m, where)

    def bind(self, table: dict, name: str, tensor: str, m: Match, where: str):
        if name in table and table[name] != tensor:
            return self.miss(m, f"{where} is {tensor!r}, not the same tensor as {table[name]!r}")
        table[name] = tensor
        return m

    def contained(self, m: Match) -> Match | Miss:
        """No tensor inside the match may be a graph output or feed a node outside it."""
        inside = set(m.nodes.values())
        for index in sorted(inside - {m.root}):
            for tensor in filter(None, self.view.nodes[index].output):
                if tensor in self.view.outputs:
                    return self.miss(m, f"{tensor!r} ({self.view.label(index)}) is a graph "
                                        "output; fusing would hide it")
                others = self.view.outside_uses(tensor, inside)
                if others:
                    users = ", ".join(self.view.label(i) for i in others[:3])
                    return self.miss(m, f"{tensor!r} ({self.view.label(index)}) also feeds "
                                        f"{users}, outside the pattern")
        return m


def attribute_mismatch(node, wanted: Mapping[str, Any], opset: int) -> str | None:
    """Why ``node``'s attributes fail ``wanted`` (values, or predicates), or None."""
    for name, want in wanted.items():
        have = attribute(node, name, _schema_default(node, name, opset))
        ok = want(have) if callable(want) else _same(have, want)
        if not ok:
            shown = "unset" if have is None else f"{_short(have)}"
            need = "" if callable(want) else f", the pattern needs {_short(want)}"
            return f"has {name}={shown}{need}"
    return None


def _schema_default(node, name: str, opset: int):
    try:
        schema = onnx.defs.get_schema(node.op_type, opset, node.domain or "")
    except Exception:  # unknown op or domain: no defaults
        return None
    attr = schema.attributes.get(name)
    if attr is None or not attr.default_value.type:
        return None
    value = onnx.helper.get_attribute_value(attr.default_value)
    return value.decode() if isinstance(value, bytes) else value


def _same(have, want) -> bool:
    if isinstance(want, (list, tuple)):
        return isinstance(have, (list, tuple)) and len(have) == len(want) and all(
            _same(h, w) for h, w in zip(have, want))
    if isinstance(want, float) or isinstance(have, float):
        return isinstance(have, (int, float)) and math.isclose(have, want, rel_tol=1e-6)
    return have == want


def _short(value) -> str:
    if isinstance(value, np.ndarray):
        flat = np.unique(value.ravel())
        return f"{flat[0]:g}" if flat.size == 1 else f"a tensor of shape {list(value.shape)}"
    if isinstance(value, float):
        return f"{value:g}"
    return repr(list(value)) if isinstance(value, tuple) else repr(value)
