"""Additive attention masks written with a bounded value, so the scores they join quantize.

Transformer exports mask attention before its Softmax by adding a huge negative number to the
scores of the positions a query may not see: Hugging Face writes ``(1 - mask) ·
finfo(float32).min`` (-3.4e38) through Unsqueeze, Cast, Sub and Mul; older exports -10000 or
-1e9; others ``Where(mask, 0, NEG)``, a masked fill ``Where(masked, NEG, scores)``, or a
constant causal bias of 0 and NEG, or a learned bias table looked up by index whose padding
row is NEG (a Graphormer-style spatial encoding: ``Gather(table, distances)``, chython-rxnmap's
row 0 -inf). The Softmax gives such a position ``exp(s + NEG - max) = 0``,
which any value far enough below the row's maximum gives too; but the tensor that carries NEG
spans 3.4e38, which no int8 or int16 scale can share with scores that need hundredths, so the
quantizer kept those Adds in float on the CPU (paraphrase-MiniLM-L3-v2: three, one per layer).

`bounded_masks` writes each such constant (values below ``-MASK_BOUND``, at least one, and every
other value at least ``-MASK_BOUND / 2``: 0, or a position bias folded in, as T5's decoder's
causal mask plus its relative position bias, one constant [1, heads, T, T] once its length is
fixed) with minus its bound for those values, where it is the NEG operand of a Mul or
Where, the bias of an Add or the table a Gather reads, and what that node computes reaches
nothing but Softmax inputs:
through data movement (Reshape, Unsqueeze, Squeeze, Expand, Transpose, Flatten, Identity, a Cast
between float types, the selection and joining ops Slice, Gather, Tile and Concat: T5's encoder
adds its mask to the position bias through a Slice), further Adds (a causal bias plus a padding bias, position biases), a
Where's value branch, or a Max (exports that clamp the sum at finfo.min). No Mul or Div may lie
between: a scale would shrink the bound. ONNX Runtime's transformer optimizer reads the same
Mul/Sub/Cast/Unsqueeze path as its fused Attention's mask input, whose kernel masks with -10000
(``mask_filter_value``) whatever constant the export wrote: the value is the export's choice,
not the model's.

The bound is as small as the scores allow (`derived_bounds`), since the masked sum spans the
bound plus the scores and its int8 step is that over 255: at -256 about one logit, too coarse
for the kept scores. On the proof inputs, per constant, it is the smallest power of two (exact
in float16 and bfloat16 too) that puts every score it masks ``MASKED_MARGIN`` (16) below the
largest kept score of its Softmax row, at least 16 and at most ``MASK_BOUND`` (256; 256 where
it masks nothing on the proof inputs, which then say nothing of the scores): a masked
weight is then at most exp(-16) = 1.1e-7 of the largest kept one, about float32's rounding of
1, where the export's constant gave exactly 0. Import proves the result within the folding
tolerance, not bit for bit, and falls back to -256 where that fails (float32's ``exp`` is 0
below -104: exactly 0 wherever the kept scores lie within 152 of the row's maximum).
paraphrase-MiniLM-L3-v2: 32 on each of its 12 samples (on its proof input a masked score lies
at most 14.8 above its row's kept maximum; the proof differs by 6e-8 of the scale). A row with
no position kept differs: there ``finfo.min`` swamps every score and the export gives each
position 1/n, while the bounded mask shifts all scores alike and the row attends as if
unmasked (as ONNX Runtime's Attention kernel with its -10000 and Hugging Face's SDPA path,
`_unmask_unattended`, do); such a row gets ``MASK_BOUND``, the proof fails and import keeps the
model as it was.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping

import numpy as np
import onnx

from npubuild import onnx_io
from npubuild.fusions.graph import GraphView, attribute
from npubuild.surgery.graph import Editor

MASK_BOUND = 256.0  # the largest bound, and the least magnitude of a mask constant's values
MASKED_MARGIN = 16.0  # how far below its row's largest kept score a masked score must lie

# ops a mask's values pass through unchanged on their way to the Softmax, and the inputs that
# carry them (None: any)
PASSING = {"Reshape": (0,), "Unsqueeze": (0,), "Squeeze": (0,), "Expand": (0,), "Transpose": (0,),
           "Flatten": (0,), "Identity": (0,), "Cast": (0,), "Slice": (0,), "Gather": (0,),
           "Tile": (0,), "Concat": None, "Add": (0, 1), "Max": None, "Where": (1, 2)}
# ops that read a mask constant, and the inputs it may be: a Where's value branches, a Gather's
# table (the padding row of a bias looked up by index), either operand of a Mul or Add
MASK_READERS = {"Mul": (0, 1), "Add": (0, 1), "Where": (1, 2), "Gather": (0,)}
FLOAT_TYPES = {onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16,
               onnx.TensorProto.DOUBLE}


def bounded_masks(model: onnx.ModelProto, bounds: Mapping[str, float] | None = None
                  ) -> tuple[onnx.ModelProto, int]:
    """The model with each huge negative mask constant that reaches only Softmax inputs written
    as ``-bounds[name]`` (``-MASK_BOUND`` where ``bounds`` names none; see the module
    docstring), and how many constants it wrote; the model itself when there is none."""
    if not any(n.op_type == "Softmax" for n in model.graph.node):
        return model, 0
    view = GraphView(model)
    uses = mask_uses(view)
    if not uses:
        return model, 0
    edit = Editor(model, "bounded_masks")
    for constant, places in uses.items():
        limit = (bounds or {}).get(constant, MASK_BOUND)
        bounded = edit.add_initializer(bound(view.constant(constant), limit),
                                       constant + "/bounded")
        for index, slot in places:
            edit.graph.node[index].input[slot] = bounded
    edit.touch()
    return edit.finish(), len(uses)


def derived_bounds(model: onnx.ModelProto, feeds: Mapping[str, np.ndarray]) -> dict[str, float]:
    """Per mask constant (by name, in graph order): the smallest power of two that, on
    ``feeds``, puts every score it masks at least ``MASKED_MARGIN`` below the largest kept
    score of its Softmax row; at least ``MASKED_MARGIN``, at most ``MASK_BOUND``. The scores
    are the Softmax inputs with every mask constant written as 0; a position is masked by a
    constant where writing that one as 0 raises the Softmax input by more than half
    ``MASK_BOUND``; a row's largest kept score is its largest Softmax input as exported. A
    constant that masks no position of ``feeds`` gets ``MASK_BOUND`` (nothing to size it by),
    as does one with a row masked whole (which the proof then refuses). {} where the model has
    no such mask."""
    if not any(n.op_type == "Softmax" for n in model.graph.node):
        return {}
    view = GraphView(model)
    uses = mask_uses(view)
    if not uses:
        return {}
    reached = {c: sorted({name for index, _ in places
                          for name in softmax_inputs(view, view.nodes[index].output[0]) or ()})
               for c, places in uses.items()}
    inputs = sorted({name for names in reached.values() for name in names})

    def softmax_inputs_of(rewritten: onnx.ModelProto, names: list[str]) -> dict:
        return onnx_io.run(onnx_io.with_outputs(rewritten, names), feeds, names)

    exported = softmax_inputs_of(model, inputs)
    scores = softmax_inputs_of(bounded_masks(model, dict.fromkeys(uses, 0.0))[0], inputs)
    rows = softmax_rows(model)
    bounds = {}
    for constant, names in reached.items():
        alone = scores if len(uses) == 1 else \
            softmax_inputs_of(bounded_masks(model, {constant: 0.0})[0], names)
        spread = max((masked_spread(*(rows[n](v[n]) for v in (exported, alone, scores)))
                      for n in names), default=-np.inf)
        if spread == -np.inf:  # it masks nothing here: no scores to size it by
            bounds[constant] = MASK_BOUND
            continue
        needed = max(spread + MASKED_MARGIN, MASKED_MARGIN)
        bounds[constant] = float(min(2.0 ** np.ceil(np.log2(needed)), MASK_BOUND))
    return bounds


def masked_spread(exported: np.ndarray, alone: np.ndarray, scores: np.ndarray) -> float:
    """The largest (masked score - its row's largest exported value) over the Softmax rows
    (the last axis) where this mask masks a position (``alone``: the Softmax input with this
    mask written as 0, ``scores``: with every mask written as 0); -inf where none does."""
    with np.errstate(invalid="ignore", over="ignore"):
        masked = alone - exported > MASK_BOUND / 2
        masking = masked.any(axis=-1)
        if not masking.any():
            return -np.inf
        top = np.where(masked, scores, -np.inf).max(axis=-1) - exported.max(axis=-1)
        return float(np.nan_to_num(top[masking], nan=np.inf).max())


def softmax_rows(model: onnx.ModelProto) -> dict:
    """Per Softmax input: a function giving its values as float64 rows [rows, positions], one
    per normalisation (opset 13 on: along ``axis``, default -1; before: the values flattened
    from ``axis`` on, default 1)."""
    coerced = onnx_io.opset_of(model) < 13
    rows = {}
    for node in model.graph.node:
        if node.op_type != "Softmax":
            continue
        axis = attribute(node, "axis", 1 if coerced else -1)
        if coerced:
            rows[node.input[0]] = lambda v, a=axis: np.asarray(v, np.float64).reshape(
                int(np.prod(np.shape(v)[:a])), -1)
        else:
            rows[node.input[0]] = lambda v, a=axis: np.moveaxis(
                np.asarray(v, np.float64), a, -1).reshape(-1, np.shape(v)[a])
    return rows


def mask_uses(view: GraphView) -> dict[str, list[tuple[int, int]]]:
    """Each mask constant (by name, in graph order) and the (node index, input slot) pairs where
    a Mul, Where or Add reads it as a mask, or a Gather as the table it looks a mask up in,
    whose values reach only Softmax inputs."""
    uses: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for index, node in enumerate(view.nodes):
        if node.op_type not in MASK_READERS or node.domain not in ("", "ai.onnx"):
            continue
        slots = MASK_READERS[node.op_type]
        for slot in slots:
            name = node.input[slot] if slot < len(node.input) else ""
            if name and is_mask_constant(view.constant(name)) and \
                    softmax_inputs(view, node.output[0]) is not None:
                uses[name].append((index, slot))
    return dict(uses)


def is_mask_constant(value: np.ndarray | None) -> bool:
    """A float constant with values below ``-MASK_BOUND`` (at least one; -inf counts), the
    masked positions, and every other value finite and at least ``-MASK_BOUND / 2``: 0 in a
    mask alone, a relative position bias where export folded the two into one constant (T5's
    decoder: its causal mask plus its position bias, both constant at a fixed length)."""
    if value is None or value.dtype.kind != "f" or value.size == 0 or np.isnan(value).any():
        return False
    masked = value < -MASK_BOUND
    kept = value[~masked]
    return bool(masked.any()) and bool(np.all(np.isfinite(kept) & (kept >= -MASK_BOUND / 2)))


def bound(value: np.ndarray, limit: float = MASK_BOUND) -> np.ndarray:
    """``value`` (`is_mask_constant`) with every masked entry (below ``-MASK_BOUND``) written as
    ``-limit`` and the others as they are (a position bias folded in keeps its values), in its
    dtype."""
    return np.where(value < -MASK_BOUND, np.float64(-limit), value).astype(value.dtype)


def softmax_inputs(view: GraphView, tensor: str) -> list[str] | None:
    """The Softmax inputs (in graph order) where every path from ``tensor`` ends through ops
    that pass its values on unchanged (`PASSING`); None where one reaches a graph output or
    another op."""
    seen: set[str] = set()
    ends: set[str] = set()
    pending = [tensor]
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        if name in view.outputs or not view.consumers.get(name):
            return None
        for index in view.consumers[name]:
            node = view.nodes[index]
            if node.domain not in ("", "ai.onnx") or has_subgraphs(node):
                return None
            if node.op_type == "Softmax" and list(node.input) == [name]:
                ends.add(name)
                continue
            if not passes_on(node, name):
                return None
            pending.append(node.output[0])
    return [n.input[0] for n in view.nodes if n.op_type == "Softmax" and n.input[0] in ends]


def passes_on(node: onnx.NodeProto, name: str) -> bool:
    """Whether ``node`` hands the values it reads at ``name`` on unchanged (`PASSING`)."""
    if node.op_type not in PASSING:
        return False
    slots = PASSING[node.op_type]
    read_at = [i for i, t in enumerate(node.input) if t == name]
    if slots is not None and any(i not in slots for i in read_at):
        return False
    if node.op_type == "Cast":
        return attribute(node, "to") in FLOAT_TYPES
    return True


def has_subgraphs(node: onnx.NodeProto) -> bool:
    return any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS)
               for a in node.attribute)
