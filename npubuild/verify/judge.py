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

from npubuild.metrics import (Similarity, cosine_from_sums, range_errors,
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
    alive = np.nonzero(spans >= DEAD_SPAN * full)[0] if full else np.array([], np.int64)
    deployed = (_rows(got, alive).max(axis=1) - _rows(got, alive).min(axis=1) if alive.size
                else np.array([]))
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
    got_norm = np.sqrt(np.sum(got * got, axis=1))
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
