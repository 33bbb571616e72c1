"""Backward-H for every H part of a slicing at once, as numpy arrays (`tiling._h_window`'s rows).

The slicing search asks of many H counts, some in the tens of thousands (BirdNET's 144,000
audio samples as one tall column), whether seed 001's overlap rule accepts them and how many
rows each buffer then holds. Walking the group once per part in Python costs the count times
the group's length for each question; here each layer is one step over arrays of part starts
and stops. Every rule is `backward_h`'s, written for arrays (the same integer arithmetic, the
same hulls: an empty range adds nothing), so the rows are those the windows hold.
"""

from __future__ import annotations

import numpy as np

from npubuild.npu.layers import Group, LayerSpec

Parts = tuple[np.ndarray, np.ndarray]  # starts, stops of one range per H part


def h_rows(group: Group, parts: int) -> dict[str, Parts]:
    """The rows every tensor's buffer holds in each of ``parts`` H parts (as `HWindow.rows`)."""
    rows = {t: shares(group.shapes[t][2], parts) for t in group.outputs}
    for layer in reversed(group.layers):
        wanted = [rows[t] for t in layer.outputs if t in rows]
        out = _hull_all(wanted) if wanted else _own_shares(layer.h_out, parts)
        for t in layer.outputs:
            rows[t] = out
        for i, t in enumerate(layer.inputs):
            rows[t] = hull(input_rows(layer, out, i), rows.get(t))
    return rows


def shares(total: int, parts: int) -> Parts:
    """`backward_h.split_rows` as arrays."""
    if not 1 <= parts <= total:
        raise ValueError(f"cannot split {total} rows into {parts} parts")
    base, extra = divmod(total, parts)
    part = np.arange(parts, dtype=np.int64)
    start = part * base + np.minimum(part, extra)
    return start, start + base + (part < extra)


def _own_shares(height: int, parts: int) -> Parts:
    if parts <= height:
        return shares(height, parts)
    return np.zeros(parts, np.int64), np.full(parts, height, np.int64)


def hull(a: Parts, b: Parts | None) -> Parts:
    """`Rows.hull` part by part: an empty range adds nothing."""
    if b is None:
        return a
    a_empty, b_empty = a[1] <= a[0], b[1] <= b[0]
    start = np.where(b_empty, a[0], np.where(a_empty, b[0], np.minimum(a[0], b[0])))
    stop = np.where(b_empty, a[1], np.where(a_empty, b[1], np.maximum(a[1], b[1])))
    return start, stop


def _hull_all(ranges: list[Parts]) -> Parts:
    found = ranges[0]
    for r in ranges[1:]:
        found = hull(found, r)
    return found


def input_rows(layer: LayerSpec, out: Parts, index: int) -> Parts:
    """`backward_h.input_rows` (its rows) for every part."""
    height = layer.in_shapes[index][2]
    lo, hi = out
    empty = hi <= lo
    if layer.op in ("conv", "dwconv", "pool", "pad"):
        return window_rows(out, layer.kernel_h, layer.stride_h, layer.pad_top, layer.dilation_h,
                           height)
    if layer.op == "fc" or (layer.op == "split" and layer.attr("axis") == 2):
        return np.zeros_like(lo), np.where(empty, 0, height)
    if layer.op == "concat" and layer.attr("axis") == 2:
        start = sum(shape[2] for shape in layer.in_shapes[:index])
        a, b = np.maximum(lo, start), np.minimum(hi, start + height)
        inside = a < b
        return np.where(inside, a - start, 0), np.where(inside, b - start, 0)
    if layer.op == "reshape":
        w_in, w_out = layer.in_shapes[index][3], layer.out_shapes[0][3]
        return (np.where(empty, 0, lo * w_out // w_in),
                np.where(empty, 0, -(-hi * w_out // w_in)))
    if layer.op == "resize":
        spans = layer.attr("row_spans")
        if spans is not None:
            table = np.asarray(spans, dtype=np.int64).reshape(-1, 2)
            return table[lo, 0], table[hi - 1, 1]
        return lo // layer.scale_h, (hi - 1) // layer.scale_h + 1
    if height == layer.h_out:
        return lo, hi
    if height == 1:
        return np.zeros_like(lo), np.ones_like(hi)
    raise ValueError(f"layer {layer.name!r} ({layer.op}): input {index} has H={height} but the "
                     f"output has H={layer.h_out}; the tiler cannot map its rows")


def window_rows(out: Parts, kernel: int, stride: int, pad_top: int, dilation: int,
                height: int) -> Parts:
    """`backward_h.window_rows` (its rows) for every part: from the first to the last input row
    any tap of any output row touches inside the input; nothing where no tap does."""
    lo, hi = out
    first_row = np.full(lo.shape, np.iinfo(np.int64).max)
    last_row = np.full(lo.shape, -1)
    for tap in range(0, (kernel - 1) * dilation + 1, dilation):
        r = np.maximum(lo, -((tap - pad_top) // stride))  # the first row this tap reads >= 0
        at = r * stride - pad_top + tap
        first_row = np.where((r < hi) & (at < height), np.minimum(first_row, at), first_row)
        r = np.minimum(hi - 1, (height - 1 + pad_top - tap) // stride)  # the last < height
        at = r * stride - pad_top + tap
        last_row = np.where((r >= lo) & (at >= 0), np.maximum(last_row, at), last_row)
    none = (hi <= lo) | (last_row < 0)
    return np.where(none, 0, first_row), np.where(none, 0, last_row + 1)


def overlap(ranges: Parts) -> int:
    """`backward_h.overlap`: rows covered more than once (total length minus the union's)."""
    start, stop = ranges
    keep = stop > start
    start, stop = start[keep], stop[keep]
    if not start.size:
        return 0
    order = np.lexsort((stop, start))
    start, stop = start[order], stop[order]
    reach = np.concatenate([start[:1], np.maximum.accumulate(stop)[:-1]])
    union = np.maximum(0, stop - np.maximum(start, reach)).sum()
    return int((stop - start).sum() - union)
