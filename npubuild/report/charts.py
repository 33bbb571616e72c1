"""Inline SVG charts for the report: the per-layer error in network order and the LMEM
timeline of a layer group with its memory-over-time curve. Hand-written SVG (no plotting
library): sized by ``viewBox`` so it scales to the page, every mark with a ``<title>`` so a
hover names it, byte-stable for equal input.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

WIDTH = 1160
KIND_COLORS = {"activation": "#4e79a7", "weight": "#f28e2b", "scratch": "#59a14f"}
OTHER_COLOR = "#9c755f"


def svg(width: float, height: float, body: list[str], label: str) -> str:
    return (f'<svg class="chart" viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" '
            f'role="img" aria-label="{escape(label)}" xmlns="http://www.w3.org/2000/svg">'
            + "".join(body) + "</svg>")


def _text(x: float, y: float, text: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{extra}>{escape(text)}</text>'


# -- per-layer error -----------------------------------------------------------------------------
def layer_error_chart(rows: list[dict], threshold: float | None = None) -> str:
    """One bar per tensor in network order, height = 1 − cosine on a log axis (so 0.999 and
    0.9999 are apart), coloured as the table (red < 0.9, amber < 0.99)."""
    values = [r for r in rows if isinstance(r.get("cosine"), (int, float))]
    if not values:
        return ""
    left, top, plot_h, bottom = 58, 14, 220, 40
    plot_w = WIDTH - left - 12
    lo_exp, hi_exp = -6, 0  # 1 − cosine from 1e-6 to 1

    def y(err: float) -> float:
        e = min(max(math.log10(max(err, 10 ** lo_exp)), lo_exp), hi_exp)
        return top + plot_h * (hi_exp - e) / (hi_exp - lo_exp)

    step = plot_w / len(values)
    body = []
    for e in range(lo_exp, hi_exp + 1):
        body.append(f'<line class="axis" x1="{left}" x2="{left + plot_w}" y1="{y(10 ** e):.1f}" '
                    f'y2="{y(10 ** e):.1f}" stroke-dasharray="2,3" stroke-width="0.6"/>')
        body.append(_text(left - 6, y(10 ** e) + 4, f"1e{e}" if e else "1", "end"))
    if threshold is not None and threshold < 1:
        ty = y(1 - threshold)
        body.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{ty:.1f}" y2="{ty:.1f}" '
                    'stroke="#c62828" stroke-width="1"/>')
        body.append(_text(left + plot_w, top + plot_h + 32,
                          f"red line: verify's min_cosine {threshold!r} (it applies to outputs)",
                          "end", ' fill="#c62828"'))
    base = y(10 ** lo_exp)
    for i, r in enumerate(values):
        err = 1 - float(r["cosine"])
        top_y = y(err)
        color = "#c62828" if r["cosine"] < 0.9 else "#e0a100" if r["cosine"] < 0.99 else "#4e79a7"
        tip = (f"#{i + 1} {r.get('tensor')} ({r.get('kind', '?')}, {r.get('graph', '')}): "
               f"cosine {r['cosine']:.6f}, SQNR {_num(r.get('sqnr_db'))} dB")
        body.append(f'<rect x="{left + i * step:.2f}" y="{top_y:.1f}" width="{max(step - 0.6, 0.6):.2f}" '
                    f'height="{max(base - top_y, 0.8):.1f}" fill="{color}"><title>{escape(tip)}'
                    "</title></rect>")
    body.append(_text(left, top + plot_h + 16, "input", "start"))
    body.append(_text(left + plot_w, top + plot_h + 16, "output", "end"))
    body.append(_text(left + plot_w / 2, top + plot_h + 16,
                      f"{len(values)} NPU tensors in network order (hover a bar for its name)", "middle"))
    body.append(_text(14, top + plot_h / 2, "1 − cosine vs float (log)", "middle",
                      f' transform="rotate(-90 14 {top + plot_h / 2})"'))
    return svg(WIDTH, top + plot_h + bottom, body, "per-layer error chart")


def _num(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, (int, float)) else "—"


# -- calibration histograms --------------------------------------------------------------------
def histogram_chart(row: dict) -> str:
    """One tensor's float values over its quantized range (log counts), with what the range
    clips on either side: a range too wide wastes levels, too narrow clips."""
    hist = row.get("histogram") or {}
    counts, span = hist.get("counts"), hist.get("range")
    if not counts or not span or len(span) != 2:
        return ""
    width, height, left, top, plot_h = 372, 170, 10, 34, 96
    plot_w = width - 2 * left
    peak = math.log10(1 + max(counts)) or 1.0
    step = plot_w / len(counts)
    name = str(row.get("tensor"))
    body = [_text(left, 13, _clip_middle(name, 52), extra=' font-weight="600"'),
            _text(left, 27, f"cosine {row.get('cosine', 0):.6f} · {row.get('kind', '')} · "
                  f"{row.get('graph', '')}", extra=' fill="#57606a"'),
            f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fbfbfb" '
            'stroke="#d0d7de"/>']
    lo, hi = span
    for i, c in enumerate(counts):
        h = math.log10(1 + c) / peak * plot_h
        a, b = lo + (hi - lo) * i / len(counts), lo + (hi - lo) * (i + 1) / len(counts)
        body.append(f'<rect x="{left + i * step:.1f}" y="{top + plot_h - h:.1f}" '
                    f'width="{max(step - 0.5, 0.5):.1f}" height="{h:.1f}" fill="#4e79a7">'
                    f"<title>[{a:.4g}, {b:.4g}): {c:,} values</title></rect>")
    total = sum(counts) + hist.get("below", 0) + hist.get("above", 0)
    clipped = (hist.get("below", 0) + hist.get("above", 0)) / total if total else 0.0
    body += [_text(left, top + plot_h + 14, f"{lo:.4g}"),
             _text(left + plot_w, top + plot_h + 14, f"{hi:.4g}", "end"),
             _text(left + plot_w / 2, top + plot_h + 14, "quantized range", "middle",
                   ' fill="#57606a"'),
             _text(left, top + plot_h + 30,
                   f"seen {hist.get('min', 0):.4g} … {hist.get('max', 0):.4g}; clipped "
                   f"{clipped:.3%} ({hist.get('below', 0):,} below, {hist.get('above', 0):,} above)",
                   extra=' fill="#c62828"' if clipped > 0.001 else "")]
    return svg(width, height, body, f"calibration histogram of {name}")


def _clip_middle(text: str, keep: int) -> str:
    return text if len(text) <= keep else text[: keep // 2 - 1] + "…" + text[-(keep // 2):]


# -- LMEM timeline -------------------------------------------------------------------------------
def lmem_timeline(group: dict, capacity: int, bank_bytes: int | None = None) -> str:
    """Buffers of one layer group: x = timestep, y = LMEM address per lane; then the bytes
    live per lane over time against the capacity."""
    buffers = [b for b in group.get("buffers") or [] if _lifetime(b)]
    steps = int(group.get("timesteps") or 0) or max((_lifetime(b)[1] + 1 for b in buffers), default=0)
    if not buffers or not steps or not capacity:
        return ""
    left, top, plot_h, gap, curve_h = 74, 22, 300, 46, 120
    plot_w = WIDTH - left - 14
    sx = plot_w / steps
    span = axis_limit(max(b["addr"] + b["bytes_per_lane"] for b in buffers), capacity)

    def y_addr(addr: float) -> float:
        return top + plot_h - addr / span * plot_h

    body = [f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fbfbfb" '
            'stroke="#8c959f"/>']
    if span < capacity:
        body.append(_text(left + plot_w, top - 6, f"addresses up to {_kib(span)} shown of "
                          f"{_kib(capacity)} per lane", "end", ' fill="#57606a"'))
    if bank_bytes and span // bank_bytes <= 64:
        for addr in range(0, span + 1, bank_bytes):
            body.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y_addr(addr):.1f}" '
                        f'y2="{y_addr(addr):.1f}" stroke="#d0d7de" stroke-width="0.6"/>')
    for tick in _ticks(span, 5):
        body.append(_text(left - 6, y_addr(tick) + 4, _kib(tick), "end"))
    for b in sorted(buffers, key=lambda b: b["id"]):
        start, end = _lifetime(b)
        y0, y1 = y_addr(b["addr"] + b["bytes_per_lane"]), y_addr(b["addr"])
        color = KIND_COLORS.get(b.get("kind"), OTHER_COLOR)
        tip = (f"buffer #{b['id']} {b.get('kind')} {b.get('name')}"
               + (f" (layer {b['layer']})" if b.get("layer") else "")
               + f": T{start}–T{end}, address {b['addr']:,} + {b['bytes_per_lane']:,} B per lane")
        body.append(f'<rect x="{left + start * sx:.2f}" y="{y0:.2f}" '
                    f'width="{max((end - start + 1) * sx - 0.4, 0.6):.2f}" '
                    f'height="{max(y1 - y0, 0.8):.2f}" fill="{color}" fill-opacity="0.85">'
                    f"<title>{escape(tip)}</title></rect>")
    body.append(_text(14, top + plot_h / 2, "LMEM address per lane", "middle",
                      f' transform="rotate(-90 14 {top + plot_h / 2})"'))
    body += _time_axis(left, top + plot_h, plot_w, steps)
    body += _legend(left, top + plot_h + 34)
    body += _live_curve(buffers, steps, capacity, left, top + plot_h + gap + 12, plot_w, curve_h)
    height = top + plot_h + gap + 12 + curve_h + 30
    return svg(WIDTH, height, body, f"LMEM timeline of group {group.get('index')}")


def _lifetime(buffer: dict) -> tuple[int, int] | None:
    life = buffer.get("lifetime")
    if (isinstance(life, (list, tuple)) and len(life) == 2
            and all(isinstance(v, int) for v in life) and isinstance(buffer.get("addr"), int)
            and isinstance(buffer.get("bytes_per_lane"), int)):
        return int(life[0]), int(life[1])
    return None


def live_bytes(buffers: list[dict], steps: int) -> list[int]:
    """Bytes per lane held by live buffers at every timestep (a buffer lives from its first to
    its last timestep, both included)."""
    live = [0] * steps
    for b in buffers:
        start, end = _lifetime(b)
        for t in range(max(start, 0), min(end, steps - 1) + 1):
            live[t] += b["bytes_per_lane"]
    return live


def _live_curve(buffers, steps, capacity, left, top, plot_w, plot_h) -> list[str]:
    live = live_bytes(buffers, steps)
    peak = max(live)
    scale = axis_limit(peak, capacity)
    sx = plot_w / steps

    def y(v: float) -> float:
        return top + plot_h - v / scale * plot_h

    points = " ".join(f"{left + t * sx:.2f},{y(v):.2f} {left + (t + 1) * sx:.2f},{y(v):.2f}"
                      for t, v in enumerate(live))
    peak_t = live.index(peak)
    out = [f'<rect x="{left}" y="{top}" width="{plot_w}" height="{plot_h}" fill="#fbfbfb" '
           'stroke="#8c959f"/>',
           f'<polygon points="{left:.2f},{y(0):.2f} {points} {left + plot_w:.2f},{y(0):.2f}" '
           'fill="#4e79a7" fill-opacity="0.25" stroke="#4e79a7" stroke-width="1"/>',
           *([f'<line x1="{left}" x2="{left + plot_w}" y1="{y(capacity):.1f}" '
              f'y2="{y(capacity):.1f}" stroke="#c62828" stroke-dasharray="4,3"/>',
              _text(left + plot_w - 4, y(capacity) + 13, f"capacity {_kib(capacity)} per lane",
                    "end", ' fill="#c62828"')] if scale >= capacity else
             [_text(left + plot_w - 4, top + 13, f"capacity {_kib(capacity)} per lane: "
                    f"{peak / capacity:.0%} used at the peak", "end", ' fill="#57606a"')]),
           _text(left + peak_t * sx + 4, y(peak) - 4,
                 f"peak {_kib(peak)} per lane at T{peak_t}", "start"),
           _text(14, top + plot_h / 2, "live bytes/lane", "middle",
                 f' transform="rotate(-90 14 {top + plot_h / 2})"'),
           _text(left - 6, y(0) + 4, "0", "end"),
           _text(left - 6, y(scale) + 10, _kib(scale), "end")]
    for t, v in enumerate(live):  # hover targets: one column per timestep
        out.append(f'<rect x="{left + t * sx:.2f}" y="{top}" width="{sx:.2f}" height="{plot_h}" '
                   f'fill="transparent"><title>T{t}: {v:,} B per lane live</title></rect>')
    out += _time_axis(left, top + plot_h, plot_w, steps)
    return out


def axis_limit(used: int, capacity: int) -> int:
    """The capacity, or a round value above ``used`` when it fills less than half of it (so a
    small working set is not a sliver at the bottom)."""
    if used > capacity / 2:
        return max(capacity, used)
    step = 2 ** max(int(math.log2(max(used, 1))) - 2, 0)
    return min(capacity, -(-int(used * 1.1) // step) * step)


def _time_axis(left: float, y: float, plot_w: float, steps: int) -> list[str]:
    out = []
    for t in _ticks(steps, 12):
        x = left + (t + 0.5) * plot_w / steps if t < steps else left + plot_w
        out.append(_text(x, y + 14, f"T{t}", "middle"))
    return out


def _legend(x: float, y: float) -> list[str]:
    out = []
    for i, (kind, color) in enumerate(KIND_COLORS.items()):
        out.append(f'<rect x="{x + i * 110}" y="{y - 10}" width="12" height="12" fill="{color}"/>')
        out.append(_text(x + i * 110 + 16, y, kind))
    return out


def _ticks(limit: int, count: int) -> list[int]:
    """Round tick values from 0 to ``limit`` (about ``count`` of them)."""
    if limit <= 0:
        return [0]
    raw = limit / count
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    if limit >= 1024 and step >= 1000:  # bytes: use binary steps
        step = 2 ** round(math.log2(raw))
    return [int(i * step) for i in range(int(limit // step) + 1)]


def _kib(n: float) -> str:
    return f"{n / 1024:,.0f} KiB" if n >= 1024 else f"{n:,.0f} B"
