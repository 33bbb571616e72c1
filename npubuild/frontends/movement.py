"""Data movement by constant indices, written as the Slices (and a Concat) the chips run.

The chips run no Gather and no reversal, but they run Slice, Squeeze and Concat. Where the
indices are constants the same elements move either way, so import rewrites (bit-identical,
proven by the import stage):

- a Gather of a computed tensor by a constant index (PyTorch's ``select`` splitting attention's
  packed q, k and v; ``x[:, [2, 1, 0]]`` swapping colour channels): one Slice per run of
  consecutive ascending indices, a Concat of the runs where there are several, and a Squeeze of
  the axis for a scalar index;
- a full reversal along one axis: a ReverseSequence whose constant lengths are all the axis
  (tf2onnx's ``tf.reverse``, a Keras Bidirectional RNN's backward direction): the Gather of
  the reversed indices.

- a ScatterND of constant indices that writes one block of consecutive positions along one
  axis, whole along the others, in order (a streaming model's cache update, ``cache[0] = x``
  or ``buf[:, :, :2] = x``, as PyTorch exports index assignment: GTCRN's 18): the Concat of
  the data's Slices before and after the block with the updates between them.

- a Split that cuts a Concat, read by it alone (through one Transpose at most), back into
  exactly the Concat's parts (an end-to-end YOLO head's boxes [1, 4, N] and class scores
  [1, 3, N], joined, transposed and split again for its TopK): each part (transposed). Joined,
  the two share one tensor and, on the chips, one int8 scale: isbnx's boxes span 0 .. 1,280
  pixels, so one step is 5 and every score in 0 .. 1 rounded to 0.

Where every reader of such a move is itself a Slice along the moved axis (an unrolled loop
reading one step of a reversed sequence), each reader takes its own indices of the move
directly and the move disappears: a reversal read step by step is the same steps in the
other order. A Slice of negative step (PyTorch's ``flip``) is such a move too, rewritten only
where its readers take it over (the chips' Slice runs a negative step itself). The table
lookup of an embedding (a Gather of a constant) stays.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import onnx

from npubuild import onnx_io
from npubuild.onnx_io import STANDARD_DOMAINS
from npubuild.surgery.graph import Editor
from npubuild.surgery.opsets import (attr, make_axes_node, make_reshape, make_slice, slice_spec,
                                     split_sizes)

MIN_GATHER_AS_SLICE_OPSET = 10  # Slice takes its starts and ends as inputs from here
# A Gather by an index of several axes is a Slice per run of its flattened index: an unfold
# of a few windows (GTCRN's 3) is a few Slices, but a signal framed into hundreds of
# overlapping windows (BirdNET's two STFT framings, 511 windows each: 1,030 Slices) made a
# graph five times larger, its worst sample 0.9981 -> 0.9942 and its quantize 5x longer than
# the one Gather on the CPU did; so such a Gather is written out only up to this many runs.
MAX_INDEX_AXES_RUNS = 32


@dataclass(frozen=True)
class Move:
    """A node that only picks ``indices`` of its input along ``axis`` (``scalar``: and drops
    that axis, as a Gather by a 0-d index does)."""

    source: str
    axis: int
    indices: tuple[int, ...]
    scalar: bool = False
    kind: str = "gathers"  # the figure it counts in: "gathers" or "reversals"
    index_shape: tuple[int, ...] | None = None  # a Gather's index of 2 or more axes: its shape


def constant_moves_as_slices(model: onnx.ModelProto) -> tuple[onnx.ModelProto, dict[str, int]]:
    """``model`` with each constant-index move (module doc) written as Slices, a Concat and a
    Squeeze, and how many of each kind were rewritten; ``model`` itself and {} when there is
    none."""
    if onnx_io.opset_of(model) < MIN_GATHER_AS_SLICE_OPSET:
        return model, {}
    ed = Editor(model, "constant moves as slices")
    moves = {id(n): m for n in ed.graph.node if (m := _move(ed, n)) is not None}
    scatters = {n.output[0]: b for n in ed.graph.node  # by output: removing moves the nodes
                if (b := _scattered_block(ed, n)) is not None}
    undone = [u for n in ed.graph.node if (u := _undone_concat(ed, n)) is not None]
    if not moves and not scatters and not undone:
        return model, {}
    rewritten: list[tuple[onnx.NodeProto, Move]] = []
    counts: dict[str, int] = {}
    for node in list(ed.graph.node):
        move = moves.get(id(node))
        if move is None:
            continue
        windows = _windows(ed, node, move)
        if windows is None and node.op_type == "Slice":
            continue  # the chips' Slice takes a negative step: only its readers gain
        counts[move.kind] = counts.get(move.kind, 0) + 1
        if windows is None:
            rewritten.append((node, move))
            continue
        # read only through Slices of the moved axis: each reader moves its own indices
        ed.remove(node)
        for reader, (start, end) in windows:
            rewritten.append((reader, Move(move.source, move.axis, move.indices[start:end])))
    ed.remove(*(node for node, _ in rewritten))
    for node, move in rewritten:
        _as_slices(ed, move, node.output[0], node.name or node.output[0])
    for out, block in scatters.items():
        found = next(n for n in ed.graph.node if n.output and n.output[0] == out)
        node = onnx.NodeProto()
        node.CopyFrom(found)  # removing it from the graph invalidates it
        ed.remove(found)
        _block_as_concat(ed, node, block)
        counts["scatters"] = counts.get("scatters", 0) + 1
    for cut in undone:  # by tensor names: removing nodes invalidates the nodes held
        ed.remove(*(ed.producer(t) for t in (cut.outputs[0], *cut.between)))
        _parts_for_split(ed, cut)
        counts["concat_splits"] = counts.get("concat_splits", 0) + 1
    return ed.finish(prune=False), dict(sorted(counts.items()))


@dataclass(frozen=True)
class UndoneConcat:
    """A Split that cuts a Concat back into its ``parts``: its ``outputs``, the outputs of the
    Concat and of the Transpose between (``between``) and that Transpose's ``perm``."""

    name: str
    outputs: tuple[str, ...]
    between: tuple[str, ...]
    parts: tuple[str, ...]
    perm: tuple[int, ...] | None


def _undone_concat(ed: Editor, split: onnx.NodeProto) -> UndoneConcat | None:
    """Where ``split`` cuts a Concat, read by nothing else (through one Transpose at most),
    back into exactly its parts (module doc); else None."""
    if split.op_type != "Split" or split.domain not in STANDARD_DOMAINS:
        return None
    node, transpose, perm = ed.producer(split.input[0]), None, None
    if node is not None and node.op_type == "Transpose" and node.domain in STANDARD_DOMAINS:
        transpose, perm = node, list(attr(node, "perm") or [])
        node = ed.producer(node.input[0]) if perm and _read_once(ed, node) else None
    if node is None or node.op_type != "Concat" or node.domain not in STANDARD_DOMAINS \
            or not _read_once(ed, node) or not all(node.input):
        return None
    shape, parts = ed.shape(node.output[0]), [ed.shape(p) for p in node.input]
    if shape is None or any(p is None or len(p) != len(shape) for p in parts):
        return None
    axis, split_axis = attr(node, "axis") % len(shape), attr(split, "axis", 0) % len(shape)
    if (perm[split_axis] if perm else split_axis) != axis or len(split.output) != len(parts):
        return None
    if split_sizes(ed, split, shape[axis]) != [p[axis] for p in parts]:
        return None
    between = (node.output[0], *((transpose.output[0],) if transpose is not None else ()))
    return UndoneConcat(split.name or split.output[0], tuple(split.output), between,
                        tuple(node.input), tuple(perm) if perm else None)


def _read_once(ed: Editor, node: onnx.NodeProto) -> bool:
    return len(ed.consumers(node.output[0])) == 1 and not ed.is_graph_output(node.output[0])


def _parts_for_split(ed: Editor, cut: UndoneConcat) -> None:
    """Each of the Split's outputs computed from its part: transposed as the whole was, or the
    part itself (its readers read it; a graph output gets an Identity)."""
    for part, out in zip(cut.parts, cut.outputs):
        if not out:
            continue
        if cut.perm:
            ed.make_node("Transpose", [part], [out], f"{cut.name}/part", perm=list(cut.perm))
        elif ed.is_graph_output(out):
            ed.make_node("Identity", [part], [out], f"{cut.name}/part")
        else:
            ed.replace_uses(out, part)


def _scattered_block(ed: Editor, node: onnx.NodeProto) -> tuple[int, int, int] | None:
    """``(axis, start, end)`` when ``node`` is a ScatterND (no reduction) of constant indices
    that writes positions ``[start, end)`` of ``axis`` and every position of the other indexed
    axes, the updates in the data's order; else None."""
    if (node.op_type != "ScatterND" or node.domain not in STANDARD_DOMAINS
            or len(node.input) != 3 or attr(node, "reduction", b"none") not in (b"none", "none")):
        return None
    shape, index = ed.shape(node.input[0]), ed.constant(node.input[1])
    if shape is None or index is None or index.ndim < 1 or not 0 < index.shape[-1] <= len(shape):
        return None
    depth = index.shape[-1]
    points = index.reshape(-1, depth).astype(np.int64) % np.array(shape[:depth], np.int64)
    if len(points) == 0:
        return None
    lows, highs = points.min(0), points.max(0) + 1
    partial = [k for k in range(depth) if (lows[k], highs[k]) != (0, shape[k])]
    if len(partial) > 1:
        return None
    axis = partial[0] if partial else 0
    box = [range(lows[k], highs[k]) for k in range(depth)]
    grid = np.stack(np.meshgrid(*box, indexing="ij"), -1).reshape(-1, depth)
    if grid.shape != points.shape or not np.array_equal(grid, points):
        return None  # not every position of the block once, in order
    return axis, int(lows[axis]), int(highs[axis])


def _block_as_concat(ed: Editor, node: onnx.NodeProto, block: tuple[int, int, int]) -> None:
    """The ScatterND ``node`` of `_scattered_block` as the Concat along its axis of the data
    before the block, the updates (Reshaped to the block where their shape differs) and the
    data after it."""
    axis, start, end = block
    data, _, updates = node.input
    shape, out = ed.shape(data), node.output[0]
    base = node.name or out
    block_shape = [*shape[:axis], end - start, *shape[axis + 1:]]
    if ed.shape(updates) != block_shape:
        reshaped = ed.unique_tensor(f"{out}/block")
        make_reshape(ed, updates, reshaped, block_shape, f"{base}/as_block")
        updates = reshaped
    pieces = []
    for label, (lo, hi) in (("before", (0, start)), ("after", (end, shape[axis]))):
        if hi > lo:
            piece = ed.unique_tensor(f"{out}/{label}")
            make_slice(ed, data, piece, [(axis, lo, hi, 1)], f"{base}/{label}")
            pieces.append((label, piece))
    parts = [p for label, p in pieces if label == "before"] + [updates] + \
        [p for label, p in pieces if label == "after"]
    if len(parts) == 1:
        ed.make_node("Identity", parts, [out], f"{base}/whole")
    else:
        ed.make_node("Concat", parts, [out], f"{base}/concat", axis=axis)


def _move(ed: Editor, node: onnx.NodeProto) -> Move | None:
    if node.domain not in STANDARD_DOMAINS or not node.input or ed.is_constant(node.input[0]):
        return None
    shape = ed.shape(node.input[0])
    if shape is None:
        return None
    if node.op_type == "Gather" and len(node.input) == 2:
        index = ed.constant(node.input[1])
        axis = attr(node, "axis", 0) % len(shape)
        if index is None or index.size == 0:
            return None
        size = shape[axis]
        flat = [int(i) + size if i < 0 else int(i) for i in index.reshape(-1)]
        if not all(0 <= i < size for i in flat):
            return None  # ONNX Runtime's error is the user's, not a rewrite's
        if index.ndim > 1 and len(_runs(tuple(flat))) > MAX_INDEX_AXES_RUNS:
            return None
        return Move(node.input[0], axis, tuple(flat), scalar=index.ndim == 0,
                    index_shape=tuple(index.shape) if index.ndim > 1 else None)
    if node.op_type == "ReverseSequence" and len(node.input) == 2:
        axis = attr(node, "time_axis", 0) % len(shape)
        lengths = ed.constant(node.input[1])
        if lengths is None or not np.all(lengths == shape[axis]):
            return None
        return Move(node.input[0], axis, tuple(range(shape[axis] - 1, -1, -1)), kind="reversals")
    if node.op_type == "Slice":
        spec = slice_spec(ed, node, len(shape))
        if spec is None or len(spec) != 1 or spec[0][3] >= 0:
            return None
        axis, start, end, step = spec[0]
        return Move(node.input[0], axis, _picked(start, end, step, shape[axis]), kind="reversals")
    return None


def _picked(start: int, end: int, step: int, size: int) -> tuple[int, ...]:
    """The indices ONNX's Slice picks along an axis of ``size`` (its clamping, not Python's)."""
    start, end = (v + size if v < 0 else v for v in (start, end))
    if step > 0:
        start, end = min(max(start, 0), size), min(max(end, 0), size)
    else:
        start, end = min(max(start, 0), size - 1), min(max(end, -1), size - 1)
    return tuple(range(start, end, step))


def _windows(ed: Editor, node: onnx.NodeProto, move: Move
             ) -> list[tuple[onnx.NodeProto, tuple[int, int]]] | None:
    """Each reader of the move with the positions ``[start, end)`` of its output it reads,
    when every reader is a Slice of the moved axis alone with step 1; else None."""
    out = node.output[0]
    readers = ed.consumers(out)
    if move.scalar or move.index_shape or ed.is_graph_output(out) or not readers:
        return None
    rank = len(ed.shape(move.source))
    windows = []
    for reader in readers:
        spec = slice_spec(ed, reader, rank) if reader.op_type == "Slice" and \
            reader.domain in STANDARD_DOMAINS and reader.input[0] == out else None
        if spec is None or len(spec) != 1 or spec[0][0] != move.axis or spec[0][3] != 1:
            return None
        picked = _picked(spec[0][1], spec[0][2], 1, len(move.indices))
        if not picked:
            return None
        windows.append((reader, (picked[0], picked[-1] + 1)))
    return windows


def _runs(indices: tuple[int, ...]) -> list[tuple[int, int]]:
    """``indices`` as ``[start, end)`` runs of consecutive ascending positions."""
    runs: list[tuple[int, int]] = []
    for i in indices:
        if runs and runs[-1][1] == i:
            runs[-1] = (runs[-1][0], i + 1)
        else:
            runs.append((i, i + 1))
    return runs


def _as_slices(ed: Editor, move: Move, out: str, base: str) -> None:
    """Write ``out`` from ``move.source``: a Slice per run, a Concat of several, a Squeeze for
    a scalar index, a Reshape for an index of several axes (the Gather by it is the Gather by
    the flattened index, its axis then split into the index's: an unfold's windows, GTCRN's
    ``[3, 129]`` of overlapping runs)."""
    if move.index_shape:
        shape = list(ed.shape(move.source))
        flat = ed.unique_tensor(f"{out}/flat")
        _as_slices(ed, Move(move.source, move.axis, move.indices), flat, base)
        make_reshape(ed, flat, out, [*shape[:move.axis], *move.index_shape,
                                     *shape[move.axis + 1:]], f"{base}/index_axes")
        return
    runs = _runs(move.indices)
    axis = ed.add_initializer(np.array([move.axis], np.int64), f"{base}/axis")
    whole = len(runs) == 1 and not move.scalar
    pieces = [out] if whole else [ed.unique_tensor(f"{out}/slice{k}") for k in range(len(runs))]
    for k, ((start, end), piece) in enumerate(zip(runs, pieces)):
        label = "as_slice" if len(runs) == 1 else f"run{k}"
        bounds = [ed.add_initializer(np.array([v], np.int64), f"{base}/{label}_{key}")
                  for key, v in (("start", start), ("end", end))]
        ed.make_node("Slice", [move.source, *bounds, axis], [piece], f"{base}/{label}")
    if move.scalar:
        make_axes_node(ed, "Squeeze", [pieces[0]], [out], [move.axis], f"{base}/squeeze")
    elif not whole:
        ed.make_node("Concat", pieces, [out], f"{base}/concat", axis=move.axis)
