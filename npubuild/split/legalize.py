"""Convolutions the chip refuses for their kernel, dilation or padding, written as ones it runs.

A Conv whose kernel is longer along an axis than the chip's ``max_kernel`` (or not among its
``kernel_sizes``), whose dilation exceeds ``max_dilation`` or whose padding exceeds ``max_pad``
reads its input at tap offsets ``k·d`` (``k < K``). `legal_convs` writes it as

- the input padded explicitly by the conv's own pads along those axes (a chain of Pads of at
  most the chip's Pad ``max_pad`` each),
- one Slice per group of taps: the padded input shifted by the group's first offset,
- the slices stacked into channels (a Concat on the channel axis; with ``group > 1`` a Concat
  along H and a Reshape, so each channel's copies sit next to each other and groups stay
  contiguous),
- one Conv over the stack, unpadded along those axes, whose weights hold group ``c``'s taps
  in channel block ``c`` (taps past the kernel are zero).

A kernel too long is cut into ``n = ceil(K / max)`` groups of ``m = ceil(K / n)`` taps (the conv
keeps its dilation); a dilation too large gives one group per tap (kernel 1 along that axis);
padding alone too large gives one group, the whole kernel (the Pads and the conv, nothing else).
Every product is summed in the one conv's accumulator, so the int8 result is the original
conv's: no partial sum is requantized, and a Slice, Pad or Concat of one tensor keeps its scale.

A rewrite is kept only where every node it made passes the chip's checks (`node_reasons`, the
LMEM fit included), so the split places the whole rewrite on the NPU or leaves the conv as it
was; `split_model` proves the rewritten model against the original on the proof inputs.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass

import numpy as np
import onnx

from npubuild import backends
from npubuild.surgery.graph import Editor
from npubuild.surgery.opsets import attr, make_pad, make_reshape, make_slice
from npubuild.targets.constraints import effective_spec, node_reasons
from npubuild.targets.fit import lmem_reasons
from npubuild.targets.model import Chip
from npubuild.targets.view import GraphFacts, NodeView

REWRITE = "legal_conv_taps"


@dataclass(frozen=True)
class AxisPlan:
    """One spatial axis of the rewritten conv: the shift of each tap group in the padded
    input, the new kernel size and dilation, and which original tap each new tap is."""

    rewritten: bool
    shifts: tuple[int, ...]
    size: int
    dilation: int
    taps: tuple[tuple[int | None, ...], ...]   # taps[group][j] = original tap index or None


def legal_convs(model: onnx.ModelProto, chip: Chip, keep: set[str] = frozenset()
                ) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with every Conv the chip refuses for its kernel, dilation or padding (but
    those whose output is in ``keep``) rewritten as Pads, Slices, a Concat and one Conv the
    chip runs (module docstring); the names of the convs rewritten (an unnamed one is named
    after its output), in graph order ([] and ``model`` itself when none is)."""
    spec = effective_spec(chip, "Conv")
    if spec is None:
        return model, []
    ed = Editor(model, REWRITE)
    candidates = [n.output[0] for n in ed.graph.node
                  if n.output[0] not in keep and _too_big(ed, n, spec)]
    if not candidates:
        return model, []
    rewritten, made = _rewrite(model, candidates, chip)
    legal = _passing(rewritten, made, chip)
    if legal != candidates:
        rewritten, made = _rewrite(model, legal, chip) if legal else (model, {})
    return rewritten, [made[out][-1] for out in legal]


def _too_big(ed: Editor, node: onnx.NodeProto, spec) -> bool:
    if node.op_type != "Conv" or node.domain not in ("", "ai.onnx") or not node.output[0]:
        return False
    weight = ed.constant(node.input[1]) if len(node.input) > 1 else None
    x, y = ed.shape(node.input[0]), ed.shape(node.output[0])
    if weight is None or x is None or y is None or weight.ndim < 3:
        return False
    _, _, _, dilations, pads = _geometry(ed, node, weight)
    rank = weight.ndim - 2
    return any(_axis_needs(k, d, max(pads[a], pads[rank + a]), spec)
               for a, (k, d) in enumerate(zip(weight.shape[2:], dilations)))


def _axis_needs(k: int, d: int, pad: int, spec) -> bool:
    return (k > _max_kernel(spec) or (spec.kernel_sizes is not None and k not in spec.kernel_sizes)
            or (spec.max_dilation is not None and d > spec.max_dilation)
            or (spec.max_pad is not None and pad > spec.max_pad))


def _max_kernel(spec) -> int:
    bounds = [spec.max_kernel] if spec.max_kernel is not None else []
    bounds += [max(spec.kernel_sizes)] if spec.kernel_sizes else []
    return min(bounds, default=10 ** 9)


def _size_allowed(m: int, spec) -> int:
    """The smallest kernel size >= m the chip accepts."""
    if spec.kernel_sizes:
        return min((s for s in spec.kernel_sizes if s >= m), default=m)
    return m


def _passing(model: onnx.ModelProto, made: dict[str, list[str]], chip: Chip) -> list[str]:
    """The convs (by output, in ``made``'s order) every node of whose rewrite the chip runs,
    and fits in LMEM with int16 activations too: the precision search may widen the rewrite's
    tensors, and a stack of many one-channel copies (a constant-Q conv's 18 groups of 15 taps
    over a 10,973-sample row, all on one lane) that fits in int8 would then stop compile."""
    from npubuild.split.plan import infer

    inferred = infer(model)
    facts = GraphFacts.from_model(inferred)
    nodes = {n.name: n for n in inferred.graph.node}

    def runs(name: str) -> bool:
        view = NodeView(nodes[name], facts)
        return not node_reasons(view, chip) and not (
            backends.of(chip).plans_lmem and lmem_reasons(view, chip, act_bytes=2))

    return [out for out, names in made.items()
            if all(name in nodes and runs(name) for name in names)]


def _rewrite(model: onnx.ModelProto, outputs: list[str], chip: Chip
             ) -> tuple[onnx.ModelProto, dict[str, list[str]]]:
    """``model`` with the convs computing ``outputs`` rewritten; per output, the names of the
    nodes made (the conv last)."""
    ed = Editor(model, REWRITE)
    ed.freeze_shapes()
    spec = effective_spec(chip, "Conv")
    pad_spec = chip.ops.get("Pad")
    pad_limit = pad_spec.max_pad if pad_spec is not None and pad_spec.max_pad else None
    made = {}
    for output in outputs:
        made[output] = _rewrite_one(ed, ed.producer(output), spec, pad_limit)
    ed.thaw_shapes()
    return ed.finish(), made


def _geometry(ed: Editor, node: onnx.NodeProto, weight: np.ndarray):
    x, y = ed.shape(node.input[0]), ed.shape(node.output[0])
    rank = weight.ndim - 2
    strides = list(attr(node, "strides") or [1] * rank)
    dilations = list(attr(node, "dilations") or [1] * rank)
    pads = list(attr(node, "pads") or [0] * (2 * rank))
    auto = attr(node, "auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        totals = [max((o - 1) * s + (k - 1) * d + 1 - i, 0) for i, o, k, s, d
                  in zip(x[2:], y[2:], weight.shape[2:], strides, dilations)]
        small = [t // 2 for t in totals]
        big = [t - t // 2 for t in totals]
        pads = small + big if auto == "SAME_UPPER" else big + small
    elif auto == "VALID":
        pads = [0] * (2 * rank)
    return x, y, strides, dilations, pads


def _plan_axis(k: int, d: int, pad: int, spec) -> AxisPlan:
    if not _axis_needs(k, d, pad, spec):
        return AxisPlan(False, (0,), k, d, (tuple(range(k)),))
    if k <= _max_kernel(spec) and _size_allowed(k, spec) == k and not (
            spec.max_dilation is not None and d > spec.max_dilation):  # only the pads: explicit
        return AxisPlan(True, (0,), k, d, (tuple(range(k)),))
    if spec.max_dilation is not None and d > spec.max_dilation:  # one group per tap
        return AxisPlan(True, tuple(t * d for t in range(k)), 1, 1, tuple((t,) for t in range(k)))
    groups = math.ceil(k / _max_kernel(spec))
    m = _size_allowed(math.ceil(k / groups), spec)
    groups = math.ceil(k / m)
    taps = tuple(tuple(c * m + j if c * m + j < k else None for j in range(m))
                 for c in range(groups))
    return AxisPlan(True, tuple(c * m * d for c in range(groups)), m, d, taps)


def _rewrite_one(ed: Editor, conv: onnx.NodeProto, spec, pad_limit: int | None) -> list[str]:
    """Replace ``conv`` (module docstring); the names of the nodes made."""
    weight = ed.constant(conv.input[1])
    x, y, strides, dilations, pads = _geometry(ed, conv, weight)
    rank = weight.ndim - 2
    plans = [_plan_axis(k, d, max(pads[a], pads[rank + a]), spec)
             for a, (k, d) in enumerate(zip(weight.shape[2:], dilations))]
    # what each group reads of the padded input, per rewritten axis
    spans = [(y[2 + a] - 1) * strides[a] + (p.size - 1) * p.dilation + 1 for a, p in enumerate(plans)]
    begin = [pads[a] if p.rewritten else 0 for a, p in enumerate(plans)]
    end = [max(0, max(p.shifts) + spans[a] - (x[2 + a] + pads[a])) if p.rewritten else 0
           for a, p in enumerate(plans)]
    made: list[str] = []
    source = _pad_chain(ed, conv, conv.input[0], begin, end, pad_limit, made)
    padded = [x[2 + a] + begin[a] + end[a] for a in range(rank)]
    copies = []
    for index, shifts in enumerate(itertools.product(*(p.shifts for p in plans))):
        spec_ = [(2 + a, s, s + spans[a], 1) for a, (s, p) in enumerate(zip(shifts, plans))
                 if p.rewritten and (s, s + spans[a]) != (0, padded[a])]
        if not spec_:
            copies.append(source)
            continue
        out = ed.unique_tensor(f"{conv.output[0]}/taps{index}")
        made.append(make_slice(ed, source, out, spec_, f"{_label(conv)}/taps{index}").name)
        copies.append(out)
    group = int(attr(conv, "group", 1))
    stacked = _stack(ed, conv, copies, group, x[0], [spans[a] if p.rewritten else x[2 + a]
                                                     for a, p in enumerate(plans)], made)
    inputs = [stacked, ed.add_initializer(_weights(weight, plans, group > 1),
                                          f"{conv.input[1]}/taps"), *conv.input[2:]]
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in conv.attribute
             if a.name not in ("kernel_shape", "dilations", "pads", "auto_pad")}
    new_pads = [0 if p.rewritten else pads[a] for a, p in enumerate(plans)]
    new_pads += [0 if p.rewritten else pads[rank + a] for a, p in enumerate(plans)]
    output = conv.output[0]
    name = conv.name or output
    ed.remove(conv)
    node = ed.make_node("Conv", inputs, [output], name, kernel_shape=[p.size for p in plans],
                        dilations=[p.dilation for p in plans], pads=new_pads, **attrs)
    return [*made, node.name]


def _pad_chain(ed: Editor, conv: onnx.NodeProto, data: str, begin: list[int], end: list[int],
               limit: int | None, made: list[str]) -> str:
    """``data`` padded with zeros by ``begin``/``end`` per spatial axis, in Pads of at most
    ``limit`` each."""
    begin, end = list(begin), list(end)
    step = 0
    while any(begin) or any(end):
        now_b = [min(b, limit) if limit else b for b in begin]
        now_e = [min(e, limit) if limit else e for e in end]
        out = ed.unique_tensor(f"{conv.output[0]}/pad{step}")
        made.append(make_pad(ed, data, out, [0, 0, *now_b, 0, 0, *now_e],
                             f"{_label(conv)}/pad{step}").name)
        begin = [b - n for b, n in zip(begin, now_b)]
        end = [e - n for e, n in zip(end, now_e)]
        data, step = out, step + 1
    return data


def _stack(ed: Editor, conv: onnx.NodeProto, copies: list[str], group: int, batch: int,
           spatial: list[int], made: list[str]) -> str:
    """The copies stacked into channels: copy-major (Concat on channels) for a dense conv,
    channel-major (Concat on H, then Reshape) for a grouped one."""
    if len(copies) == 1:
        return copies[0]
    out = ed.unique_tensor(f"{conv.output[0]}/stack")
    if group == 1:
        made.append(ed.make_node("Concat", copies, [out], f"{_label(conv)}/stack", axis=1).name)
        return out
    made.append(ed.make_node("Concat", copies, [out], f"{_label(conv)}/stack", axis=2).name)
    channels = ed.shape(conv.input[0])[1]
    reshaped = ed.unique_tensor(f"{conv.output[0]}/stack_channels")
    made.append(make_reshape(ed, out, reshaped, [batch, channels * len(copies), *spatial],
                             f"{_label(conv)}/stack_channels").name)
    return reshaped


def _weights(weight: np.ndarray, plans: list[AxisPlan], channel_major: bool) -> np.ndarray:
    """The stacked conv's weights: group ``c``'s taps in channel block ``c`` (copy-major) or at
    channel ``i·copies + c`` (channel-major); taps past the kernel are zero."""
    groups = [range(len(p.shifts)) for p in plans]
    combos = list(itertools.product(*groups))
    out = np.zeros((weight.shape[0], weight.shape[1], len(combos), *(p.size for p in plans)),
                   weight.dtype)
    for c, combo in enumerate(combos):
        for j in itertools.product(*(range(p.size) for p in plans)):
            taps = [p.taps[g][jj] for p, g, jj in zip(plans, combo, j)]
            if None not in taps:
                out[(slice(None), slice(None), c, *j)] = weight[(slice(None), slice(None), *taps)]
    if not channel_major:
        out = out.transpose(0, 2, 1, *range(3, out.ndim))
    return np.ascontiguousarray(out.reshape(weight.shape[0], -1, *out.shape[3:]))


def _label(conv: onnx.NodeProto) -> str:
    return conv.name or conv.output[0]
