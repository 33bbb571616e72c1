"""Backward-H (seed 001): which input rows a slice of output rows needs.

Most layers read the rows they write. A convolution or pool with kernel ``k``, stride ``s``,
top padding ``p`` and dilation ``d`` computes output row ``r`` from input rows
``r·s - p + i·d`` for ``i < k`` (a constant pad of H is such a window of one row); a concat
along H reads each input's part of the rows; a reshape regrouping H x W reads the input rows
holding the same pixels; a nearest-neighbour resize by an integer factor ``f`` reads row
``r // f``, and any other resize (bilinear, other coordinate modes) carries its exact
per-output-row input span ``[lo, hi)`` in ``attrs["row_spans"]``. Rows that fall outside the
input are padding: the slice gets them as *effective* paddings, so an inner slice has none and
the first and last slices keep the layer's own.

Neighbouring slices overlap (a halo). The seed rejects a slicing whose input overlap — rows
loaded more than once, ``Σ len - len(union)`` — exceeds half the input height.
"""

from __future__ import annotations

from typing import Iterable, NamedTuple

from npubuild.npu.layers import LayerSpec


class Rows(NamedTuple):
    """A half-open range ``[start, stop)`` of rows (or channels, or batch items)."""

    start: int
    stop: int

    @property
    def size(self) -> int:
        return max(0, self.stop - self.start)

    def hull(self, other: "Rows | None") -> "Rows":
        """The smallest range holding both (an empty range adds nothing)."""
        if other is None or not other.size:
            return self
        if not self.size:
            return other
        return Rows(min(self.start, other.start), max(self.stop, other.stop))

    def contains(self, other: "Rows") -> bool:
        return self.start <= other.start and other.stop <= self.stop

    def __repr__(self) -> str:
        return f"[{self.start},{self.stop})"


class Needed(NamedTuple):
    """Input rows a slice reads, and the padding rows it must synthesise above and below."""

    rows: Rows
    pad_top: int
    pad_bottom: int


def split_rows(total: int, parts: int) -> list[Rows]:
    """``total`` rows as ``parts`` near-equal consecutive ranges (the larger ones first)."""
    if not 1 <= parts <= total:
        raise ValueError(f"cannot split {total} rows into {parts} parts")
    base, extra = divmod(total, parts)
    ranges, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        ranges.append(Rows(start, stop))
        start = stop
    return ranges


def share(total: int, parts: int, part: int) -> Rows:
    """``split_rows(total, parts)[part]`` without building the list (the tiler asks per part)."""
    if not 1 <= parts <= total or not 0 <= part < parts:
        raise ValueError(f"cannot take part {part} of {total} rows in {parts} parts")
    base, extra = divmod(total, parts)
    start = part * base + min(part, extra)
    return Rows(start, start + base + (1 if part < extra else 0))


def window_rows(out: Rows, kernel: int, stride: int, pad_top: int, dilation: int,
                height: int) -> Needed:
    """Input rows of a sliding window (conv/pool) for output rows ``out``, clamped to the input.

    The rows are exactly the first to the last row a tap touches (with dilation, border rows
    no tap reaches are left out and count as padding: no tap reads them either).
    """
    taps = range(0, (kernel - 1) * dilation + 1, dilation)
    if not out.size:
        return Needed(Rows(0, 0), 0, 0)
    first = out.start * stride - pad_top
    last = (out.stop - 1) * stride - pad_top + taps[-1]  # inclusive
    lo = hi = None
    for r in range(out.start, out.stop):  # only the rows whose window starts above row 0
        base = r * stride - pad_top
        hit = next((base + t for t in taps if 0 <= base + t < height), None)
        lo = hit if lo is None or (hit is not None and hit < lo) else lo
        if base >= 0:
            break
    for r in range(out.stop - 1, out.start - 1, -1):  # only those ending below the last row
        base = r * stride - pad_top
        hit = next((base + t for t in reversed(taps) if 0 <= base + t < height), None)
        hi = hit if hi is None or (hit is not None and hit > hi) else hi
        if base + taps[-1] < height:
            break
    if lo is None or hi is None:  # every tap falls in the padding: read nothing
        return Needed(Rows(0, 0), max(0, last - first + 1), 0)
    return Needed(Rows(lo, hi + 1), lo - first, last - hi)


def input_rows(layer: LayerSpec, out: Rows, index: int = 0) -> Needed:
    """The rows of input ``index`` that ``layer`` reads to compute output rows ``out``."""
    height = layer.in_shapes[index][2]
    if layer.op in ("conv", "dwconv", "pool", "pad"):
        return window_rows(out, layer.kernel_h, layer.stride_h, layer.pad_top, layer.dilation_h,
                           height)
    if layer.op == "fc" or (layer.op == "split" and layer.attr("axis") == 2):  # (each
        # output feature reads the whole vector; a split along H: layer_group.reads_whole_input)
        return Needed(Rows(0, height) if out.size else Rows(0, 0), 0, 0)
    if layer.op == "concat" and layer.attr("axis") == 2:  # joined along H: this input's part
        start = sum(shape[2] for shape in layer.in_shapes[:index])
        lo, hi = max(out.start, start), min(out.stop, start + height)
        return Needed(Rows(lo - start, hi - start) if lo < hi else Rows(0, 0), 0, 0)
    if layer.op == "reshape":  # H x W regrouped: output rows are a run of the flat pixels
        w_in, w_out = layer.in_shapes[index][3], layer.out_shapes[0][3]
        if not out.size:
            return Needed(Rows(0, 0), 0, 0)
        return Needed(Rows(out.start * w_out // w_in, -(-out.stop * w_out // w_in)), 0, 0)
    if layer.op == "resize":
        spans = layer.attr("row_spans")
        if spans is not None:  # monotone spans: the first row's start, the last row's stop
            return Needed(Rows(spans[out.start][0], spans[out.stop - 1][1]), 0, 0)
        return Needed(Rows(out.start // layer.scale_h, (out.stop - 1) // layer.scale_h + 1), 0, 0)
    if height == layer.h_out:
        return Needed(out, 0, 0)
    if height == 1:  # broadcast along H
        return Needed(Rows(0, 1), 0, 0)
    raise ValueError(f"layer {layer.name!r} ({layer.op}): input {index} has H={height} but the "
                     f"output has H={layer.h_out}; the tiler cannot map its rows")


def overlap(ranges: Iterable[Rows]) -> int:
    """Rows covered more than once: total length minus the length of the union."""
    ranges = sorted(r for r in ranges if r.size)
    total = sum(r.size for r in ranges)
    union, reach = 0, None
    for r in ranges:
        if reach is None or r.start >= reach:
            union += r.size
            reach = r.stop
        elif r.stop > reach:
            union += r.stop - reach
            reach = r.stop
    return total - union


def overlap_ok(ranges: Iterable[Rows], height: int) -> bool:
    """Seed 001's rule: a slicing fails when an input's overlap exceeds ``height / 2``."""
    return 2 * overlap(ranges) <= height
