"""Inline SVG charts for the report: the per-layer error in network order and calibration
histograms (`npubuild.report.timeline` draws LMEM). Hand-written SVG (no plotting library):
sized by ``viewBox`` so it scales to the page, every mark with a ``<title>`` so a hover names
it, byte-stable for equal input.
"""

from __future__ import annotations

import math
from html import escape
from typing import Any

WIDTH = 1160


def svg(width: float, height: float, body: list[str], label: str, natural: bool = False) -> str:
    """An SVG scaled to the page's width (``natural``: drawn at its own size, never smaller,
    for a picture whose text must stay readable; its container scrolls)."""
    cls = "chart natural" if natural else "chart"
    return (f'<svg class="{cls}" viewBox="0 0 {width:.0f} {height:.0f}" width="{width:.0f}" '
            f'height="{height:.0f}" role="img" aria-label="{escape(label)}" '
            'xmlns="http://www.w3.org/2000/svg">' + "".join(body) + "</svg>")


def text(x: float, y: float, text: str, anchor: str = "start", extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}" text-anchor="{anchor}"{extra}>{escape(text)}</text>'


LOW, LOWER = "#e0a100", "#9a5b00"  # reported-only low values: amber, never a verdict's red


# -- per-layer error -----------------------------------------------------------------------------
def layer_error_chart(rows: list[dict], threshold: float | None = None) -> str:
    """One bar per tensor in network order, height = 1 − cosine on a log axis (so 0.999 and
    0.9999 are apart), coloured as the table (reported only: dark amber < 0.9, amber < 0.99,
    never a judged failure's red)."""
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
        body.append(text(left - 6, y(10 ** e) + 4, f"1e{e}" if e else "1", "end"))
    if threshold is not None and threshold < 1:
        ty = y(1 - threshold)
        body.append(f'<line x1="{left}" x2="{left + plot_w}" y1="{ty:.1f}" y2="{ty:.1f}" '
                    'stroke="#c62828" stroke-width="1"/>')
        body.append(text(left + plot_w, top + plot_h + 32,
                          f"red line: verify's min_cosine {threshold!r}, which judges the model outputs, "
                          "not these layers",
                          "end", ' fill="#c62828"'))
    base = y(10 ** lo_exp)
    for i, r in enumerate(values):
        err = 1 - float(r["cosine"])
        top_y = y(err)
        color = LOWER if r["cosine"] < 0.9 else LOW if r["cosine"] < 0.99 else "#4e79a7"
        tip = (f"#{i + 1} {r.get('tensor')} ({r.get('kind', '?')}, {r.get('graph', '')}): "
               f"cosine {r['cosine']:.6f}, SQNR {_num(r.get('sqnr_db'))} dB")
        body.append(f'<rect x="{left + i * step:.2f}" y="{top_y:.1f}" width="{max(step - 0.6, 0.6):.2f}" '
                    f'height="{max(base - top_y, 0.8):.1f}" fill="{color}"><title>{escape(tip)}'
                    "</title></rect>")
    body.append(text(left, top + plot_h + 16, "input", "start"))
    body.append(text(left + plot_w, top + plot_h + 16, "output", "end"))
    body.append(text(left + plot_w / 2, top + plot_h + 16,
                      f"{len(values)} NPU tensors in network order (hover a bar for its name)", "middle"))
    body.append(text(14, top + plot_h / 2, "1 − mean cosine per sample (log)", "middle",
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
    body = [text(left, 13, _clip_middle(name, 52), extra=' font-weight="600"'),
            text(left, 27, f"cosine {row.get('cosine', 0):.6f} · {row.get('kind', '')} · "
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
    body += [text(left, top + plot_h + 14, f"{lo:.4g}"),
             text(left + plot_w, top + plot_h + 14, f"{hi:.4g}", "end"),
             text(left + plot_w / 2, top + plot_h + 14, "quantized range", "middle",
                   ' fill="#57606a"'),
             text(left, top + plot_h + 30,
                   f"seen {hist.get('min', 0):.4g} … {hist.get('max', 0):.4g}; clipped "
                   f"{clipped:.3%} ({hist.get('below', 0):,} below, {hist.get('above', 0):,} above)",
                   extra=' fill="#c62828"' if clipped > 0.001 else "")]
    return svg(width, height, body, f"calibration histogram of {name}")


def _clip_middle(text: str, keep: int) -> str:
    return text if len(text) <= keep else text[: keep // 2 - 1] + "…" + text[-(keep // 2):]
