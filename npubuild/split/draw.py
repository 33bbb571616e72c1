"""``segments.svg``: the submodels in run order, for the report (hand-written SVG, no deps).

A bar shows each submodel's share of the nodes; below it one card per submodel gives its
device, node count, most frequent ops, boundary tensors and, for CPU submodels, the most
frequent reason its nodes left the NPU.
"""

from __future__ import annotations

from collections import Counter
from html import escape

COLOURS = {"npu": "#2e7d32", "cpu": "#9e9e9e"}
CARD_W, CARD_H, GAP, PAD = 200, 150, 24, 16


def segments_svg(cards: list[dict], title: str) -> str:
    """``cards``: per submodel {device, nodes: [op types], inputs, outputs, reasons: [str]}."""
    total = sum(len(c["nodes"]) for c in cards) or 1
    width = max(PAD * 2 + len(cards) * (CARD_W + GAP) - GAP, 480)
    height = PAD * 3 + 28 + 24 + CARD_H
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'font-family="sans-serif" font-size="12">',
           f'<text x="{PAD}" y="{PAD + 4}" font-size="14" font-weight="bold">{escape(title)}</text>']
    x, bar_y, bar_w = float(PAD), PAD + 16, width - 2 * PAD
    for i, card in enumerate(cards):
        w = bar_w * len(card["nodes"]) / total
        out.append(f'<rect x="{x:.1f}" y="{bar_y}" width="{max(w, 1):.1f}" height="20" '
                   f'fill="{COLOURS[card["device"]]}" stroke="white"><title>graph_{i}: '
                   f'{_count(card["nodes"])}</title></rect>')
        x += w
    top = bar_y + 20 + PAD + 8
    for i, card in enumerate(cards):
        out += _card(i, card, PAD + i * (CARD_W + GAP), top)
        if i:
            ax = PAD + i * (CARD_W + GAP)
            out.append(f'<path d="M{ax - GAP + 2},{top + CARD_H / 2} h{GAP - 6}" '
                       'stroke="black" marker-end="url(#a)"/>')
    out.insert(1, '<defs><marker id="a" viewBox="0 0 6 6" refX="5" refY="3" markerWidth="6" '
                  'markerHeight="6" orient="auto"><path d="M0,0 L6,3 L0,6 z"/></marker></defs>')
    return "\n".join(out + ["</svg>"]) + "\n"


def _card(i: int, card: dict, x: float, y: float) -> list[str]:
    colour = COLOURS[card["device"]]
    ops = ", ".join(f"{op}×{n}" for op, n in Counter(card["nodes"]).most_common(3))
    lines = [(f"graph_{i} · {card['device'].upper()}", "bold"),
             (_count(card["nodes"]), ""), (_clip(ops), ""),
             (f"in {len(card['inputs'])} · out {len(card['outputs'])} tensors", "")]
    if card["reasons"]:
        reason, n = Counter(card["reasons"]).most_common(1)[0]
        lines += [("why CPU (most often):", "bold"), (_clip(reason), ""), (_clip(reason, 28), "")]
    out = [f'<rect x="{x}" y="{y}" width="{CARD_W}" height="{CARD_H}" rx="6" fill="white" '
           f'stroke="{colour}" stroke-width="3"/>']
    for k, (text, weight) in enumerate(lines):
        bold = ' font-weight="bold"' if weight else ""
        if text:
            out.append(f'<text x="{x + 8}" y="{y + 20 + 16 * k}"{bold}>{escape(text)}</text>')
    return out


def _count(nodes: list) -> str:
    return f"{len(nodes)} node{'s' * (len(nodes) != 1)}"


def _clip(text: str, start: int = 0, width: int = 28) -> str:
    part = text[start:start + width]
    return part + ("…" if len(text) > start + width else "")
