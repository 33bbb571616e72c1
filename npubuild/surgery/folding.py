"""``fold_constants``: constant folding, shape-op simplification, no-op and dead-node removal.

Once import has fixed the input shapes, every Shape/Size of a tensor has a known value, and the
anchor and stride code of detection heads (Shape → Gather → Range → Expand → ConstantOfShape …)
computes constants. Rounds repeat until nothing changes: replace Shape/Size of static tensors
by constants, evaluate every node whose inputs are all constant with ONNX Runtime (the reference
evaluator when ORT cannot), replace an ``If`` whose condition is then constant by the nodes of the
branch it takes (Silero VAD decides its decoder by a shape: left as control flow, all of it ran
on the CPU), remove no-op nodes, drop what no output needs.
"""

from __future__ import annotations

import lazy_loader as lazy
from pydantic import Field

from npubuild.engine.hashing import sha256_array
from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.surgery import StepArgs, SurgeryError, rewrite
from npubuild.surgery.graph import Editor, unique_name, subgraph_inputs
from npubuild.surgery.opsets import attr

np = lazy.load("numpy")
onnx = lazy.load("onnx")

NONDETERMINISTIC = {"RandomNormal", "RandomUniform", "RandomNormalLike", "RandomUniformLike",
                    "Multinomial", "Bernoulli"}


class FoldConstantsArgs(StepArgs):
    """Arguments of ``fold_constants``."""

    size_limit_mb: float | None = Field(
        None, gt=0, description="Do not fold a node whose values grow the model by more than "
                                "this many MiB (a value replacing weights only its node read, a "
                                "transposed weight, does not grow it; default: no limit; "
                                "weights computed by ConstantOfShape/Tile fold too).")
    remove_noops: bool = Field(
        True, description="Also remove Identity, inference-mode Dropout, Cast to the same type, "
                          "Reshape/Expand to the same shape, identity Transpose, one-input Concat "
                          "(a Concat's inputs of no elements dropped first); "
                          "a Transpose that moves only size-1 axes becomes a Reshape, and a "
                          "Reshape of a Reshape reads the first one's input.")
    max_rounds: int = Field(8, ge=1, description="Stop after this many fold rounds.")


@rewrite("fold_constants", FoldConstantsArgs)
def fold_constants(model: onnx.ModelProto, args: FoldConstantsArgs) -> onnx.ModelProto:
    """Fold constant subgraphs and shape arithmetic; remove no-ops and dead nodes."""
    ed = Editor(model, "fold_constants")
    limit = None if args.size_limit_mb is None else int(args.size_limit_mb * 2**20)
    for _ in range(args.max_rounds):
        changed = bool(fold_shape_reads(ed))
        changed |= fold_constant_nodes(ed, limit)
        changed |= bool(inline_decided_ifs(ed))
        if args.remove_noops:
            changed |= _transposes_of_unit_axes_to_reshapes(ed) | _collapse_reshape_chains(ed)
            changed |= _drop_empty_concat_inputs(ed)
            changed |= _remove_noops(ed)
        changed |= bool(ed.prune())
        if not changed:
            break
    return ed.finish()


def fold_shape_reads(ed: Editor) -> set[str]:
    """Shape and Size of tensors whose shape is static become initializers; their names."""
    folded = set()
    for node in list(ed.graph.node):
        if node.op_type not in ("Shape", "Size") or ed.is_graph_output(node.output[0]):
            continue
        shape = ed.shape(node.input[0])
        if shape is None:
            continue
        if node.op_type == "Size":
            value = np.array(int(np.prod(shape)), np.int64)
        else:
            rank = len(shape)
            start, end = attr(node, "start", 0), attr(node, "end", rank)
            value = np.array(shape[_clamp(start, rank):_clamp(end, rank)], np.int64)
        ed.remove(node)
        ed.set_initializer(node.output[0], value)
        folded.add(node.output[0])
    return folded


def inline_decided_ifs(ed: Editor) -> int:
    """Replace each ``If`` whose condition is a constant by the nodes of the branch it takes
    (renamed apart from every name in the model); how many were replaced. Exact: the same ops
    run on the same values."""
    count = 0
    for node in list(ed.graph.node):
        if node.op_type != "If" or node.domain not in STANDARD_DOMAINS:
            continue
        cond = ed.constant(node.input[0])
        if cond is None or cond.size != 1:
            continue
        taken = "then_branch" if bool(cond.reshape(-1)[0]) else "else_branch"
        _inline_branch(ed, node, next(a.g for a in node.attribute if a.name == taken))
        count += 1
    return count


def _inline_branch(ed: Editor, node: onnx.NodeProto, branch: onnx.GraphProto) -> None:
    taken = _all_names(ed.graph)
    node_names = {n.name for n in ed.graph.node}
    renamed = {}
    for name in [t.name for t in branch.initializer] + [o for n in branch.node for o in n.output]:
        if name:
            renamed[name] = unique_name(name, taken)
            taken.add(renamed[name])
    for tensor in branch.initializer:
        copy = onnx.TensorProto()
        copy.CopyFrom(tensor)
        copy.name = renamed[tensor.name]
        ed.graph.initializer.append(copy)
    for inner in branch.node:
        copy = onnx.NodeProto()
        copy.CopyFrom(inner)
        copy.name = unique_name(inner.name or f"{node.name}/{inner.op_type}", node_names)
        node_names.add(copy.name)
        _rename_reads(copy, renamed)
        copy.output[:] = [renamed.get(o, o) for o in copy.output]
        ed.graph.node.append(copy)
    for result, value in zip(node.output, branch.output):
        if result:  # the If's output, now written by an Identity of the branch's value
            ed.graph.node.append(onnx.helper.make_node(
                "Identity", [renamed.get(value.name, value.name)], [result],
                name=unique_name(f"{node.name or 'If'}/{result}", node_names)))
    ed.remove(node)


def _rename_reads(node: onnx.NodeProto, renamed: dict[str, str]) -> None:
    node.input[:] = [renamed.get(i, i) for i in node.input]
    for attribute in node.attribute:  # nested branches read the inlined names from outside
        for sub in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs):
            for inner in sub.node:
                _rename_reads(inner, renamed)


def _all_names(graph: onnx.GraphProto) -> set[str]:
    names = {v.name for v in [*graph.input, *graph.output, *graph.initializer]}
    for node in graph.node:
        names.update(node.input)
        names.update(node.output)
        for attribute in node.attribute:
            for sub in ([attribute.g] if attribute.type == onnx.AttributeProto.GRAPH else attribute.graphs):
                names |= _all_names(sub)
    names.discard("")
    return names


def _clamp(index: int, rank: int) -> int:
    return max(0, min(rank, index + rank if index < 0 else index))


def _foldable(ed: Editor, node: onnx.NodeProto, constant: set[str]) -> bool:
    if node.domain not in STANDARD_DOMAINS or node.op_type in NONDETERMINISTIC:
        return False
    if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
        return False
    if any(ed.is_graph_output(o) for o in node.output):
        return False
    if not node.input and node.op_type != "Constant":
        return False
    return all(not name or name in constant for name in node.input)


def constant_nodes(ed: Editor) -> list[onnx.NodeProto]:
    """The nodes that compute on constants only (through other such nodes), in graph order:
    what `fold_constant_nodes` evaluates."""
    constant = {t.name for t in ed.graph.initializer if not ed.overridable(t.name)}
    batch = []
    for node in ed.graph.node:  # graph order is topological
        if _foldable(ed, node, constant):
            batch.append(node)
            constant.update(o for o in node.output if o)
    return batch


def fold_constant_nodes(ed: Editor, limit: int | None) -> bool:
    """Evaluate every node whose inputs are all constant; keep the values other nodes read
    (a node whose values grow the model by more than ``limit`` bytes stays computed: a value
    that replaces the weights only its node read, a transposed weight, does not grow it);
    whether anything folded."""
    batch = constant_nodes(ed)
    if not batch:
        return False
    values = evaluate(ed, batch, _frontier(ed, batch))
    freed = _freed_bytes(ed, batch) if limit is not None else {}
    kept = [n for n in batch if limit is not None and sum(
        values[o].nbytes for o in n.output if o in values) - freed[id(n)] > limit]
    drop = [n for n in batch if n not in kept]
    if not drop:
        return False
    needed = _frontier(ed, drop)  # what the kept nodes read too
    if kept:
        values = evaluate(ed, batch, needed)
    ed.remove(*drop)
    held = _held_values(ed, [values[name] for name in needed])
    for name in needed:
        digest = sha256_array(values[name])
        twin = held.get(digest)
        if twin is not None and not ed.is_graph_output(name):
            ed.replace_uses(name, twin)  # a value the model holds already: read that one
            continue
        ed.set_initializer(name, values[name])
        held.setdefault(digest, name)
    return True


def _held_values(ed: Editor, values: list[np.ndarray]) -> dict[bytes, str]:
    """The initializers (not a graph input's default) of the dtype and shape of one of
    ``values``, by content digest: a folded value equal to one is read from it, not stored
    again (a layer applied several times reads one weight through a Transpose or an Identity
    per application; each folded alone, the model held it once per application)."""
    kinds = {(v.dtype.str, v.shape) for v in values}
    held: dict[bytes, str] = {}
    for tensor in ed.graph.initializer:
        if (onnx.helper.tensor_dtype_to_np_dtype(tensor.data_type).str, tuple(tensor.dims)) \
                not in kinds or ed.overridable(tensor.name):
            continue
        held.setdefault(sha256_array(onnx.numpy_helper.to_array(tensor)), tensor.name)
    return held


def _freed_bytes(ed: Editor, batch: list[onnx.NodeProto]) -> dict[int, int]:
    """Per node of ``batch``, the bytes of the initializers only it reads: folding it drops them."""
    readers: dict[str, int] = {}
    for node in ed.graph.node:
        for name in {*node.input, *subgraph_inputs(node)}:
            readers[name] = readers.get(name, 0) + 1
    sizes = {t.name: int(np.prod(t.dims, dtype=np.int64))
             * onnx.helper.tensor_dtype_to_np_dtype(t.data_type).itemsize
             for t in ed.graph.initializer}
    return {id(node): sum(sizes[name] for name in set(node.input)
                          if name in sizes and readers.get(name) == 1
                          and not ed.is_graph_output(name))
            for node in batch}


def _frontier(ed: Editor, batch: list[onnx.NodeProto]) -> list[str]:
    """The outputs of ``batch`` that a node outside it (or the graph's outputs) reads."""
    ids = {id(n) for n in batch}
    readers = {name for node in ed.graph.node if id(node) not in ids
               for name in list(node.input) + subgraph_inputs(node)}
    return [name for node in batch for name in node.output
            if name and (name in readers or ed.is_graph_output(name))]


def evaluate(ed: Editor, nodes: list[onnx.NodeProto], outputs: list[str]) -> dict[str, np.ndarray]:
    """Run ``nodes`` (all inputs constant) and return ``outputs``; ORT first, then onnx's reference."""
    graph_inits = {name for node in nodes for name in node.input if name}
    inits = [t for t in ed.graph.initializer if t.name in graph_inits]
    types = ed.infer()
    value_infos = [onnx.helper.make_tensor_value_info(name, types.get(name, (0, None))[0] or 1, None)
                   for name in outputs]
    sub = onnx.helper.make_model(
        onnx.helper.make_graph(list(nodes), "fold", [], value_infos, inits),
        opset_imports=list(ed.model.opset_import), ir_version=max(ed.model.ir_version, 4))
    sub.functions.extend(ed.model.functions)
    try:
        from npubuild.onnx_io import run

        return run(sub, {}, outputs)
    except Exception as ort_error:  # e.g. an output type shape inference could not tell
        try:
            from onnx.reference import ReferenceEvaluator

            values = ReferenceEvaluator(sub).run(outputs, {})
            return {name: np.asarray(v) for name, v in zip(outputs, values)}
        except Exception as ref_error:
            raise SurgeryError(f"cannot evaluate the constant nodes "
                               f"{', '.join(n.name or n.op_type for n in nodes[:5])}...: "
                               f"ONNX Runtime said {ort_error}; the reference evaluator said "
                               f"{ref_error}") from None


def _transposes_of_unit_axes_to_reshapes(ed: Editor) -> bool:
    """A Transpose that keeps the order of its input's axes longer than 1 moves no data: a
    Reshape (tf2onnx leaves ``[1, C, 1, 1] -> [1, 1, 1, C]`` then a Reshape back before each
    squeeze-and-excite conv, depending on the order its optimizer visits nodes in)."""
    if ed.opset < 5:  # Reshape took its shape as an attribute
        return False
    found = []  # every shape read before the first edit: an edit forgets them
    for node in ed.graph.node:
        if node.op_type != "Transpose" or node.domain not in STANDARD_DOMAINS:
            continue
        perm, shape, out = attr(node, "perm"), ed.shape(node.input[0]), ed.shape(node.output[0])
        if perm is None or shape is None or out is None or list(perm) == sorted(perm):
            continue
        moved = [axis for axis in perm if shape[axis] != 1]
        if moved == sorted(moved):
            found.append((node, out))
    for node, out in found:
        target = ed.add_initializer(np.array(out, np.int64), f"{node.name or 'transpose'}_shape")
        node.op_type = "Reshape"
        del node.attribute[:]
        node.input.append(target)
    if found:  # an edit forgets the shapes: none, no shape inference again
        ed.touch()
    return bool(found)


def _collapse_reshape_chains(ed: Editor) -> bool:
    """``Reshape(Reshape(x, s1), s2)`` is ``Reshape(x, s2)`` when ``s2`` is a constant without
    0 (a 0 copies a dim of the Reshape's own input); the first one goes if nothing else reads it."""
    changed = False
    for node in ed.graph.node:  # in order: a chain of three reads the first one's input
        if node.op_type != "Reshape" or node.domain not in STANDARD_DOMAINS:
            continue
        first = ed.producer(node.input[0])
        target = ed.constant(node.input[1]) if len(node.input) > 1 else None
        if first is None or first.op_type != "Reshape" or first.domain not in STANDARD_DOMAINS:
            continue
        if target is None or np.any(target == 0):
            continue
        node.input[0] = first.input[0]
        changed = True
    if changed:
        ed.touch()
    return changed


def _drop_empty_concat_inputs(ed: Editor) -> bool:
    """A Concat's inputs of no elements add nothing to its output: they go, while one input
    with elements stays (a PyTorch head concatenating an empty ``[1, 0, 1]`` product of its
    unused branch; the chip has no place for a tensor of no elements, so the Concat ran on
    the CPU as one node between NPU parts). A Concat left with one input is a no-op."""
    found = []  # every shape read before the first edit: an edit forgets them
    for node in ed.graph.node:
        if node.op_type != "Concat" or node.domain not in STANDARD_DOMAINS or len(node.input) < 2:
            continue
        shapes = [ed.shape(name) if name else None for name in node.input]
        empty = [i for i, shape in enumerate(shapes) if shape is not None and 0 in shape]
        if empty and len(empty) < len(node.input) and all(
                shapes[i] is not None and 0 not in shapes[i]
                for i in range(len(node.input)) if i not in empty):
            found.append((node, empty))
    for node, empty in found:
        kept = [name for i, name in enumerate(node.input) if i not in empty]
        del node.input[:]
        node.input.extend(kept)
    if found:
        ed.touch()
    return bool(found)


def _remove_noops(ed: Editor) -> bool:
    changed = False
    for node in list(ed.graph.node):
        if _is_noop(ed, node):
            try:
                ed.bypass(node)
            except SurgeryError:  # joins a graph input to a graph output: keep it
                continue
            changed = True
    return changed


def _is_noop(ed: Editor, node: onnx.NodeProto) -> bool:
    op = node.op_type
    if node.domain not in STANDARD_DOMAINS or not node.input:
        return False
    if op == "Identity":
        return True
    if op == "Dropout":
        unused_mask = len(node.output) < 2 or not node.output[1] or not (
            ed.consumers(node.output[1]) or ed.is_graph_output(node.output[1]))
        training = len(node.input) > 2 and node.input[2] and bool(np.any(ed.constant(node.input[2])))
        return unused_mask and not training
    if op == "Cast":
        return ed.elem_type(node.input[0]) == attr(node, "to")
    if op in ("Reshape", "Expand"):
        before, after = ed.shape(node.input[0]), ed.shape(node.output[0])
        return before is not None and before == after
    if op == "Transpose":
        perm = attr(node, "perm")
        return perm is not None and list(perm) == sorted(perm)
    if op == "Concat":
        return len(node.input) == 1
    return False
