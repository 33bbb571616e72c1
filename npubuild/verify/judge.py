"""Metrics of one tensor over every verify sample, and the verdict against thresholds.

One cosine over a whole tensor hides a dead channel, and one cosine per sample is meaningless
for a one-element tensor (always ±1) or a near-zero one (a text map of an image without text:
rounding noise decides it). So a tensor is judged by

- the similarity over all samples together (cosine, SQNR, max abs error) and the error relative
  to the reference's range (``range_error`` max, ``rms_range_error``);
- the worst sample's cosine, over the samples where a per-sample cosine means something: more
  than one element, and a reference RMS of at least ``QUIET`` × the tensor's RMS over all
  samples (the others count in the aggregate metrics only);
- per channel (``axis``: NCHW's 1 by default, -1 for a channels-last model's outputs), over
  all samples: the worst cosine of the channels spanning at least ``QUIET`` × the tensor's
  range, and the *dead* channels — constant in the deployed result while the reference's channel spans at least ``DEAD_SPAN`` × the
  tensor's range (below a quarter of an int8 step of the whole tensor: YOLOv8's class scores
  beside its box coordinates, all rounded to zero, are dead). A dead channel of an output or a
  slice fails; one of an NPU hand-over tensor is reported and fails only when
  ``verify.handover.dead_channels`` asks (a per-tensor int8 step hides a channel that spans
  less than it, and what matters is whether the outputs it feeds still pass).
"""

from __future__ import annotations

import math

import numpy as np

from npubuild.metrics import (Similarity, cosine_from_sums, finite_pairs, range_errors,
                              range_errors_from_sums, rms, similarity, similarity_from_sums)
from npubuild.verify.limits import Thresholds

QUIET = 0.05
DEAD_SPAN = 1e-3


def tensor_metrics(refs: list[np.ndarray], gots: list[np.ndarray], axis: int | None = 1,
                   kept: dict | None = None) -> dict:
    """Metrics of one tensor over every sample (``refs``/``gots``: one array per sample).
    Where a sample's deployed shape differs from the reference's (an output whose extent
    depends on its values: a decoding loop that stops on a token stops at another step), the
    figures are of the part both have, and ``shape_mismatch`` says where they differ.
    ``kept``: where the reference's own figures are kept between calls on the same reference
    arrays (`kept_reference`; the caller's promise: it never changes them in place)."""
    mismatched = [k for k, (r, g) in enumerate(zip(refs, gots)) if np.shape(r) != np.shape(g)]
    shapes = ({"samples": len(mismatched), "of": len(refs), "sample": mismatched[0],
               "reference": list(np.shape(refs[mismatched[0]])),
               "deployed": list(np.shape(gots[mismatched[0]]))} if mismatched else None)
    if mismatched:
        refs, gots = map(list, zip(*(common_part(r, g) for r, g in zip(refs, gots))))
        kept = None  # parts made for this call
    out = _finite_float_metrics(refs, gots, kept)
    if out is None:
        out = _metrics(refs, gots)
    rank = np.ndim(refs[0])
    if (axis is not None and rank >= 2 and -rank <= axis < rank and np.shape(refs[0])[axis] > 1
            and len({np.shape(r)[axis] for r in refs}) == 1):  # varying along it: no channels
        out.update(channel_metrics(refs, gots, axis, kept))
    if shapes:
        out["shape_mismatch"] = shapes
    return out


def _metrics(refs: list[np.ndarray], gots: list[np.ndarray]) -> dict:
    """`tensor_metrics`' figures but the channels', spelled as the metrics define them (any
    dtype, infinities and NaNs); `_finite_float_metrics` computes the same bytes faster."""
    ref = np.concatenate([np.ravel(r) for r in refs])
    got = np.concatenate([np.ravel(g) for g in gots])
    out = similarity(ref, got).as_dict()
    out["range_error"], out["rms_range_error"] = (_finite(v) for v in range_errors(ref, got))
    out["reference_peak"], out["deployed_peak"] = (_finite(_peak(v)) for v in (ref, got))
    whole = rms(ref)  # once: asked per sample, it was most of a judge's time on long outputs
    loud = {i: similarity(r, g).cosine for i, (r, g) in enumerate(zip(refs, gots))
            if np.size(r) > 1 and whole > 0 and rms(r) >= QUIET * whole}
    worst = min(loud, key=loud.get) if loud else None
    out["min_sample_cosine"] = None if worst is None else loud[worst]
    out["worst_sample"], out["samples_judged"] = worst, len(loud)
    return out


def _finite_float_metrics(refs: list[np.ndarray], gots: list[np.ndarray],
                          kept: dict | None = None) -> dict | None:
    """`_metrics`' figures, the same bytes, where every value is a finite float (None
    otherwise: `_metrics` then): each product summed once, over the whole tensor and over
    each sample's slice of it, where `_metrics` converts, subtracts and multiplies the same
    arrays again per figure and per sample (the precision search judges a long output tens of
    times: PP-OCRv5 rec's [1, 40, 18385] x 8 samples took 0.85 s a judge). The sums are
    NumPy's pairwise sums over the same contiguous runs (`metrics.dot`), so the same bits."""
    if not all(np.asarray(a).dtype.kind == "f" and np.asarray(a).dtype.itemsize <= 8
               for a in (*refs, *gots)):
        return None

    def reference() -> dict:
        ref = np.concatenate([np.ravel(r) for r in refs], dtype=np.float64)
        sizes = np.cumsum([0] + [np.size(r) for r in refs])
        spans = list(zip(sizes[:-1].tolist(), sizes[1:].tolist()))
        finite = bool(ref.size) and bool(np.isfinite(ref).all())
        squares = ref * ref if finite else None
        return {"ref": ref, "spans": spans, "finite": finite,
                "rr": float(np.sum(squares)) if finite else None,
                "rr_each": [float(np.sum(squares[a:b])) for a, b in spans] if finite else None,
                "max": float(ref.max()) if finite else None,
                "min": float(ref.min()) if finite else None}

    mine = kept_reference(kept, ("whole",), refs, reference)
    if not mine["finite"]:
        return None
    ref, spans = mine["ref"], mine["spans"]
    got = np.concatenate([np.ravel(g) for g in gots], dtype=np.float64)
    if not np.isfinite(got).all():
        return None
    # two scratch arrays for every product (a fresh array per product is a page fault per
    # page: a third of an element-wise pass's time on a long output)
    work, diff = np.empty_like(ref), np.empty_like(ref)

    def sums(product: np.ndarray) -> tuple[float, list[float]]:
        return (float(np.sum(product)),
                [float(np.sum(product[a:b])) for a, b in spans])

    rr, rr_each = mine["rr"], mine["rr_each"]
    gg, gg_each = sums(np.multiply(got, got, out=work))
    rg, rg_each = sums(np.multiply(ref, got, out=work))
    np.subtract(ref, got, out=diff)
    dd = float(np.sum(np.multiply(diff, diff, out=work)))
    ref_max, ref_min = mine["max"], mine["min"]
    got_max, got_min = float(got.max()), float(got.min())
    max_abs = float(np.max(np.abs(diff, out=work)))
    differs = max_abs > 0  # every difference, however small (its square may underflow)
    mid = np.divide(np.add(ref, got, out=work), 2, out=work)
    mid_sq = float(np.sum(np.multiply(mid, mid, out=diff)))
    del work, diff, mid
    scale = max(abs(ref_max), abs(ref_min))  # max |ref|: the same float, exactly
    out = Similarity(*similarity_from_sums(rr, gg, rg, dd, mid_sq, max_abs, scale),
                     not differs).as_dict()
    out["range_error"], out["rms_range_error"] = (
        (_finite(v) for v in range_errors_from_sums(max_abs, dd, ref.size, ref_max, ref_min))
        if differs else (0.0, 0.0))  # `range_errors`: no difference, no error
    out["reference_peak"] = _finite(scale)
    out["deployed_peak"] = _finite(max(abs(got_max), abs(got_min)))
    whole_rms = math.sqrt(rr / ref.size)
    loud = {i: cosine_from_sums(rr_each[i], gg_each[i], rg_each[i]) for i, (a, b) in enumerate(spans)
            if b - a > 1 and whole_rms > 0 and math.sqrt(rr_each[i] / (b - a)) >= QUIET * whole_rms}
    worst = min(loud, key=loud.get) if loud else None
    out["min_sample_cosine"] = None if worst is None else loud[worst]
    out["worst_sample"], out["samples_judged"] = worst, len(loud)
    return out


def common_part(ref: np.ndarray, got: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The leading part two arrays both have: per dimension the smaller extent (flattened
    first where their ranks differ)."""
    ref, got = np.asarray(ref), np.asarray(got)
    if ref.ndim != got.ndim:
        size = min(ref.size, got.size)
        return ref.ravel()[:size], got.ravel()[:size]
    box = tuple(slice(0, min(a, b)) for a, b in zip(ref.shape, got.shape))
    return ref[box], got[box]


def channel_metrics(refs: list[np.ndarray], gots: list[np.ndarray], axis: int,
                    kept: dict | None = None) -> dict:
    """The worst channel's cosine and the dead channels, over every sample (``kept``: as
    `tensor_metrics`')."""
    def reference() -> dict:
        ref = np.concatenate([np.moveaxis(np.asarray(r, np.float64), axis, 0).reshape(
            np.shape(r)[axis], -1) for r in refs], axis=1)
        spans = ref.max(axis=1) - ref.min(axis=1)
        full = float(ref.max() - ref.min()) if ref.size else 0.0
        judged = np.nonzero(spans >= QUIET * full)[0] if full else np.array([], np.int64)
        rows = _rows(ref, judged)
        return {"ref": rows, "spans": spans, "full": full, "judged": judged,
                "norms": np.sqrt(np.sum(rows * rows, axis=1))}

    mine = kept_reference(kept, ("channels", axis), refs, reference)
    spans, full, judged = mine["spans"], mine["full"], mine["judged"]
    got = np.concatenate([np.moveaxis(np.asarray(g, np.float64), axis, 0).reshape(
        np.shape(g)[axis], -1) for g in gots], axis=1)
    cosines = dict(zip(judged.tolist(), channel_cosines(mine["ref"], _rows(got, judged),
                                                        mine["norms"]).tolist()))
    return _channel_figures(axis, cosines, spans, full, lambda alive: (
        _rows(got, alive).max(axis=1) - _rows(got, alive).min(axis=1)))


def _channel_figures(axis: int, cosines: dict, spans: np.ndarray, full: float,
                     deployed_spans) -> dict:
    """`channel_metrics`' figures from each judged channel's cosine (``cosines``: by index),
    the reference channels' spans, the whole reference's span, and ``deployed_spans(alive)``:
    the deployed result's span of each channel of ``alive`` (an index array, not empty)."""
    alive = np.nonzero(spans >= DEAD_SPAN * full)[0] if full else np.array([], np.int64)
    deployed = deployed_spans(alive) if alive.size else np.array([])
    dead = [int(c) for c, k in zip(alive, deployed) if k == 0.0]
    worst = min(cosines, key=cosines.get) if cosines else None
    return {"channel_axis": axis, "channels_judged": len(cosines), "dead_channels": dead[:16],
            "dead_channel_count": len(dead),
            # how close the liveliest-at-risk channel is to dying: its span in the deployed
            # result over the reference's (0: dead)
            "min_channel_span_ratio": float(np.min(deployed / spans[alive])) if alive.size else None,
            "worst_channel": None if worst is None else {"index": worst, "cosine": cosines[worst]}}


KEPT_REFERENCE_BYTES = 256 << 20  # a longer reference's float64 copy is made per call


def kept_reference(kept: dict | None, what: tuple, refs: list[np.ndarray], compute) -> dict:
    """``compute()``: the reference's own figures (its float64 copy, its sums of squares ...),
    kept in ``kept`` for the next call on the same reference arrays (known by identity: the
    entry holds them, so no other array takes their ids). A precision search judges tens of
    choices against one reference: a third of each judge was the reference's side again."""
    if kept is None:
        return compute()
    key = (*what, *map(id, refs))
    hit = kept.get(key)
    if hit is not None and all(a is b for a, b in zip(hit[0], refs)):
        return hit[1]
    value = compute()
    if sum(np.size(r) for r in refs) * 8 <= KEPT_REFERENCE_BYTES:
        kept[key] = (tuple(refs), value)
    return value


def _rows(matrix: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """``matrix[rows]``, without the copy where ``rows`` is every row in order and the matrix
    is C-ordered already (usually: a copy of a long output's every channel cost as much as
    their cosines). C order as indexing gives it: row sums follow the memory layout."""
    return (np.ascontiguousarray(matrix) if np.array_equal(rows, np.arange(len(matrix)))
            else matrix[rows])


def channel_cosines(ref: np.ndarray, got: np.ndarray, ref_norm: np.ndarray | None = None
                    ) -> np.ndarray:
    """Each row's cosine (`npubuild.metrics.similarity`'s, for all rows at once: sums along
    the contiguous rows, pairwise as NumPy always sums; both zero → 1, one zero → 0);
    ``ref_norm``: the reference rows' norms where they are known already."""
    dots = np.sum(ref * got, axis=1)
    if ref_norm is None:
        ref_norm = np.sqrt(np.sum(ref * ref, axis=1))
    return _row_cosines(dots, ref_norm, np.sqrt(np.sum(got * got, axis=1)))


def _row_cosines(dots: np.ndarray, ref_norm: np.ndarray, got_norm: np.ndarray) -> np.ndarray:
    """Each row's cosine from its dot product and norms (both zero → 1, one zero → 0)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = dots / (ref_norm * got_norm)
    return np.where((ref_norm == 0) & (got_norm == 0), 1.0,
                    np.where((ref_norm == 0) | (got_norm == 0), 0.0, cos))


def _peak(values: np.ndarray) -> float:
    return float(np.max(np.abs(values), initial=0.0)) if np.size(values) else 0.0


def _all_rounded_away(m: dict) -> str:
    """Why a cosine of 0 is no accuracy figure: the deployed result is exactly zero where the
    reference is not (a map with nothing in it, as a seal detector on pages without seals,
    or values below the output's quantization step), so float or int16 elsewhere cannot
    change it; "" when that is not the case."""
    if m.get("deployed_peak") != 0.0 or not m.get("reference_peak"):
        return ""
    return (f"; the deployed result is 0 everywhere and the reference peaks at "
            f"{m['reference_peak']:.3g} over every sample: below what the output's quantization "
            f"resolves. If the verify data should make this output respond, they do not "
            f"(check verify.data); if these values matter, keep the output in int16 "
            f"(quantization.overrides)")


def _finite(value: float) -> float | None:
    return value if np.isfinite(value) else None


def failures(label: str, m: dict, limits: Thresholds, against: str = "") -> list[str]:
    """One line per threshold ``m`` misses (``label``: "output 'x'", "slice 'y'" ...)."""
    out, tail = [], f" ({against})" if against else ""
    shapes = m.get("shape_mismatch")
    if shapes:
        out.append(f"{label}: shape {shapes['deployed']} deployed where the reference has "
                   f"{shapes['reference']} (sample #{shapes['sample']}; {shapes['samples']} of "
                   f"{shapes['of']} samples differ): its extent depends on its values (a loop "
                   f"that stops on its own output stops elsewhere); the figures compare the part "
                   f"both have{tail}")
    if limits.min_cosine is not None and m["cosine"] is None:
        out.append(f"{label}: cosine undefined: the values are not finite (inf or NaN){tail}")
    elif limits.min_cosine is not None and m["cosine"] < limits.min_cosine:
        out.append(f"{label}: cosine {m['cosine']:.6f} < min_cosine {limits.min_cosine} "
                   f"over all samples{tail}{_all_rounded_away(m)}")
    elif (limits.sample_cosine is not None and m["min_sample_cosine"] is not None
          and m["min_sample_cosine"] < limits.sample_cosine):
        name = "min_cosine" if limits.min_sample_cosine is None else "min_sample_cosine"
        out.append(f"{label}: cosine {m['min_sample_cosine']:.6f} < {name} "
                   f"{limits.sample_cosine} on the worst sample (#{m['worst_sample']}; all "
                   f"samples: {m['cosine']:.6f}){tail}")
    if m.get("dead_channel_count") and limits.dead_channels is not False:
        out.append(f"{label}: {m['dead_channel_count']} dead channel(s) along axis "
                   f"{m['channel_axis']} (constant where the reference varies): "
                   f"{m['dead_channels']}{tail}")
    worst = m.get("worst_channel")
    if limits.min_channel_cosine is not None and worst and worst["cosine"] < limits.min_channel_cosine:
        out.append(f"{label}: channel {worst['index']} cosine {worst['cosine']:.6f} < "
                   f"min_channel_cosine {limits.min_channel_cosine}{tail}")
    if limits.min_sqnr_db is not None and m["sqnr_db"] is not None and m["sqnr_db"] < limits.min_sqnr_db:
        out.append(f"{label}: SQNR {m['sqnr_db']:.2f} dB < min_sqnr_db {limits.min_sqnr_db}{tail}")
    if limits.max_abs is not None and m["max_abs"] > limits.max_abs:
        out.append(f"{label}: max abs error {m['max_abs']:.4g} > max_abs {limits.max_abs}{tail}")
    error = m["range_error"]
    if limits.max_range_error is not None and (error is None or error > limits.max_range_error):
        shown = "unbounded" if error is None else f"{error:.4g}"
        out.append(f"{label}: max error {shown} of the reference's range > max_range_error "
                   f"{limits.max_range_error}{tail}")
    return out


PAIRWISE_BLOCK = 128  # NumPy's PW_BLOCKSIZE: a run this short is summed in one unrolled block


class PairwiseSums:
    """Sums along the last axis of a run of ``total`` values that arrive in consecutive
    chunks (each an array [..., width]), to the bit what ``np.sum(run, axis=-1)`` of the whole
    run gives: NumPy sums a contiguous run pairwise, halving it (rounded down to a multiple of
    8) until a part is at most `PAIRWISE_BLOCK` long, and that tree depends on the run's length
    alone. So every part of the tree that lies inside one chunk is that chunk's ``np.sum`` of
    the part, a short part that straddles chunks is summed once its pieces are all in, and the
    whole is the parts added as the tree adds them. Several quantities share the tree (``add``
    takes one chunk of each); memory: O(log total) partial sums and one short part's pieces."""

    def __init__(self, total: int):
        self.total, self.at = int(total), 0
        self.done: dict[tuple[int, int], list] = {}
        self.pieces: dict[tuple[int, int], list] = {}

    def add(self, *chunks: np.ndarray) -> None:
        c0 = self.at
        c1 = c0 + chunks[0].shape[-1]
        if c1 > self.total:
            raise ValueError(f"values past the run's {self.total}")

        def visit(s: int, n: int) -> None:
            e = s + n
            if e <= c0 or s >= c1 or n == 0:
                return
            if c0 <= s and e <= c1:
                self.done[(s, n)] = [np.sum(c[..., s - c0:e - c0], axis=-1) for c in chunks]
            elif n <= PAIRWISE_BLOCK:
                lo, hi = max(s, c0), min(e, c1)
                pieces = self.pieces.setdefault((s, n), [])
                pieces.append([np.array(c[..., lo - c0:hi - c0]) for c in chunks])
                if hi == e:
                    self.done[(s, n)] = [np.sum(np.concatenate(p, axis=-1), axis=-1)
                                         for p in zip(*self.pieces.pop((s, n)))]
            else:
                half = _pairwise_half(n)
                visit(s, half)
                visit(s + half, n - half)

        visit(0, self.total)
        self.at = c1

    def sums(self) -> list:
        """The whole run's sums (one per quantity ``add`` was given), once it is all in."""
        if self.at != self.total:
            raise ValueError(f"{self.at} of the run's {self.total} values summed")

        def value(s: int, n: int) -> list:
            if (s, n) in self.done:
                return self.done[(s, n)]
            half = _pairwise_half(n)
            return [a + b for a, b in zip(value(s, half), value(s + half, n - half))]

        return value(0, self.total)


def _pairwise_half(n: int) -> int:
    half = n // 2
    return half - half % 8


HELD_BYTES = 64 << 20  # samples held for the exceptions, over every tensor of a verify


class HeldBytes:
    """What the `TensorStream` objects of one verify may still hold of their samples' arrays
    (`HELD_BYTES` at first), shared among them."""

    def __init__(self, limit: int | None = None):
        self.left = HELD_BYTES if limit is None else limit


class TensorStream:
    """`tensor_metrics` of one tensor over ``count`` samples given one at a time (``add``),
    holding one sample's float64 copies and products, not every sample's: verify's judge of a
    3-D U-Net's 128³ x 8 hand-over tensors held 768 MiB of float64 per tensor and copy over six
    samples. The figures are `tensor_metrics`' bytes: the whole tensor's sums of products are
    summed as NumPy sums their concatenation (`PairwiseSums`, whose tree needs the run's length:
    ``count`` samples of the first one's size), each sample's and each channel's extremes are
    exact wherever taken. Where that does not hold (a sample of another size or shape, values
    that are not finite floats, another number of samples) the samples are judged by
    `tensor_metrics` itself, from their arrays, held while the verify's streams together hold
    at most `HELD_BYTES` (``budget``: what they share); past that, the whole tensor's sums are
    each sample's added in sample order (the last bits of cosine, euclid, SQNR and the RMS
    error may then differ from a pairwise sum over all)."""

    def __init__(self, count: int, axis: int | None = 1, budget: HeldBytes | None = None):
        self.count, self.axis, self.n = count, axis, 0
        self.held: tuple[list, list] | None = ([], [])
        self.held_bytes, self.budget = 0, budget or HeldBytes()
        self.exact = True  # finite floats, every sample the first one's size
        self.size = None
        self.whole: list[PairwiseSums] | None = None
        self.samples: list[dict] = []  # per sample: its sums and extremes (small)
        self.mismatch: dict | None = None
        self.channels: int | None = None
        self.rank: int | None = None
        self.channel_ok = True
        self.rows: list[PairwiseSums] | None = None
        self.channel_sums: list[np.ndarray] | None = None  # added in sample order
        self.channel_size = 0

    def add(self, ref: np.ndarray, got: np.ndarray) -> None:
        k, self.n = self.n, self.n + 1
        if self.held is not None:
            size = np.asarray(ref).nbytes + np.asarray(got).nbytes
            if size > self.budget.left:  # let go of them all: the rest may hold theirs
                self.budget.left += self.held_bytes
                self.held, self.held_bytes = None, 0
            else:
                self.budget.left -= size
                self.held_bytes += size
                self.held[0].append(ref)
                self.held[1].append(got)
        if np.shape(ref) != np.shape(got):
            if self.mismatch is None:
                self.mismatch = {"samples": 0, "sample": k, "reference": list(np.shape(ref)),
                                 "deployed": list(np.shape(got))}
            self.mismatch["samples"] += 1
            ref, got = common_part(ref, got)
        ref, got = np.asarray(ref), np.asarray(got)
        floats = all(a.dtype.kind == "f" and a.dtype.itemsize <= 8 for a in (ref, got))
        ref64, got64 = np.asarray(ref, np.float64), np.asarray(got, np.float64)
        r, g = ref64.ravel(), got64.ravel()
        if k == 0:
            self.size, self.rank = r.size, ref.ndim
            self.whole = [PairwiseSums(self.count * r.size) for _ in range(5)]
        finite = floats and bool(np.isfinite(r).all()) and bool(np.isfinite(g).all())
        self.exact = (self.exact and finite and r.size == self.size and k < self.count
                      and r.size > 0)
        self.samples.append(_sample_sums(r, g, finite, self.whole if self.exact else None))
        del r, g
        self._channels(ref64, got64, k)

    def _channels(self, ref: np.ndarray, got: np.ndarray, k: int) -> None:
        """Each channel's sums and extremes (``ref``, ``got``: the sample's float64 values)."""
        axis, rank = self.axis, ref.ndim
        if (not self.channel_ok or axis is None or rank < 2 or not -rank <= axis < rank
                or (k and rank != self.rank)):
            self.channel_ok = False
            return
        c = ref.shape[axis]
        if k == 0:
            self.channels = c
        if c != self.channels:
            self.channel_ok = False
            return
        # C order, as `channel_metrics` sums its rows (`_rows`): a row's sum follows the layout
        r = np.ascontiguousarray(np.moveaxis(ref, axis, 0).reshape(c, -1))
        g = np.ascontiguousarray(np.moveaxis(got, axis, 0).reshape(c, -1))
        if k == 0:
            self.rows = ([PairwiseSums(self.count * r.shape[1]) for _ in range(3)]
                         if self.exact else None)
            self.spans = [np.full(c, np.inf), np.full(c, -np.inf), np.full(c, np.inf),
                          np.full(c, -np.inf)]
        if not (self.exact and self.rows and r.shape[1] * self.count == self.rows[0].total):
            self.rows = None
        each = []
        for i, (x, y) in enumerate(((r, r), (g, g), (r, g))):  # one product at a time
            product = x * y
            if self.rows is not None:
                self.rows[i].add(product)
            each.append(np.sum(product, axis=1))
            del product
        self.channel_sums = each if self.channel_sums is None else [
            a + b for a, b in zip(self.channel_sums, each)]
        if r.shape[1]:
            self.spans = [np.minimum(self.spans[0], r.min(axis=1)),
                          np.maximum(self.spans[1], r.max(axis=1)),
                          np.minimum(self.spans[2], g.min(axis=1)),
                          np.maximum(self.spans[3], g.max(axis=1))]
        self.channel_size += r.size

    def metrics(self) -> dict:
        """`tensor_metrics`' figures of the samples added."""
        if self.n == 0:
            raise ValueError("no sample added")
        exact = self.exact and self.n == self.count
        if not exact and self.held is not None:
            return tensor_metrics(*self.held, self.axis)
        out = (_whole_exact(self.samples, [whole.sums()[0] for whole in self.whole]) if exact
               else _whole_in_order(self.samples))
        if self.channel_ok and self.channels > 1:
            out.update(self._channel_metrics(exact))
        if self.mismatch:
            out["shape_mismatch"] = {"samples": self.mismatch["samples"], "of": self.n,
                                     "sample": self.mismatch["sample"],
                                     "reference": self.mismatch["reference"],
                                     "deployed": self.mismatch["deployed"]}
        return out

    def _channel_metrics(self, exact: bool) -> dict:
        rr, gg, rg = ([rows.sums()[0] for rows in self.rows] if exact and self.rows is not None
                      else self.channel_sums)
        ref_min, ref_max, got_min, got_max = self.spans
        sized = bool(self.channel_size)
        spans = ref_max - ref_min
        full = float(ref_max.max() - ref_min.min()) if sized else 0.0
        judged = np.nonzero(spans >= QUIET * full)[0] if full else np.array([], np.int64)
        cos = _row_cosines(rg[judged], np.sqrt(rr[judged]), np.sqrt(gg[judged]))
        cosines = dict(zip(judged.tolist(), cos.tolist()))
        return _channel_figures(self.axis, cosines, spans, full,
                                lambda alive: got_max[alive] - got_min[alive])


def _sample_sums(r: np.ndarray, g: np.ndarray, finite: bool,
                 whole: list[PairwiseSums] | None) -> dict:
    """One sample's figures (``r``, ``g``: its float64 values), and its products into the
    whole tensor's sums (``whole``: Σ r², Σ g², Σ r·g, Σ (r − g)², Σ ((r + g)/2)²) where they
    are summed exactly; one product at a time."""
    agree = True
    if finite:
        fr, fg = r, g
    else:
        fr, fg, agree = finite_pairs(r, g)
    sums = []

    def summed(product: np.ndarray) -> None:
        if whole is not None:
            whole[len(sums)].add(product)
        sums.append(float(np.sum(product)))

    summed(fr * fr)
    summed(fg * fg)
    summed(fr * fg)
    diff = fr - fg
    summed(diff * diff)
    sized = bool(fr.size)
    max_abs = float(np.max(np.abs(diff))) if sized else None
    del diff
    mid = (fr + fg) / 2
    summed(mid * mid)
    del mid
    rr, gg, rg, dd, mm = sums
    return {"size": r.size, "finite_size": fr.size, "agree": agree,
            "identical": bool(np.array_equal(r, g, equal_nan=True)),
            "rr": rr, "gg": gg, "rg": rg, "dd": dd, "mm": mm, "max_abs": max_abs,
            "ref_max": float(fr.max()) if sized else None,
            "ref_min": float(fr.min()) if sized else None,
            "got_max": float(fg.max()) if sized else None,
            "got_min": float(fg.min()) if sized else None,
            "ref_peak": _peak(r), "got_peak": _peak(g),
            "squares": float(np.sum(r * r)) if not finite else rr,
            "cosine": cosine_from_sums(rr, gg, rg) if agree else 0.0}


def _whole_exact(samples: list[dict], sums: list) -> dict:
    """`_finite_float_metrics`' figures from the whole tensor's pairwise sums."""
    rr, gg, rg, dd, mid_sq = (float(s) for s in sums)
    size = sum(s["size"] for s in samples)
    ref_max = max(s["ref_max"] for s in samples if s["ref_max"] is not None)
    ref_min = min(s["ref_min"] for s in samples if s["ref_min"] is not None)
    got_max = max(s["got_max"] for s in samples if s["got_max"] is not None)
    got_min = min(s["got_min"] for s in samples if s["got_min"] is not None)
    max_abs = max(s["max_abs"] for s in samples if s["max_abs"] is not None)
    differs = max_abs > 0
    scale = max(abs(ref_max), abs(ref_min))
    out = Similarity(*similarity_from_sums(rr, gg, rg, dd, mid_sq, max_abs, scale),
                     not differs).as_dict()
    out["range_error"], out["rms_range_error"] = (
        (_finite(v) for v in range_errors_from_sums(max_abs, dd, size, ref_max, ref_min))
        if differs else (0.0, 0.0))
    out["reference_peak"] = _finite(scale)
    out["deployed_peak"] = _finite(max(abs(got_max), abs(got_min)))
    whole_rms = math.sqrt(rr / size)
    loud = {i: s["cosine"] for i, s in enumerate(samples)
            if s["size"] > 1 and whole_rms > 0
            and math.sqrt(s["rr"] / s["size"]) >= QUIET * whole_rms}
    return _worst_sample(out, loud)


def _whole_in_order(samples: list[dict]) -> dict:
    """`_metrics`' figures with the whole tensor's sums each sample's added in sample order."""
    if not all(s["agree"] for s in samples):
        out = Similarity(0.0, 0.0, -float("inf"), float("inf"), float("inf"), False).as_dict()
        out["range_error"] = out["rms_range_error"] = None
    else:
        rr, gg, rg, dd, mid_sq = (sum((s[k] for s in samples), 0.0)
                                  for k in ("rr", "gg", "rg", "dd", "mm"))
        sized = [s for s in samples if s["finite_size"]]
        max_abs = max((s["max_abs"] for s in sized), default=0.0)
        ref_max = max((s["ref_max"] for s in sized), default=0.0)
        ref_min = min((s["ref_min"] for s in sized), default=0.0)
        scale = max(abs(ref_max), abs(ref_min)) if sized else 0.0
        out = Similarity(*similarity_from_sums(rr, gg, rg, dd, mid_sq, max_abs, scale),
                         all(s["identical"] for s in samples)).as_dict()
        size = sum(s["finite_size"] for s in samples)
        errors = ((0.0, 0.0) if not size or max_abs == 0 else
                  range_errors_from_sums(max_abs, dd, size, ref_max, ref_min))
        out["range_error"], out["rms_range_error"] = (_finite(v) for v in errors)
    out["reference_peak"] = _finite(max(s["ref_peak"] for s in samples))
    out["deployed_peak"] = _finite(max(s["got_peak"] for s in samples))
    size = sum(s["size"] for s in samples)
    whole = math.sqrt(sum((s["squares"] for s in samples), 0.0) / size) if size else 0.0
    loud = {i: s["cosine"] for i, s in enumerate(samples)
            if s["size"] > 1 and whole > 0 and math.sqrt(s["squares"] / s["size"]) >= QUIET * whole}
    return _worst_sample(out, loud)


def _worst_sample(out: dict, loud: dict) -> dict:
    worst = min(loud, key=loud.get) if loud else None
    out["min_sample_cosine"] = None if worst is None else loud[worst]
    out["worst_sample"], out["samples_judged"] = worst, len(loud)
    return out
