"""A match becomes one node calling a model-local function in domain ``npubuild.fused``.

The function's body is a copy of the matched nodes. Its formal inputs are the pattern's
variables; constants the match consumed (``Const``/``Lit`` inputs such as Clip's bounds) are
baked into the body as Constant nodes. The attributes of the pattern's ops (those their ONNX
schema defines) become attributes of the function: the body refers to them
(``ref_attr_name``), the fused node carries their values under ``<expose prefix><name>``, set
explicitly, with the schema default when the original node left them out. A rule may add
attributes of its own (``Fused.attrs``: an ``activation`` name, a Conv's kernel shape filled
in); those describe the body for later stages and never change what it computes.

Instances with the same body share one function; a body that differs (another activation,
no bias, other baked constants) is another *overload* of the same function name, named after
the rule's tag (``Relu``, ``Relu6``…; ``_2``, ``_3`` when a tag is taken by another body).
A fused node is named after the common path of the nodes it replaces (``/model.0/ConvSilu``)
and tagged in ``metadata_props``: ``npubuild.rule`` (the rule) and ``npubuild.fused_nodes``
(the names of the nodes it replaces).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import lazy_loader as lazy

from npubuild.fusions import FUSED_DOMAIN
from npubuild.fusions.graph import GraphView, fresh_name
from npubuild.fusions.pattern import Match

onnx = lazy.load("onnx")

RULE_KEY = "npubuild.rule"
SOURCE_KEY = "npubuild.fused_nodes"
# attribute types (OpSchema.AttrType's names) a function does not expose
_NOT_EXPOSED = frozenset({"GRAPH", "GRAPHS", "TENSOR", "TENSORS", "SPARSE_TENSOR", "SPARSE_TENSORS",
                          "TYPE_PROTO", "TYPE_PROTOS"})


@dataclass
class Fused:
    """What a rule says about one match: its overload tag and extra node attributes."""

    tag: str = ""
    attrs: dict[str, Any] = field(default_factory=dict)


class FunctionTable:
    """The model's functions in ``npubuild.fused``: one per distinct body."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        self.bodies = {(f.domain, f.name, f.overload): _signature(f) for f in model.functions}
        self.added = 0

    def add(self, function: onnx.FunctionProto, tag: str) -> str:
        """Register ``function`` (or find its twin); return the overload to call."""
        signature = _signature(function)
        for k in itertools.count(1):
            overload = tag if k == 1 else (f"{tag}_{k}" if tag else str(k))
            key = (function.domain, function.name, overload)
            if self.bodies.get(key, signature) == signature:
                break
        if key not in self.bodies:
            function.overload = overload
            self.model.functions.append(function)
            self.bodies[key] = signature
            self.added += 1
        return overload


def _signature(function: onnx.FunctionProto) -> bytes:
    copy = onnx.FunctionProto()
    copy.CopyFrom(function)
    copy.overload = ""
    return copy.SerializeToString(deterministic=True)


def fused_node(view: GraphView, match: Match, op_name: str, rule: str, table: FunctionTable,
               taken: set[str]) -> onnx.NodeProto:
    """The node replacing ``match``; its function is added to ``table``."""
    fused = match.info if isinstance(match.info, Fused) else Fused(match.pattern.tag)
    body = _Body(view, match)
    attrs = {**body.values,
             **{k: onnx.helper.make_attribute(k, v) for k, v in fused.attrs.items()}}
    function = onnx.helper.make_function(
        FUSED_DOMAIN, op_name, body.formals, body.formal_outputs, body.nodes,
        [onnx.helper.make_opsetid(d, view.opsets.get(d, 1)) for d in sorted(body.domains)],
        attributes=sorted(set(body.refs) | set(attrs)))
    overload = table.add(function, fused.tag or match.pattern.tag)
    root = view.nodes[match.root]
    node = onnx.helper.make_node(op_name, body.actuals, list(root.output), domain=FUSED_DOMAIN,
                                 name=fresh_name(taken, _fused_name(view, match, op_name)))
    node.overload = overload
    node.attribute.extend(attrs[k] for k in sorted(attrs))
    _tag(node, rule, ",".join(view.nodes[i].name or view.nodes[i].output[0]
                              for i in sorted(match.nodes.values())))
    return node


def _tag(node: onnx.NodeProto, rule: str, sources: str) -> None:
    for key, value in ((RULE_KEY, rule), (SOURCE_KEY, sources)):
        entry = node.metadata_props.add()
        entry.key, entry.value = key, value


def _fused_name(view: GraphView, match: Match, op_name: str) -> str:
    """``/model.0/ConvSilu`` from ``/model.0/conv/Conv`` and ``/model.0/act/Mul``."""
    names = [view.nodes[i].name for i in sorted(match.nodes.values())]
    parts = [n.split("/") for n in names if n]
    common = []
    if len(parts) == len(names):
        for column in zip(*(p[:-1] for p in parts)):
            if len(set(column)) > 1:
                break
            common.append(column[0])
    if common and any(common):
        return "/".join(common) + "/" + op_name
    first = view.nodes[min(match.nodes.values())]
    return f"{first.name or first.output[0]}/{op_name}"


class _Body:
    """The function body of a match, and the fused node's interface."""

    def __init__(self, view: GraphView, match: Match):
        self.view, self.match = view, match
        self.rename: dict[str, str] = {}
        self.formals, self.actuals = [], []
        for var, tensor in match.inputs.items():
            if tensor and tensor not in self.rename:
                self.rename[tensor] = var
                self.formals.append(var)
                self.actuals.append(tensor)
        self.ids = {index: op_id for op_id, index in match.nodes.items()}
        for index in sorted(self.ids):
            for j, tensor in enumerate(view.nodes[index].output):
                self.rename.setdefault(tensor, f"{self.ids[index]}:{j}")
        root = view.nodes[match.root]
        self.formal_outputs = [self.rename[t] for t in root.output]
        self.refs: dict[str, int] = {}
        self.values: dict[str, onnx.AttributeProto] = {}
        self.domains = {""}
        self.nodes = self._constants() + [self._copy(i) for i in sorted(self.ids)]

    def _constants(self) -> list[onnx.NodeProto]:
        nodes = []
        for index in sorted(self.ids):
            for tensor in self.view.nodes[index].input:
                if tensor and tensor not in self.rename:
                    value = self.view.constant(tensor)
                    assert value is not None, f"{tensor} is neither a variable nor a constant"
                    self.rename[tensor] = f"const:{len(nodes)}"
                    nodes.append(onnx.helper.make_node("Constant", [], [self.rename[tensor]],
                                                       value=onnx.numpy_helper.from_array(value)))
        return nodes

    def _copy(self, index: int) -> onnx.NodeProto:
        node = self.view.nodes[index]
        op = self.match.pattern.op(self.ids[index])
        self.domains.add(node.domain if node.domain != "ai.onnx" else "")
        copy = onnx.helper.make_node(node.op_type, [self.rename.get(t, "") for t in node.input],
                                     [self.rename[t] if t else "" for t in node.output],
                                     name=op.id, domain=node.domain)
        copy.overload = node.overload
        exposed = self._expose(node, op.expose)
        for attr in node.attribute:
            if attr.name not in exposed:
                copy.attribute.append(attr)
        for name, (public, kind) in sorted(exposed.items()):
            copy.attribute.append(onnx.helper.make_attribute_ref(name, kind, ref_attr_name=public))
        return copy

    def _expose(self, node: onnx.NodeProto, prefix: str | None) -> dict[str, tuple[str, int]]:
        """Attribute name -> (public name, type) for the attributes this node exposes."""
        schema = _schema(node, self.view.opsets)
        if prefix is None or schema is None:
            return {}
        present = {a.name: a for a in node.attribute}
        exposed = {}
        for name, spec in schema.attributes.items():
            kind, public = int(spec.type.value), prefix + name
            if spec.type.name in _NOT_EXPOSED or public in self.refs:
                continue
            value = present.get(name) or (spec.default_value if spec.default_value.type else None)
            exposed[name] = (public, kind)
            self.refs[public] = kind
            if value is not None:
                self.values[public] = _renamed(value, public)
        return exposed


def _schema(node: onnx.NodeProto, opsets: dict[str, int]):
    domain = node.domain if node.domain != "ai.onnx" else ""
    try:
        return onnx.defs.get_schema(node.op_type, opsets.get(domain, 1), domain)
    except Exception:  # custom ops have no schema: their attributes stay in the body
        return None


def _renamed(attr: onnx.AttributeProto, name: str) -> onnx.AttributeProto:
    copy = onnx.AttributeProto()
    copy.CopyFrom(attr)
    copy.name = name
    return copy
