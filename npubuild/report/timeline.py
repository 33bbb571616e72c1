"""The LMEM timeline of a layer group as inline SVG: buffers by timestep and address (every
buffer named on hover), sized to the page whatever the number of timesteps, and the bytes live
per lane over time against the chip's capacity. Read from ``compile/graph_<i>/plan.json``.
"""

from __future__ import annotations

import math
from html import escape

from npubuild.report.charts import WIDTH, svg, text

KIND_COLORS = {"activation": "#4e79a7", "weight": "#f28e2b", "scratch": "#59a14f"}
OTHER_COLOR = "#9c755f"


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
        body.append(text(left + plot_w, top - 6, f"addresses up to {_kib(span)} shown of "
                          f"{_kib(capacity)} per lane", "end", ' fill="#57606a"'))
    if bank_bytes and span // bank_bytes <= 64:
        for addr in range(0, span + 1, bank_bytes):
            body.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{y_addr(addr):.1f}" '
                        f'y2="{y_addr(addr):.1f}" stroke="#d0d7de" stroke-width="0.6"/>')
    for tick in _ticks(span, 5):
        body.append(text(left - 6, y_addr(tick) + 4, _kib(tick), "end"))
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
    body.append(text(14, top + plot_h / 2, "LMEM address per lane", "middle",
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
              text(left + plot_w - 4, y(capacity) + 13, f"capacity {_kib(capacity)} per lane",
                    "end", ' fill="#c62828"')] if scale >= capacity else
             [text(left + plot_w - 4, top + 13, f"capacity {_kib(capacity)} per lane: "
                    f"{peak / capacity:.0%} used at the peak", "end", ' fill="#57606a"')]),
           text(left + peak_t * sx + 4, y(peak) - 4,
                 f"peak {_kib(peak)} per lane at T{peak_t}", "start"),
           text(14, top + plot_h / 2, "live bytes/lane", "middle",
                 f' transform="rotate(-90 14 {top + plot_h / 2})"'),
           text(left - 6, y(0) + 4, "0", "end"),
           text(left - 6, y(scale) + 10, _kib(scale), "end")]
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
        out.append(text(x, y + 14, f"T{t}", "middle"))
    return out


def _legend(x: float, y: float) -> list[str]:
    out = []
    for i, (kind, color) in enumerate(KIND_COLORS.items()):
        out.append(f'<rect x="{x + i * 110}" y="{y - 10}" width="12" height="12" fill="{color}"/>')
        out.append(text(x + i * 110 + 16, y, kind))
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
