"""Read-only indexes over an ONNX graph, and the one edit every fusion rule makes.

`GraphView` answers the questions a matcher asks: who produces a tensor, who consumes it (nodes
whose subgraphs read it included), is it a graph output, is it a constant and what is its value.
`splice` swaps matched nodes for their replacements and prunes what only they used.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Iterable

import lazy_loader as lazy

from npubuild.onnx_io import STANDARD_DOMAINS

np = lazy.load("numpy")
onnx = lazy.load("onnx")


class GraphView:
    """Indexes over ``model.graph`` as it is now (build a new view after editing)."""

    def __init__(self, model: onnx.ModelProto):
        self.model = model
        graph = model.graph
        self.nodes = list(graph.node)
        self.producer: dict[str, int] = {}
        self.consumers: dict[str, list[int]] = defaultdict(list)
        for i, node in enumerate(self.nodes):
            self.producer.update((t, i) for t in node.output if t)
            for t in dict.fromkeys([*node.input, *_outer_names(node)]):
                if t:
                    self.consumers[t].append(i)
        self.outputs = {o.name for o in graph.output}
        overridable = {i.name for i in graph.input} if model.ir_version >= 4 else set()
        self.initializers = {t.name: t for t in graph.initializer if t.name not in overridable}
        self.opsets = {(o.domain if o.domain != "ai.onnx" else ""): o.version
                       for o in model.opset_import}
        self._constants: dict[str, np.ndarray | None] = {}

    @property
    def opset(self) -> int:
        return self.opsets.get("", 1)

    def label(self, index: int) -> str:
        """How explanations name a node: its op type and name (or its first output)."""
        node = self.nodes[index]
        return f"{node.op_type} {node.name or node.output[0]!r}"

    def constant(self, name: str) -> np.ndarray | None:
        """The value of a tensor fixed at build time (initializer, Constant, ConstantOfShape)."""
        if name not in self._constants:
            self._constants[name] = self._evaluate(name)
        return self._constants[name]

    def _evaluate(self, name: str) -> np.ndarray | None:
        if name in self.initializers:
            return onnx.numpy_helper.to_array(self.initializers[name])
        index = self.producer.get(name)
        if index is None:
            return None
        node = self.nodes[index]
        if node.op_type == "Constant" and node.domain in STANDARD_DOMAINS:
            return _constant_attr(node)
        if node.op_type == "ConstantOfShape" and node.domain in STANDARD_DOMAINS:
            shape = self.constant(node.input[0])
            value = next((onnx.numpy_helper.to_array(a.t) for a in node.attribute
                          if a.name == "value"), np.zeros(1, np.float32))
            return None if shape is None else np.full(shape.astype(np.int64), value.ravel()[0],
                                                      dtype=value.dtype)
        return None

    def shape(self, name: str) -> list[int | None] | None:
        """The static shape recorded for a tensor (value_info, inputs, outputs, initializers)."""
        if name in self.initializers:
            return list(self.initializers[name].dims)
        graph = self.model.graph
        for value in (*graph.value_info, *graph.input, *graph.output):
            if value.name == name and value.type.tensor_type.HasField("shape"):
                return [d.dim_value if d.HasField("dim_value") else None
                        for d in value.type.tensor_type.shape.dim]
        return None

    def outside_uses(self, tensor: str, inside: set[int]) -> list[int]:
        return [c for c in self.consumers.get(tensor, []) if c not in inside]


def _constant_attr(node: onnx.NodeProto) -> np.ndarray | None:
    for attr in node.attribute:
        if attr.name == "value":
            return onnx.numpy_helper.to_array(attr.t)
        if attr.name in ("value_float", "value_floats"):
            return np.asarray(onnx.helper.get_attribute_value(attr), dtype=np.float32)
        if attr.name in ("value_int", "value_ints"):
            return np.asarray(onnx.helper.get_attribute_value(attr), dtype=np.int64)
    return None


def _outer_names(node: onnx.NodeProto) -> set[str]:
    """Tensors a node's subgraphs (If, Loop, Scan bodies) read from the enclosing graph."""
    names: set[str] = set()
    for attr in node.attribute:
        for graph in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
            local = {i.name for i in graph.input} | {t.name for t in graph.initializer}
            for inner in graph.node:
                local.update(inner.output)
            for inner in graph.node:
                names.update(t for t in [*inner.input, *_outer_names(inner)] if t not in local)
            names.update(o.name for o in graph.output if o.name not in local)
    return names


def attribute(node: onnx.NodeProto, name: str, default=None):
    """A node attribute's Python value (strings decoded), or ``default``."""
    for attr in node.attribute:
        if attr.name == name:
            value = onnx.helper.get_attribute_value(attr)
            return value.decode() if isinstance(value, bytes) else value
    return default


def splice(model: onnx.ModelProto, view: GraphView, replaced: dict[int, list[onnx.NodeProto]],
           removed: Iterable[int]) -> None:
    """Remove ``removed`` nodes; put ``replaced[i]`` where node ``i`` was; prune orphans.

    Replacements go where the match's root was: its inputs are all produced earlier, so the
    graph stays topologically sorted. Nodes and initializers that only fed removed nodes go too.
    """
    removed = set(removed)
    freed = {t for i in removed for t in view.nodes[i].input if t}
    nodes: list[onnx.NodeProto] = []
    for i, node in enumerate(view.nodes):
        nodes.extend(replaced.get(i, []))
        if i not in removed:
            nodes.append(node)
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    prune(model, freed)


def prune(model: onnx.ModelProto, candidates: set[str]) -> None:
    """Drop the producers (and initializers) of ``candidates`` that nothing uses any more."""
    graph = model.graph
    while candidates:
        view = GraphView(model)
        unused = {t for t in candidates if not view.consumers.get(t) and t not in view.outputs}
        _drop_initializers(graph, unused & {t.name for t in graph.initializer})
        doomed = {view.producer[t] for t in unused if t in view.producer}
        doomed = {i for i in doomed if not any(view.consumers.get(o) or o in view.outputs
                                               for o in view.nodes[i].output if o)}
        candidates = {t for i in doomed for t in view.nodes[i].input if t}
        if doomed:
            kept = [n for i, n in enumerate(view.nodes) if i not in doomed]
            del graph.node[:]
            graph.node.extend(kept)
    _drop_stale_value_info(graph)


def _drop_initializers(graph: onnx.GraphProto, names: set[str]) -> None:
    keep = [t for t in graph.initializer if t.name not in names]
    del graph.initializer[:]
    graph.initializer.extend(keep)
    inputs = [i for i in graph.input if i.name not in names]  # IR < 4 lists them as inputs too
    del graph.input[:]
    graph.input.extend(inputs)


def _drop_stale_value_info(graph: onnx.GraphProto) -> None:
    live = {t for n in graph.node for t in n.output}
    keep = [v for v in graph.value_info if v.name in live]
    del graph.value_info[:]
    graph.value_info.extend(keep)


def fresh_name(taken: set[str], base: str) -> str:
    """``base``, or ``base_2``, ``base_3``… whichever is not taken yet (and take it)."""
    name, k = base, 1
    while name in taken:
        k += 1
        name = f"{base}_{k}"
    taken.add(name)
    return name


def names_in(model: onnx.ModelProto) -> set[str]:
    graph = model.graph
    return ({t for n in graph.node for t in (*n.input, *n.output, n.name)}
            | {t.name for t in graph.initializer} | {v.name for v in graph.input}
            | {v.name for v in graph.output})
