"""The dependency graph the partition works on: placeable nodes, edges, topological order.

Constant nodes are not placed: each submodel that reads one gets its own copy ("free"
constants), so a constant feeding both devices does not tie segments together. A node holding
subgraphs (If, Loop, Scan) also reads the outer-scope tensors its bodies name; those count as
its inputs, so cutting the graph turns them into submodel inputs like any other edge.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import onnx

from npubuild.errors import BuildError
from npubuild.onnx_io import (  # noqa: F401 - used here and by split's modules
    STANDARD_DOMAINS, node_uses, outer_refs, subgraphs)

#: Ops that only move or select values: no arithmetic, so no rounding in float
MOVEMENT = frozenset({"Reshape", "Transpose", "Slice", "Squeeze", "Unsqueeze", "Concat", "Split",
                      "Gather", "Flatten", "Identity"})


@dataclass
class OpGraph:
    nodes: list[onnx.NodeProto]           # placeable nodes, topologically ordered
    uses: list[list[str]]                 # tensors each node reads (inputs + outer-scope names)
    preds: list[list[int]]                # distinct producer nodes
    succs: list[list[int]]
    producer: dict[str, int]
    free_consts: dict[str, onnx.NodeProto]  # output name -> Constant node, copied where used
    inputs: list[str]                     # graph inputs that are not initializers
    outputs: list[str]
    initializers: set[str]

    def __len__(self) -> int:
        return len(self.nodes)

    def label(self, index: int) -> str:
        node = self.nodes[index]
        return node.name or f"{node.op_type}#{index}"


def is_free_constant(node: onnx.NodeProto, graph_outputs: set[str]) -> bool:
    return (node.op_type == "Constant" and node.domain in STANDARD_DOMAINS
            and not graph_outputs.intersection(node.output))


def build_op_graph(graph: onnx.GraphProto) -> OpGraph:
    """Index a graph for partitioning; linear in its size (plus a heap if it is unsorted)."""
    outputs = [o.name for o in graph.output]
    output_set = set(outputs)
    inits = {t.name for t in graph.initializer}
    free, nodes = {}, []
    for node in graph.node:
        if is_free_constant(node, output_set):
            free[node.output[0]] = node
        else:
            nodes.append(node)
    uses = [node_uses(n) for n in nodes]
    order = _topological(nodes, uses)
    nodes, uses = [nodes[i] for i in order], [uses[i] for i in order]
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    preds = [sorted({producer[t] for t in u if t in producer}) for u in uses]
    succs: list[list[int]] = [[] for _ in nodes]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
    known = inits | set(free) | set(producer) | {v.name for v in graph.input}
    for i, u in enumerate(uses):
        missing = [t for t in u if t not in known]
        if missing:
            raise BuildError(f"node {nodes[i].name or nodes[i].op_type!r} reads {missing[0]!r}, "
                             "which nothing produces", stage="split")
    return OpGraph(nodes, uses, preds, succs, producer, free,
                   [v.name for v in graph.input if v.name not in inits], outputs, inits)


def _topological(nodes: list[onnx.NodeProto], uses: list[list[str]]) -> list[int]:
    """A dependency order of the nodes, keeping the file's order wherever it already is one."""
    producer = {o: i for i, n in enumerate(nodes) for o in n.output if o}
    deps = [{producer[t] for t in u if t in producer} for u in uses]
    if all(all(d < i for d in ds) for i, ds in enumerate(deps)):
        return list(range(len(nodes)))
    waiting = [len(ds) for ds in deps]
    users: list[list[int]] = [[] for _ in nodes]
    for i, ds in enumerate(deps):
        for d in ds:
            users[d].append(i)
    ready = [i for i, w in enumerate(waiting) if w == 0]
    heapq.heapify(ready)
    order = []
    while ready:
        i = heapq.heappop(ready)
        order.append(i)
        for u in users[i]:
            waiting[u] -= 1
            if waiting[u] == 0:
                heapq.heappush(ready, u)
    if len(order) != len(nodes):
        raise BuildError("the graph has a cycle", stage="split")
    return order
