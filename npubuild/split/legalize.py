"""Convolutions the chip refuses for their stride, kernel, dilation or padding, and pools it
refuses for their kernel or stride, written as ones it runs.

A Conv whose stride along an axis exceeds the chip's ``max_stride`` where its windows do not
overlap (``(K - 1)·d + 1 <= s``: the patch embedding of a ViT or Swin, a 4x4 stride-4 stem, a
1-D conv hopping by its length) is undone first (`_destride_one`): the axis's blocks of ``s``
positions moved into channels (per axis a Reshape, a 4-D Transpose and a Reshape) and a conv
of stride 1 and kernel 1 along it, whose weights sit at the block positions the taps read. A
stride with overlapping windows (an STFT's or a constant-Q transform's hop) is left whole: the
same rewrite moved audio front ends (STFT, power, Log) into int8, which the precision search
could not bring back to the float result.

A MaxPool or AveragePool whose kernel or stride exceeds the chip's along an unpadded axis
(ShallowTemp's mean over 40 mel bands, stride 40): an unpadded mean of windows that do not
overlap becomes a depthwise conv of weights ``1/(kh·kw)``, undone as above (`_legal_pools`);
a MaxPool of one window over the whole input a GlobalMaxPool; a pool of one window over the
whole input refused only for its stride the same pool of stride 1 (`_unstrided_pools`: the
stride of one window is never used); any other MaxPool a chain of
pools within the limits (`_pool_chain`): kernel and stride ``f`` then ``k/f`` by ``s/f``,
``f`` a common factor. Other means stay whole (`_legal_pools` says why).

A Conv whose kernel is longer along an axis than the chip's ``max_kernel`` (or not among its
``kernel_sizes``), whose dilation exceeds ``max_dilation`` or whose padding exceeds ``max_pad``
reads its input at tap offsets ``k·d`` (``k < K``). `legal_convs` writes it as

- the input padded explicitly by the conv's own pads along those axes (a chain of Pads of at
  most the chip's Pad ``max_pad`` each),
- one Slice per group of taps: the padded input shifted by the group's first offset,
- the slices stacked into channels (a Concat on the channel axis; with ``group > 1`` a Concat
  along H and a Reshape, so each channel's copies sit next to each other and groups stay
  contiguous) or, on a chip that runs only plain or depthwise convs (Ethos-U, ``groups:
  one_or_depthwise``), for a grouped conv with a spatial axis of one position that it does not
  read past (a 1-D depthwise conv written in 2-D), along that axis, which the conv's kernel then
  spans: a depthwise conv stays depthwise,
- one Conv over the stack, unpadded along those axes, whose weights hold group ``c``'s taps
  in channel block ``c`` (taps past the kernel are zero).

A kernel too long is cut into ``n = ceil(K / max)`` groups of ``m = ceil(K / n)`` taps (the conv
keeps its dilation); a dilation too large gives one group per tap (kernel 1 along that axis);
padding alone too large gives one group, the whole kernel (the Pads and the conv, nothing else).
Every product is summed in the one conv's accumulator, so the int8 result is the original
conv's: no partial sum is requantized, and a Slice, Pad or Concat of one tensor keeps its scale.

A 1-D conv (one spatial axis of extent 1) dilated beyond ``max_dilation`` along the other, of
stride 1 there and pads a multiple of the dilation, whose taps cut alone do not run, is first
the same conv undilated over its
``d`` phases (`_polyphase_one`: the signal reshaped to ``[L/d, d]``, a conv of kernel
``[K, 1]``): one copy per tap of a long signal is a stack of one row that LMEM may not hold
(SpliceAI's 41 taps dilated 25 over 11,000 bases), the phases are rows the NPU slices; the
undilated conv's kernel and pads are then cut as above.

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
from npubuild.onnx_io import STANDARD_DOMAINS
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
    """``model`` with every Conv the chip refuses for its stride, kernel, dilation or padding,
    and every pool it refuses for its kernel or stride (but those whose output is in
    ``keep``), rewritten as nodes the chip runs (module docstring); the names of the convs and
    pools rewritten (an unnamed one is named after its output), in graph order ([] and
    ``model`` itself when none is). A stride is undone first (`_destrided`), then the taps are
    cut; a stride's rewrite is kept only where the chip runs all of it, taps included."""
    spec = effective_spec(chip, "Conv")
    staged, pooled = _legal_pools(model, chip, keep)
    if spec is None:
        return staged, pooled
    strided = _strided_convs(staged, spec, keep)
    dilated = _dilated_convs(staged, spec, keep)
    if dilated:  # the phases only where cutting the taps alone leaves the conv whole
        _, tapped_alone = _legal_taps(staged, chip, keep)
        names = {n.output[0]: n.name or n.output[0] for n in staged.graph.node if n.output}
        dilated = [out for out in dilated if names[out] not in tapped_alone]
    while True:
        destrided, moved = _destrided(staged, strided, chip)
        phased, phases = _polyphased(destrided, dilated, chip)
        final, tapped = _legal_taps(phased, chip, keep)
        producers = {n.output[0]: n.name for n in final.graph.node if n.output}
        runs = runs_whole(final, {out: [*names[:-1], producers.get(out, "")]
                                for out, names in moved.items()}, chip)
        runs_phased = runs_whole(final, phases, chip)
        if runs == strided and runs_phased == dilated:
            break
        strided, dilated = runs, runs_phased
    names = ({names[-1] for names in moved.values()} | {names[-1] for names in phases.values()}
             | set(tapped) | set(pooled))
    order = {n.name: i for i, n in enumerate(final.graph.node)}
    names = sorted(names, key=lambda n: order.get(n, len(order)))
    return (final, names) if names else (model, [])


def _legal_taps(model: onnx.ModelProto, chip: Chip, keep: set[str] = frozenset()
                ) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with every Conv the chip refuses for its kernel, dilation or padding rewritten
    as Pads, Slices, a Concat and one Conv the chip runs; the names of the convs rewritten."""
    spec = effective_spec(chip, "Conv")
    ed = Editor(model, REWRITE)
    candidates = [n.output[0] for n in ed.graph.node
                  if n.output[0] not in keep and _too_big(ed, n, spec)]
    if not candidates:
        return model, []
    rewritten, made, legal = kept_rewrite(
        model, candidates, lambda m, outs: _rewrite(m, outs, chip), chip)
    return rewritten, [made[out][-1] for out in legal]


def _too_big(ed: Editor, node: onnx.NodeProto, spec) -> bool:
    if node.op_type != "Conv" or node.domain not in STANDARD_DOMAINS or not node.output[0]:
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


def kept_rewrite(model: onnx.ModelProto, candidates: list[str], rewrite, chip: Chip
                 ) -> tuple[onnx.ModelProto, dict[str, list[str]], list[str]]:
    """``rewrite(model, outputs)`` (-> the model and, per output, the names of the nodes made)
    of the ``candidates`` every node of whose rewrite the chip runs (`runs_whole`), made again
    without the others: (the model, the nodes made, the candidates kept)."""
    rewritten, made = rewrite(model, candidates)
    legal = runs_whole(rewritten, made, chip)
    if legal != candidates:
        rewritten, made = rewrite(model, legal) if legal else (model, {})
    return rewritten, made, legal


def runs_whole(model: onnx.ModelProto, made: dict[str, list[str]], chip: Chip) -> list[str]:
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


def _strided_convs(model: onnx.ModelProto, spec, keep) -> list[str]:
    """The outputs of the 4-D Convs whose stride the chip refuses along some axis where each
    window fits in its stride (``(K - 1)·d + 1 <= s``: a patch embedding, a 4x4 stride-4
    stem): `_destride_one` undoes them exactly."""
    if spec.max_stride is None:
        return []
    ed = Editor(model, REWRITE)
    return [n.output[0] for n in ed.graph.node if n.output[0] not in keep
            and _destride_axes(ed, n, spec) and not _squared(ed, n.output[0])]


def _squared(ed: Editor, tensor: str) -> bool:
    """Whether ``tensor`` is squared (``Pow(x, 2)``, ``Mul(x, x)``) after signed data movement
    and sums (`spectrum.SIGNED`): a transform of an audio front end (basic-pitch's constant-Q
    convs of 256 taps hopping 256). Its stride stays as it was: on the NPU in int8 the
    precision search kept basic-pitch passing but slower (991 -> 932 fps NPU alone, worst
    output 0.9985 -> 0.9969), as the overlapping hops did to Silero VAD v6."""
    from npubuild.split.spectrum import SIGNED

    seen, todo = set(), [tensor]
    while todo:
        name = todo.pop()
        for node in ed.consumers(name):
            if node.op_type == "Mul" and len(node.input) == 2 and node.input[0] == node.input[1]:
                return True
            if node.op_type == "Pow" and len(node.input) == 2:
                exponent = ed.constant(node.input[1])
                if exponent is not None and exponent.size == 1 \
                        and float(exponent.reshape(-1)[0]) == 2.0:
                    return True
            if node.op_type in SIGNED and node.name not in seen:
                seen.add(node.name)
                todo += [o for o in node.output if o]
    return False


def _destride_axes(ed: Editor, node: onnx.NodeProto, spec) -> list[int]:
    """The spatial axes (of 0 and 1) along which ``node``'s stride exceeds the chip's, when
    along each of them no window overlaps the next; [] when there is none or one overlaps (an
    STFT's or a constant-Q transform's hop: left whole, see the module docstring)."""
    if node.op_type != "Conv" or node.domain not in STANDARD_DOMAINS or not node.output[0]:
        return []
    weight = ed.constant(node.input[1]) if len(node.input) > 1 else None
    if weight is None or weight.ndim != 4 or ed.shape(node.input[0]) is None \
            or ed.shape(node.output[0]) is None:
        return []
    _, _, strides, dilations, _ = _geometry(ed, node, weight)
    over = [a for a in (0, 1) if strides[a] > spec.max_stride]
    fits = all((weight.shape[2 + a] - 1) * dilations[a] + 1 <= strides[a] for a in over)
    return over if fits else []


def _destrided(model: onnx.ModelProto, outputs: list[str], chip: Chip
               ) -> tuple[onnx.ModelProto, dict[str, list[str]]]:
    """``model`` with the strided convs computing ``outputs`` undone (`_destride_one`); per
    output, the names of the nodes made (the conv last)."""
    return _each_conv(model, outputs, chip, _destride_one)


def _each_conv(model: onnx.ModelProto, outputs: list[str], chip: Chip, one
               ) -> tuple[onnx.ModelProto, dict[str, list[str]]]:
    """``model`` with ``one(ed, conv, spec, pad_limit)`` applied to the convs computing
    ``outputs`` (``model`` itself when there is none); per output, the nodes it made."""
    if not outputs:
        return model, {}
    ed = Editor(model, REWRITE)
    ed.freeze_shapes()
    spec = effective_spec(chip, "Conv")
    made = {out: one(ed, ed.producer(out), spec, _pad_limit(chip)) for out in outputs}
    ed.thaw_shapes()
    return ed.finish(), made


def _pad_limit(chip: Chip) -> int | None:
    pad_spec = chip.ops.get("Pad")
    return pad_spec.max_pad if pad_spec is not None and pad_spec.max_pad else None


def _destride_one(ed: Editor, conv: onnx.NodeProto, spec, pad_limit: int | None) -> list[str]:
    """A conv whose windows along the axes of `_destride_axes` do not overlap, as the
    space-to-depth of those axes and a conv of stride 1 and kernel 1 along them: the input
    padded by the conv's own pads there and to whole blocks of ``s`` positions (or cut to the
    last block an output reads), each block moved into channels (per axis a Reshape, a
    4-D Transpose and a Reshape: channel ``c·s + r`` holds position ``r`` of each block of
    channel ``c``, so groups stay contiguous), and the weights of tap ``t`` at channel
    ``c·s + t·d`` (zero at the positions between windows). The same products summed in one
    accumulator."""
    weight = ed.constant(conv.input[1])
    x, y, strides, dilations, pads = _geometry(ed, conv, weight)
    axes = _destride_axes(ed, conv, spec)
    made: list[str] = []
    begin, end, cut = [0, 0], [0, 0], []
    for a in axes:
        blocks = y[2 + a] * strides[a]
        begin[a] = pads[a]
        end[a] = max(0, blocks - x[2 + a] - pads[a])
        if x[2 + a] + pads[a] > blocks:  # positions past the last window no output reads
            cut.append((2 + a, 0, blocks, 1))
    source = _pad_chain(ed, conv, conv.input[0], begin, end, pad_limit, made)
    if cut:
        out = ed.unique_tensor(f"{conv.output[0]}/blocks")
        made.append(make_slice(ed, source, out, cut, f"{_label(conv)}/blocks").name)
        source = out
    n, c, h, w = x[0], x[1], *(y[2 + a] * strides[a] if a in axes else x[2 + a] for a in (0, 1))
    for a in axes:  # [n, c, h, w] -> [n, c·s, h/s, w] (or w/s)
        s = strides[a]
        split, perm, merged = (([n * c, h // s, s, w], [0, 2, 1, 3], [n, c * s, h // s, w])
                               if a == 0 else
                               ([n * c, h, w // s, s], [0, 3, 1, 2], [n, c * s, h, w // s]))
        source = _layout_steps(ed, conv, source, [("split", split), ("moved", perm),
                                                   ("channels", merged)], f"s2d{a}", made)
        n, c, h, w = merged
    o, per_group, kh, kw = weight.shape
    blocks = [strides[a] if a in axes else 1 for a in (0, 1)]
    sizes = [1 if a in axes else weight.shape[2 + a] for a in (0, 1)]
    moved = np.zeros((o, per_group, *blocks, *sizes), weight.dtype)
    for i, j in itertools.product(range(kh), range(kw)):
        (ri, ti), (rj, tj) = ((i * dilations[0], 0) if 0 in axes else (0, i),
                              (j * dilations[1], 0) if 1 in axes else (0, j))
        moved[:, :, ri, rj, ti, tj] = weight[:, :, i, j]
    moved = moved.reshape(o, per_group * blocks[0] * blocks[1], *sizes)
    kept = lambda a, values, one: one if a in axes else values[a]  # noqa: E731
    attrs = {at.name: onnx.helper.get_attribute_value(at) for at in conv.attribute
             if at.name not in ("kernel_shape", "dilations", "pads", "auto_pad", "strides")}
    inputs = [source, ed.add_initializer(np.ascontiguousarray(moved), f"{conv.input[1]}/blocks"),
              *conv.input[2:]]
    output, name = conv.output[0], conv.name or conv.output[0]
    ed.remove(conv)
    node = ed.make_node(
        "Conv", inputs, [output], name, kernel_shape=sizes,
        strides=[kept(a, strides, 1) for a in (0, 1)],
        dilations=[kept(a, dilations, 1) for a in (0, 1)],
        pads=[kept(a, pads, 0) for a in (0, 1)] + [kept(a, pads[2:], 0) for a in (0, 1)], **attrs)
    return [*made, node.name]


def _dilated_convs(model: onnx.ModelProto, spec, keep) -> list[str]:
    """The outputs of the Convs `_polyphase_axis` rewrites: a 1-D conv (one spatial axis of
    extent 1) dilated beyond the chip's ``max_dilation`` along the other. `legal_convs`
    rewrites them so only where cutting their taps alone does not run: a short kernel's
    copies fit (OpenSpindleNet's 3 taps dilated up to 4,096 over 7,500 samples), and its
    phases would pad the signal to whole blocks of the dilation in dozens of Pads."""
    if spec.max_dilation is None:
        return []
    ed = Editor(model, REWRITE)
    return [n.output[0] for n in ed.graph.node
            if n.output[0] not in keep and _polyphase_axis(ed, n, spec) is not None]


def _polyphase_axis(ed: Editor, node: onnx.NodeProto, spec) -> int | None:
    """The spatial axis (0 or 1) of a 4-D Conv dilated beyond ``spec.max_dilation`` along it
    where its phases are independent convs: stride 1 and pads a multiple of the dilation
    along it, and the other spatial axis of extent 1 (a widened 1-D conv: kernel 1, no pads,
    no dilation there); None otherwise."""
    if node.op_type != "Conv" or node.domain not in STANDARD_DOMAINS or not node.output[0]:
        return None
    weight = ed.constant(node.input[1]) if len(node.input) > 1 else None
    if weight is None or weight.ndim != 4 or ed.shape(node.input[0]) is None \
            or ed.shape(node.output[0]) is None:
        return None
    x, _, strides, dilations, pads = _geometry(ed, node, weight)
    for a, b in ((0, 1), (1, 0)):
        d = dilations[a]
        if d > spec.max_dilation and strides[a] == 1 and pads[a] % d == 0 \
                and pads[2 + a] % d == 0 and x[2 + b] == 1 and weight.shape[2 + b] == 1 \
                and dilations[b] == 1 and strides[b] == 1 and pads[b] == pads[2 + b] == 0:
            return a
    return None


def _polyphased(model: onnx.ModelProto, outputs: list[str], chip: Chip
                ) -> tuple[onnx.ModelProto, dict[str, list[str]]]:
    """``model`` with the dilated convs computing ``outputs`` split into their phases
    (`_polyphase_one`); per output, the names of the nodes made (the conv last)."""
    return _each_conv(model, outputs, chip, _polyphase_one)


def _polyphase_one(ed: Editor, conv: onnx.NodeProto, spec, pad_limit: int | None) -> list[str]:
    """A 1-D conv dilated by ``d`` along a signal of ``L`` positions (the axis of
    `_polyphase_axis`) as the same conv undilated over its ``d`` phases: position ``q·d + r``
    reads only positions ``(q + k)·d + r``, so the signal (padded at its end to whole blocks
    of ``d``) reshaped to ``[n, c, L/d, d]`` holds phase ``r`` in column ``r``, and a conv of
    kernel ``[K, 1]``, dilation 1 and pads divided by ``d`` computes every phase at once;
    reshaped back (``[n, m, 1, L']`` or ``[n, m, L', 1]``) and cut to the conv's output
    length. TensorFlow's atrous convolution (space-to-batch) by the same identity. The
    products and their sums are the conv's own; the new conv's kernel (and pads) may still
    be beyond the chip's, which `_legal_taps` then cuts into groups, now over a stack whose
    rows the NPU slices (a long 1-D signal is one row: its stack of one copy per tap did not
    fit LMEM, SpliceAI's 41 taps dilated 25 over 11,000 bases)."""
    weight = ed.constant(conv.input[1])
    x, y, _, dilations, pads = _geometry(ed, conv, weight)
    a = _polyphase_axis(ed, conv, spec)
    d, length = dilations[a], x[2 + a]
    made: list[str] = []
    tail = -length % d
    end = [tail if axis == a else 0 for axis in (0, 1)]
    source = _pad_chain(ed, conv, conv.input[0], [0, 0], end, pad_limit, made)
    blocks = (length + tail) // d
    n, c = x[0], x[1]
    source = _layout_steps(ed, conv, source, [("phases", [n, c, blocks, d])], "poly", made)
    kernel = weight.shape[2 + a]
    moved = np.ascontiguousarray(weight.reshape(*weight.shape[:2], kernel, 1))
    attrs = {at.name: onnx.helper.get_attribute_value(at) for at in conv.attribute
             if at.name not in ("kernel_shape", "dilations", "pads", "auto_pad", "strides")}
    inputs = [source, ed.add_initializer(moved, f"{conv.input[1]}/phases"), *conv.input[2:]]
    output, name = conv.output[0], conv.name or conv.output[0]
    phased = ed.unique_tensor(f"{output}/poly_conv")
    ed.remove(conv)
    node = ed.make_node("Conv", inputs, [phased], name, kernel_shape=[kernel, 1],
                        strides=[1, 1], dilations=[1, 1],
                        pads=[pads[a] // d, 0, pads[2 + a] // d, 0], **attrs)
    out_blocks = blocks + (pads[a] + pads[2 + a]) // d - (kernel - 1)
    m = weight.shape[0]
    flat = [n, m, 1, out_blocks * d] if a == 1 else [n, m, out_blocks * d, 1]
    if out_blocks * d == y[2 + a]:
        made.append(make_reshape(ed, phased, output, flat, f"{_label(node)}/poly_signal").name)
    else:
        signal = _layout_steps(ed, node, phased, [("signal", flat)], "poly", made)
        made.append(make_slice(ed, signal, output, [(2 + a, 0, y[2 + a], 1)],
                               f"{_label(node)}/poly_cut").name)
    return [*made, node.name]


def _layout_steps(ed: Editor, conv: onnx.NodeProto, source: str, steps, label: str,
                  made: list[str]) -> str:
    """``source`` through Reshapes (a shape) and Transposes (a perm), named after ``conv``."""
    for step, value in steps:
        out = ed.unique_tensor(f"{conv.output[0]}/{label}_{step}")
        hint = f"{_label(conv)}/{label}_{step}"
        if step == "moved":
            made.append(ed.make_node("Transpose", [source], [out], hint, perm=value).name)
        else:
            made.append(make_reshape(ed, source, out, value, hint).name)
        source = out
    return source


# ---- pools -----------------------------------------------------------------------------------

POOLS = ("MaxPool", "AveragePool")


def _legal_pools(model: onnx.ModelProto, chip: Chip, keep) -> tuple[onnx.ModelProto, list[str]]:
    """``model`` with every pool the chip refuses for its kernel or stride rewritten where the
    chip runs the rewrite whole: an unpadded AveragePool whose windows do not overlap as a
    depthwise Conv of weights ``1/(kh·kw)`` undone as a strided conv is (`_destride_one`:
    every window summed in one accumulator, rounded once); a MaxPool whose one window is the
    whole input as a GlobalMaxPool, any other as the chain of `_pool_chain` (the max of maxes:
    exact). Means go no other way: a chain of means rounds each mean in int8 (ShallowTemp's
    worst sample 0.9992 -> 0.9907); and a mean of the whole input stays whole: a global pool,
    a chain or the conv sums its thousands of values in another order, which moved selfie
    segmentation's output 4.2e-5 to 6.2e-5 of its scale, past the split's float proof (1e-5).
    The names of the pools rewritten."""
    ed = Editor(model, REWRITE)
    chains, means, one_window = {}, [], []
    for node in ed.graph.node:
        spec = effective_spec(chip, node.op_type) if node.op_type in POOLS else None
        if spec is None or not node.output[0] or node.output[0] in keep:
            continue
        chain = _pool_chain(ed, node, spec) if node.op_type == "MaxPool" else []
        if chain:
            chains[node.output[0]] = chain
        if not _refused_pool(ed, node, spec):
            continue
        if not _whole_input(ed, node):
            means += [node.output[0]] if _plain_mean(node) else []
        elif all(_pool_axis_fits(k, 1, spec) for k in attr(node, "kernel_shape")):
            one_window.append(node.output[0])
    if not chains and not means and not one_window:
        return model, []
    model, whole = _whole_input_pools(model, list(chains), chip)
    one_window = [out for out in one_window if out not in whole]
    model, _, unstrided = (kept_rewrite(model, one_window, _unstrided_pools, chip) if one_window
                           else (model, {}, []))
    chains = {out: chain for out, chain in chains.items()
              if out not in whole and out not in unstrided}
    as_convs = _means_as_convs(model, means, chip)
    staged, moved = _destrided(_pools_as_convs(model, as_convs), as_convs, chip)
    rest = {out: chain for out, chain in chains.items() if out not in as_convs}
    rewritten, made = _chain_pools(staged, rest)
    legal = runs_whole(rewritten, made, chip)
    if list(rest) != legal:
        rewritten, made = _chain_pools(staged, {out: rest[out] for out in legal}) \
            if legal else (staged, {})
    producers = {n.output[0]: n.name for n in rewritten.graph.node if n.output}
    names = ({names[-1] for names in moved.values()} | {made[out][-1] for out in legal}
             | set(whole.values()) | {producers[out] for out in unstrided})
    order = {n.name: i for i, n in enumerate(rewritten.graph.node)}
    return rewritten, sorted(names, key=lambda n: order.get(n, len(order)))


def _whole_input_pools(model: onnx.ModelProto, outputs: list[str], chip: Chip
                       ) -> tuple[onnx.ModelProto, dict[str, str]]:
    """``model`` with those MaxPools of ``outputs`` whose one window is the whole unpadded
    input written as the GlobalMaxPool they are, where the chip runs that; per output
    rewritten, the pool's name."""
    ed = Editor(model, REWRITE)
    whole = [out for out in outputs if _whole_input(ed, ed.producer(out))]
    if not whole:
        return model, {}
    ed.freeze_shapes()
    names = {}
    for output in whole:
        pool = ed.producer(output)
        name = pool.name or output
        ed.remove(pool)
        names[output] = ed.make_node(f"Global{pool.op_type}", [pool.input[0]], [output],
                                     name).name
    ed.thaw_shapes()
    rewritten = ed.finish()
    legal = runs_whole(rewritten, {out: [name] for out, name in names.items()}, chip)
    if legal != whole:
        return _whole_input_pools(model, legal, chip) if legal else (model, {})
    return rewritten, names


def _unstrided_pools(model: onnx.ModelProto, outputs: list[str]
                     ) -> tuple[onnx.ModelProto, dict[str, list[str]]]:
    """``model`` with the pools computing ``outputs``, each one window over its whole unpadded
    input, given strides 1: the stride of a pool with one output along an axis is never used
    (ONNX Runtime computes the same window, the quantizer the same layer), so a chip that
    refuses only the stride runs the pool as it is. Per output, the pool's name."""
    ed = Editor(model, REWRITE)
    made = {}
    for output in outputs:
        pool = ed.producer(output)
        pool.name = pool.name or ed.unique_node(output)
        kept = [a for a in pool.attribute if a.name != "strides"]
        del pool.attribute[:]
        pool.attribute.extend(kept)
        pool.doc_string = f"npubuild surgery: {REWRITE}"
        made[output] = [pool.name]
    ed.touch()
    return ed.finish(), made


def _whole_input(ed: Editor, node: onnx.NodeProto) -> bool:
    x, y = ed.shape(node.input[0]), ed.shape(node.output[0])
    return (x is not None and y is not None and len(x) == 4 and list(y[2:]) == [1, 1]
            and list(attr(node, "kernel_shape") or []) == list(x[2:])
            and not any(_pool_pads(node) or [1])
            and list(attr(node, "dilations") or [1, 1]) == [1, 1])


def _refused_pool(ed: Editor, node: onnx.NodeProto, spec) -> bool:
    """A 4-D pool of one output whose kernel or stride the chip refuses along some axis."""
    x, kernel = ed.shape(node.input[0]), list(attr(node, "kernel_shape") or [])
    strides = list(attr(node, "strides") or [1, 1])
    return (x is not None and len(x) == 4 and len(kernel) == 2 and ed.shape(node.output[0])
            is not None and len([o for o in node.output if o]) == 1
            and any(not _pool_axis_fits(k, s, spec) for k, s in zip(kernel, strides)))


def _plain_mean(node: onnx.NodeProto) -> bool:
    """An AveragePool of no padding, so every window divides by ``kh·kw``."""
    return node.op_type == "AveragePool" and not any(_pool_pads(node) or [1]) \
        and list(attr(node, "dilations") or [1, 1]) == [1, 1]


def _means_as_convs(model: onnx.ModelProto, outputs: list[str], chip: Chip) -> list[str]:
    """Those of ``outputs`` (AveragePools) that, as a depthwise conv undone by `_destride_one`,
    the chip runs whole."""
    spec = effective_spec(chip, "Conv")
    if not outputs or spec is None:
        return []
    convs = _pools_as_convs(model, outputs)
    ed = Editor(convs, REWRITE)
    outputs = [out for out in outputs if _destride_axes(ed, ed.producer(out), spec)]
    staged, moved = _destrided(convs, outputs, chip)
    producers = {n.output[0]: n.name for n in staged.graph.node if n.output}
    return runs_whole(staged, {out: [*names[:-1], producers.get(out, "")]
                             for out, names in moved.items()}, chip)


def _pools_as_convs(model: onnx.ModelProto, outputs: list[str]) -> onnx.ModelProto:
    """``model`` with the AveragePools computing ``outputs`` written as depthwise Convs (the
    same name and output) of weights ``1/(kh·kw)``."""
    if not outputs:
        return model
    ed = Editor(model, REWRITE)
    ed.freeze_shapes()
    for output in outputs:
        pool = ed.producer(output)
        kernel = list(attr(pool, "kernel_shape"))
        channels = ed.shape(pool.input[0])[1]
        weight = np.full((channels, 1, *kernel), 1.0 / math.prod(kernel), np.float32)
        inputs = [pool.input[0], ed.add_initializer(weight, f"{output}/mean_weights")]
        name = pool.name or output
        ed.remove(pool)
        ed.make_node("Conv", inputs, [output], name, kernel_shape=kernel, group=channels,
                     strides=list(attr(pool, "strides") or [1, 1]))
    ed.thaw_shapes()
    return ed.finish()


def _pool_chain(ed: Editor, node: onnx.NodeProto, spec) -> list[tuple[list[int], list[int]]]:
    """Pools (kernel, strides) in the chip's limits whose chain computes ``node``, a 4-D pool
    whose kernel or stride the chip refuses along some axis; [] when there is none.

    Along such an axis (unpadded, undilated) a pool of kernel ``k`` and stride ``s`` is one of
    kernel and stride ``f`` (``f`` dividing both) followed by one of kernel ``k/f`` and stride
    ``s/f``: the second pool's windows are the first's outputs over each original window (the
    first's cut-off tail is past every window), so the max is the max, and the mean the mean
    of equal-size means (exact but for float rounding). The first pool keeps the other axes'
    kernel, strides and pads; every later one is 1 along them."""
    x, y = ed.shape(node.input[0]), ed.shape(node.output[0])
    kernel = list(attr(node, "kernel_shape") or [])
    if (x is None or y is None or len(x) != 4 or len(kernel) != 2
            or len([o for o in node.output if o]) != 1):
        return []
    strides = list(attr(node, "strides") or [1, 1])
    dilations = list(attr(node, "dilations") or [1, 1])
    pads = _pool_pads(node)
    over = [a for a in (0, 1) if not _pool_axis_fits(kernel[a], strides[a], spec)]
    if not over or pads is None or dilations != [1, 1] or any(pads[a] or pads[2 + a] for a in over):
        return []
    floor = [(x[2 + a] + pads[a] + pads[2 + a] - (kernel[a] - 1) * dilations[a] - 1)
             // strides[a] + 1 for a in (0, 1)]
    if floor != list(y[2:]):  # ceil_mode adding a window
        return []
    steps = {a: _factor_steps(kernel[a], strides[a], spec) for a in over}
    if any(not s for s in steps.values()):
        return []
    for a in (0, 1):  # an axis within the limits is pooled by the first pool only
        steps.setdefault(a, [(kernel[a], strides[a])])
    length = max(len(s) for s in steps.values())
    return [([steps[a][i][0] if i < len(steps[a]) else 1 for a in (0, 1)],
             [steps[a][i][1] if i < len(steps[a]) else 1 for a in (0, 1)])
            for i in range(length)]


def _pool_pads(node: onnx.NodeProto) -> list[int] | None:
    """The pool's pads; None for SAME padding (its split depends on the input)."""
    auto = attr(node, "auto_pad", b"NOTSET")
    auto = auto.decode() if isinstance(auto, bytes) else auto
    if auto in ("SAME_UPPER", "SAME_LOWER"):
        return None
    return [0] * 4 if auto == "VALID" else list(attr(node, "pads") or [0] * 4)


def _pool_axis_fits(k: int, s: int, spec) -> bool:
    return (k <= _max_kernel(spec) and (spec.kernel_sizes is None or k in spec.kernel_sizes)
            and (spec.max_stride is None or s <= spec.max_stride))


def _factor_steps(k: int, s: int, spec) -> list[tuple[int, int]]:
    """(kernel, stride) steps within the chip's limits whose chain pools ``k`` by ``s``: the
    largest common factor first; [] when there is none."""
    if _pool_axis_fits(k, s, spec):
        return [(k, s)]
    for f in range(min(math.gcd(k, s), _max_kernel(spec)), 1, -1):
        if math.gcd(k, s) % f or not _pool_axis_fits(f, f, spec):
            continue
        rest = _factor_steps(k // f, s // f, spec)
        if rest:
            return [(f, f), *rest]
    return []


def _chain_pools(model: onnx.ModelProto, chains: dict) -> tuple[onnx.ModelProto, dict]:
    """``model`` with the pool computing each output of ``chains`` replaced by its chain (the
    last pool keeps its name and output); per output, the names of the pools made."""
    ed = Editor(model, REWRITE)
    ed.freeze_shapes()
    made = {}
    for output, chain in chains.items():
        pool = ed.producer(output)
        pads = list(attr(pool, "pads") or [0] * 4)
        attrs = {a.name: onnx.helper.get_attribute_value(a) for a in pool.attribute
                 if a.name not in ("kernel_shape", "strides", "pads", "auto_pad", "ceil_mode",
                                   "dilations")}
        source, names = pool.input[0], []
        ed.remove(pool)
        for i, (kernel, strides) in enumerate(chain):
            last = i == len(chain) - 1
            out = output if last else ed.unique_tensor(f"{output}/pool{i}")
            hint = (pool.name or output) if last else f"{_label(pool)}/pool{i}"
            names.append(ed.make_node(pool.op_type, [source], [out], hint, kernel_shape=kernel,
                                      strides=strides, pads=pads if i == 0 else [0] * 4,
                                      **attrs).name)
            source = out
        made[output] = names
    ed.thaw_shapes()
    return ed.finish(), made


def _rewrite(model: onnx.ModelProto, outputs: list[str], chip: Chip
             ) -> tuple[onnx.ModelProto, dict[str, list[str]]]:
    """``model`` with the convs computing ``outputs`` rewritten; per output, the names of the
    nodes made (the conv last)."""
    ed = Editor(model, REWRITE)
    ed.freeze_shapes()
    spec = effective_spec(chip, "Conv")
    made = {}
    for output in outputs:
        made[output] = _rewrite_one(ed, ed.producer(output), spec, _pad_limit(chip))
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
    free = _free_axis(x, weight, plans, pads) if (
        group > 1 and spec.groups != "any" and 1 < len(copies) <= _max_kernel(spec)
        and _size_allowed(len(copies), spec) == len(copies)) else None
    if free is not None:  # the copies side by side along an axis of one position
        plans[free] = AxisPlan(False, (0,), len(copies), 1, ((0,),))
        stacked = ed.unique_tensor(f"{conv.output[0]}/stack")
        made.append(ed.make_node("Concat", copies, [stacked], f"{_label(conv)}/stack",
                                 axis=2 + free).name)
        layout: int | bool = free
    else:
        stacked = _stack(ed, conv, copies, group, x[0], [spans[a] if p.rewritten else x[2 + a]
                                                         for a, p in enumerate(plans)], made)
        layout = group > 1
    inputs = [stacked, ed.add_initializer(_weights(weight, plans, layout),
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


def _free_axis(x: list[int], weight: np.ndarray, plans: list[AxisPlan], pads: list[int]
               ) -> int | None:
    """A spatial axis the conv neither rewrites nor reads more than one position of (extent
    1, kernel 1, unpadded: the unused axis of a 1-D conv written in 2-D), if any. Stacked
    there, the copies keep a depthwise conv depthwise (one input channel per group), which a
    chip that runs only plain or depthwise convs refuses once the copies sit in channels (a
    chip running any groups keeps the channel stack, which holds any number of copies)."""
    rank = weight.ndim - 2
    for a, plan in enumerate(plans):
        if (not plan.rewritten and x[2 + a] == 1 and weight.shape[2 + a] == 1
                and pads[a] == pads[rank + a] == 0):
            return a
    return None


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


def _weights(weight: np.ndarray, plans: list[AxisPlan], layout: bool | int) -> np.ndarray:
    """The stacked conv's weights: group ``c``'s taps in channel block ``c`` (copy-major,
    ``layout`` False), at channel ``i·copies + c`` (channel-major, True) or at position ``c``
    of spatial axis ``layout`` (an int: `_free_axis`); taps past the kernel are zero."""
    free = layout if type(layout) is int else None
    sizes = [1 if a == free else p.size for a, p in enumerate(plans)]
    groups = [range(len(p.shifts)) for p in plans]
    combos = list(itertools.product(*groups))
    out = np.zeros((weight.shape[0], weight.shape[1], len(combos), *sizes), weight.dtype)
    for c, combo in enumerate(combos):
        for j in itertools.product(*(range(size) for size in sizes)):
            taps = [p.taps[g][jj] for p, g, jj in zip(plans, combo, j)]
            if None not in taps:
                out[(slice(None), slice(None), c, *j)] = weight[(slice(None), slice(None), *taps)]
    if free is not None:
        return np.ascontiguousarray(np.moveaxis(np.take(out, 0, axis=3 + free), 2, 2 + free))
    if not layout:
        out = out.transpose(0, 2, 1, *range(3, out.ndim))
    return np.ascontiguousarray(out.reshape(weight.shape[0], -1, *out.shape[3:]))


def _label(conv: onnx.NodeProto) -> str:
    return conv.name or conv.output[0]
