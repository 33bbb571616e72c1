"""A working copy of an ONNX model that rewrites edit: indexes, constants, names, shapes.

Every rewrite starts with ``Editor(model, "<rewrite name>")`` (which clones the model, so the
caller's model is never touched), edits through its methods, and ends with ``finish()`` (which
sorts the nodes topologically, drops unused initializers and refreshes shape information).
Nodes a rewrite creates carry its name in their ``doc_string``.
"""

from __future__ import annotations

from fnmatch import fnmatchcase
from typing import Iterable

import lazy_loader as lazy

from npubuild import onnx_io
from npubuild.onnx_io import clone, opset_of
from npubuild.errors import did_you_mean
from npubuild.surgery import SurgeryError

np = lazy.load("numpy")
onnx = lazy.load("onnx")

GLOB_CHARS = "*?["


class Editor:
    """A cloned model plus producer/consumer indexes that rebuild after each edit."""

    def __init__(self, model: onnx.ModelProto, rewrite: str):
        self.model = clone(model)
        self.graph = self.model.graph
        self.rewrite = rewrite
        self._index: tuple[dict, dict] | None = None
        self._shapes: dict[str, tuple[int, list]] | None = None
        self._frozen: dict[str, tuple[int, list]] | None = None
        # by name, and every name in use: a linear scan per lookup made rewrites quadratic
        # (an unrolled recurrence has thousands of nodes and initializers)
        self._inits: dict[str, onnx.TensorProto] | None = None
        self._names: set[str] | None = None
        self._node_names: set[str] | None = None

    # -- indexes ---------------------------------------------------------------------------
    def touch(self) -> None:
        """Forget the indexes and shapes (call after editing the protos directly)."""
        self._index = None
        self._shapes = None
        self._inits = None
        self._names = None
        self._node_names = None

    def _indexes(self) -> tuple[dict, dict]:
        if self._index is None:
            producers, consumers = {}, {}
            for node in self.graph.node:
                for name in node.output:
                    if name:
                        producers[name] = node
                for name in node.input:
                    consumers.setdefault(name, []).append(node)
            self._index = (producers, consumers)
        return self._index

    def producer(self, tensor: str) -> onnx.NodeProto | None:
        return self._indexes()[0].get(tensor)

    def consumers(self, tensor: str) -> list[onnx.NodeProto]:
        return list(self._indexes()[1].get(tensor, []))

    @property
    def opset(self) -> int:
        return opset_of(self.model)

    @property
    def output_names(self) -> list[str]:
        return [o.name for o in self.graph.output]

    @property
    def input_names(self) -> list[str]:
        inits = {t.name for t in self.graph.initializer}
        return [i.name for i in self.graph.input if i.name not in inits]

    def is_graph_output(self, tensor: str) -> bool:
        return tensor in self.output_names

    def tensor_names(self) -> set[str]:
        return set(self._tensor_names())

    def _tensor_names(self) -> set[str]:
        if self._names is None:
            names = {i.name for i in self.graph.input} | {t.name for t in self.graph.initializer}
            for node in self.graph.node:
                names.update(node.input)
                names.update(node.output)
            names.discard("")
            self._names = names
        return self._names

    # -- lookup with errors that name what exists ----------------------------------------
    def node(self, name: str, op_type: str | None = None) -> onnx.NodeProto:
        for node in self.graph.node:
            if node.name == name:
                if op_type and node.op_type != op_type:
                    raise SurgeryError(f"node {name!r} is a {node.op_type}, not a {op_type}")
                return node
        names = [n.name for n in self.graph.node]
        raise SurgeryError(f"node {name!r} not found" + suggest(name, names))

    def select(self, patterns: Iterable[str] = (), op_types: Iterable[str] = (),
               required_op: str | None = None) -> list[onnx.NodeProto]:
        """Nodes named by ``patterns`` (exact names or globs) or of ``op_types``, in graph order.

        An exact name that does not exist, or a glob or op type that matches nothing, is an error.
        """
        names = [n.name for n in self.graph.node]
        chosen: dict[int, onnx.NodeProto] = {}
        for pattern in patterns:
            hits = [i for i, n in enumerate(names) if fnmatchcase(n, pattern)]
            if not hits:
                what = "no node matches" if any(c in pattern for c in GLOB_CHARS) else "node not found:"
                raise SurgeryError(f"{what} {pattern!r}" + suggest(pattern, names))
            chosen.update((i, self.graph.node[i]) for i in hits)
        present = {n.op_type for n in self.graph.node}
        for op in op_types:
            if op not in present:
                raise SurgeryError(f"the model has no {op} node" + suggest(op, sorted(present)))
            chosen.update((i, n) for i, n in enumerate(self.graph.node) if n.op_type == op)
        nodes = [chosen[i] for i in sorted(chosen)]
        for node in nodes:
            if required_op and node.op_type != required_op:
                raise SurgeryError(f"node {node.name!r} is a {node.op_type}, not a {required_op}")
        return nodes

    # -- constants ----------------------------------------------------------------------------
    def initializer(self, name: str) -> onnx.TensorProto | None:
        if self._inits is None:
            self._inits = {}
            for tensor in self.graph.initializer:
                self._inits.setdefault(tensor.name, tensor)  # the first, as a scan finds
        return self._inits.get(name)

    def overridable(self, name: str) -> bool:
        """An initializer also listed as a graph input is a default value (IR >= 4)."""
        return self.model.ir_version >= 4 and any(i.name == name for i in self.graph.input)

    def constant(self, name: str) -> np.ndarray | None:
        """The value of a constant tensor (initializer or Constant node output), else None."""
        if not name:
            return None
        tensor = self.initializer(name)
        if tensor is not None:
            return None if self.overridable(name) else onnx.numpy_helper.to_array(tensor)
        node = self.producer(name)
        if node is not None and node.op_type == "Constant" and node.attribute:
            attr = node.attribute[0]
            if attr.name == "value":
                return onnx.numpy_helper.to_array(attr.t)
            if attr.name in ("value_float", "value_int"):
                dtype = np.float32 if attr.name == "value_float" else np.int64
                return np.array(onnx.helper.get_attribute_value(attr), dtype=dtype)
            if attr.name in ("value_floats", "value_ints"):
                dtype = np.float32 if attr.name == "value_floats" else np.int64
                return np.array(onnx.helper.get_attribute_value(attr), dtype=dtype)
        return None

    def is_constant(self, name: str) -> bool:
        return self.constant(name) is not None

    def add_initializer(self, value: np.ndarray, hint: str) -> str:
        name = self.unique_tensor(hint)
        self.set_initializer(name, value)
        return name

    def set_initializer(self, name: str, value: np.ndarray) -> None:
        tensor = onnx.numpy_helper.from_array(np.asarray(value), name)
        self.graph.initializer.append(tensor)
        if self._inits is not None:
            self._inits.setdefault(name, self.graph.initializer[-1])
        if self._names is not None:
            self._names.add(name)
        if self.model.ir_version < 4:  # IR 3 lists every initializer as a graph input
            self.graph.input.append(onnx.helper.make_tensor_value_info(
                name, tensor.data_type, list(tensor.dims)))

    # -- names ---------------------------------------------------------------------------------
    def unique_tensor(self, hint: str) -> str:
        names = self._tensor_names()
        name = unique_name(hint, names)
        names.add(name)  # reserved: the caller may write it into a node directly
        return name

    def unique_node(self, hint: str) -> str:
        if self._node_names is None:
            self._node_names = {n.name for n in self.graph.node}
        name = unique_name(hint, self._node_names)
        self._node_names.add(name)
        return name

    # -- nodes ---------------------------------------------------------------------------------
    def make_node(self, op_type: str, inputs: list[str], outputs: list[str], name_hint: str,
                  domain: str = "", **attrs) -> onnx.NodeProto:
        """Create and append a node tagged with this rewrite (``finish`` orders the nodes)."""
        node = onnx.helper.make_node(op_type, inputs, outputs, name=self.unique_node(name_hint),
                                     domain=domain or None, **attrs)
        node.doc_string = f"npubuild surgery: {self.rewrite}"
        self.graph.node.append(node)
        self._index = None  # a new node: new producers and consumers, no initializer
        self._shapes = None
        if self._names is not None:
            self._names.update(n for n in (*inputs, *outputs) if n)
        return self.graph.node[-1]  # the graph's own copy, so later edits reach the graph

    def remove(self, *nodes: onnx.NodeProto) -> None:
        ids = {id(n) for n in nodes}
        for i in reversed(range(len(self.graph.node))):  # in place: held nodes stay attached
            if id(self.graph.node[i]) in ids:
                del self.graph.node[i]
        self.touch()

    def replace_uses(self, old: str, new: str, *, graph_outputs: bool = False,
                     only: Iterable[onnx.NodeProto] | None = None) -> None:
        """Make consumers of ``old`` read ``new`` (all, or ``only`` those nodes), the bodies of
        their If, Loop and Scan nodes too."""
        allowed = None if only is None else {id(n) for n in only}
        for node in self.graph.node:
            if allowed is not None and id(node) not in allowed:
                continue
            for i, name in enumerate(node.input):
                if name == old:
                    node.input[i] = new
            for body in onnx_io.subgraphs(node):
                onnx_io.rename_outer_reads(body, {old: new})
        if graph_outputs:
            for out in self.graph.output:
                if out.name == old:
                    out.name = new
        self.touch()

    def rename(self, old: str, new: str, *, graph_output: bool = True) -> None:
        """Rename a tensor everywhere: producer, consumers (the bodies that read it too), graph
        inputs/outputs, initializers.

        With ``graph_output=False`` a graph output of that name keeps it (a new node will
        produce it)."""
        for node in self.graph.node:
            for field in (node.input, node.output):
                for i, name in enumerate(field):
                    if name == old:
                        field[i] = new
            for body in onnx_io.subgraphs(node):
                onnx_io.rename_outer_reads(body, {old: new})
        groups = [self.graph.input, self.graph.value_info]
        groups += [self.graph.output] if graph_output else []
        for group in groups:
            for value in group:
                if value.name == old:
                    value.name = new
        for tensor in self.graph.initializer:
            if tensor.name == old:
                tensor.name = new
        self.touch()

    def bypass(self, node: onnx.NodeProto, keep_input: int = 0) -> None:
        """Remove a single-path node: its consumers (and graph output) read its input instead."""
        src, out = node.input[keep_input], node.output[0]
        if self.is_graph_output(out):
            blocked = (src in self.input_names or self.initializer(src) is not None
                       or self.is_graph_output(src) or self.producer(src) is None)
            if blocked:
                raise SurgeryError(f"cannot remove node {node.name or node.op_type!r}: its input "
                                   f"{src!r} is a graph input, output or constant and its output "
                                   f"{out!r} is a graph output")
            self.remove(node)
            self.rename(src, out)
            return
        self.remove(node)
        self.replace_uses(out, src)

    # -- shapes ----------------------------------------------------------------------------------
    def freeze_shapes(self) -> None:
        """Keep answering with the current shapes while nodes are replaced (until ``thaw``)."""
        self._frozen = self.infer()

    def thaw_shapes(self) -> None:
        self._frozen = None
        self.touch()

    def infer(self) -> dict[str, tuple[int, list]]:
        """Tensor name -> (elem_type, dims) from shape inference; dims hold ints or None."""
        if self._frozen is not None:
            return self._frozen
        if self._shapes is None:
            self._shapes = infer_types(self.model)
        return self._shapes

    def shape(self, name: str) -> list[int] | None:
        """The static shape of a tensor, or None when any dim is unknown."""
        const = self.constant(name)
        if const is not None:
            return list(const.shape)
        entry = self.infer().get(name)
        if entry is None or entry[1] is None or any(d is None for d in entry[1]):
            return None
        return list(entry[1])

    def static_shape(self, name: str, node: onnx.NodeProto) -> list[int]:
        shape = self.shape(name)
        if shape is None:
            raise SurgeryError(f"the shape of {name!r} (at node {node.name!r}) is not known",
                               hint="fix the input shapes in model.inputs and run fold_constants first")
        return shape

    def elem_type(self, name: str) -> int:
        const = self.constant(name)
        if const is not None:
            return onnx.helper.np_dtype_to_tensor_dtype(const.dtype)
        entry = self.infer().get(name)
        return entry[0] if entry else onnx.TensorProto.UNDEFINED

    def set_output_shape(self, name: str, shape: list[int] | None) -> None:
        for out in self.graph.output:
            if out.name == name:
                out.type.tensor_type.ClearField("shape")
                if shape is not None:
                    out.type.tensor_type.shape.SetInParent()
                    for dim in shape:
                        out.type.tensor_type.shape.dim.add().dim_value = dim

    # -- cleaning up -----------------------------------------------------------------------------
    def prune(self) -> list[onnx.NodeProto]:
        """Remove nodes none of whose outputs is used; return them."""
        removed = []
        while True:
            used = {name for node in self.graph.node
                    for name in list(node.input) + subgraph_inputs(node)} | set(self.output_names)
            dead = [n for n in self.graph.node if not any(o in used for o in n.output if o)]
            if not dead:
                return removed
            removed.extend(dead)
            self.remove(*dead)

    def drop_unused_initializers(self) -> None:
        used = {name for node in self.graph.node for name in node.input} | set(self.output_names)
        used |= {name for node in self.graph.node for name in subgraph_inputs(node)}
        dead = {t.name for t in self.graph.initializer if t.name not in used}
        if not dead:
            return
        # delete in place: rebuilding the list would copy every kept weight (seconds for GBs)
        for index in reversed([i for i, t in enumerate(self.graph.initializer) if t.name in dead]):
            del self.graph.initializer[index]
        for index in reversed([i for i, v in enumerate(self.graph.input) if v.name in dead]):
            del self.graph.input[index]
        self.touch()

    def finish(self, *, prune: bool = True) -> onnx.ModelProto:
        """Order the nodes, drop what no output needs, refresh shapes; return the new model."""
        if prune:
            self.prune()
        self.drop_unused_initializers()
        toposort(self.graph)
        self.graph.ClearField("value_info")
        try:
            inferred = onnx.shape_inference.infer_shapes(skeleton(self.model), data_prop=True)
            self.graph.value_info.extend(inferred.graph.value_info)
            for mine, theirs in zip(self.graph.output, inferred.graph.output):
                if not mine.type.tensor_type.HasField("shape"):  # declare what is now known
                    mine.type.CopyFrom(theirs.type)
        except Exception:  # the stage's strict check reports it with context
            pass
        return self.model


def infer_types(model: onnx.ModelProto) -> dict[str, tuple[int, list | None]]:
    """Name -> (elem_type, dims) for every value shape inference can type."""
    bare = skeleton(model, keep_value_info=False)
    try:
        inferred = onnx.shape_inference.infer_shapes(bare, data_prop=True)
    except Exception:
        inferred = bare
    table = {}
    graph = inferred.graph
    for value in list(graph.input) + list(graph.value_info) + list(graph.output):
        ttype = value.type.tensor_type
        dims = None
        if ttype.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in ttype.shape.dim]
        table[value.name] = (ttype.elem_type, dims)
    for tensor in graph.initializer:
        table[tensor.name] = (tensor.data_type, list(tensor.dims))
    return table


def skeleton(model: onnx.ModelProto, max_elements: int = 4096, *,
             keep_value_info: bool = True) -> onnx.ModelProto:
    """A copy for shape inference: large initializers become typed graph inputs (inference
    reads the same shapes, and the small constants it propagates, without copying weights) and
    nodes are in topological order. Without ``keep_value_info`` the old inferred shapes are
    dropped too (they may be stale)."""
    light = onnx_io.skeleton(model, max_elements)
    light.ir_version = max(model.ir_version, 4)
    if not keep_value_info:
        del light.graph.value_info[:]
    toposort(light.graph)
    return light


def toposort(graph: onnx.GraphProto) -> None:
    """Order nodes so each comes after the producers of its inputs (stable otherwise)."""
    nodes = list(graph.node)
    produced_by = {}
    for i, node in enumerate(nodes):
        for name in node.output:
            produced_by[name] = i
    order, state = [], [0] * len(nodes)
    for start in range(len(nodes)):
        stack = [(start, False)]
        while stack:
            i, done = stack.pop()
            if done:
                state[i] = 2
                order.append(i)
                continue
            if state[i]:
                continue
            state[i] = 1
            stack.append((i, True))
            deps = [produced_by[n] for n in list(nodes[i].input) + subgraph_inputs(nodes[i])
                    if n in produced_by]
            stack.extend((d, False) for d in reversed(deps) if state[d] == 0)
    graph.ClearField("node")
    graph.node.extend(nodes[i] for i in order)


def subgraph_inputs(node: onnx.NodeProto) -> list[str]:
    """Outer-scope names read by the subgraphs of If/Loop/Scan nodes."""
    names = []
    for attr in node.attribute:
        for sub in ([attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)):
            for inner in sub.node:
                names.extend(inner.input)
                names.extend(subgraph_inputs(inner))
    return names


def node_label(node: onnx.NodeProto) -> str:
    """A node's name, or ``OpType(outputs)`` for an unnamed node."""
    return node.name or f"{node.op_type}({', '.join(node.output)})"


def unique_name(hint: str, taken: set[str]) -> str:
    """``hint``, or ``hint_<i>`` with the first ``i`` not in ``taken``."""
    if hint not in taken:
        return hint
    i = 1
    while f"{hint}_{i}" in taken:
        i += 1
    return f"{hint}_{i}"


def suggest(name: str, known: list[str]) -> str:
    return did_you_mean(name, known, n=3)
