"""The LMEM allocation timeline of a group as SVG (seed 001's figures): timestep × address.

Each buffer is a rectangle from its first to its last timestep (resident weights run to the end,
hatched) and from its address to address + size, labelled with its id. Dashed lines mark banks.
Hand-written SVG: no plotting library, byte-stable output.
"""

from __future__ import annotations

from html import escape
from pathlib import Path

from npubuild.atomic import write_text
from npubuild.npu.layer_group import GroupPlan
from npubuild.npu.program import Program
from npubuild.targets.model import Chip

COLORS = {"activation": "#4e79a7", "weight": "#f28e2b", "scratch": "#59a14f"}
STEP_W, PLOT_H, LEFT, TOP, BOTTOM, RIGHT = 44, 360, 78, 40, 46, 120


def timeline_svg(plan: GroupPlan, chip: Chip, title: str = "") -> str:
    steps, capacity = plan.schedule.timesteps, chip.lmem_bytes_per_lane
    width, height = LEFT + steps * STEP_W + RIGHT, TOP + PLOT_H + BOTTOM

    def y(addr: float) -> float:
        return TOP + PLOT_H - addr / capacity * PLOT_H

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
             f'font-family="sans-serif" font-size="10">',
             '<defs><pattern id="resident" width="6" height="6" patternUnits="userSpaceOnUse" '
             'patternTransform="rotate(45)"><line x1="0" y1="0" x2="0" y2="6" stroke="white" '
             'stroke-width="2" opacity="0.6"/></pattern></defs>',
             f'<text x="{LEFT}" y="16" font-size="12">{escape(title)}</text>',
             f'<rect x="{LEFT}" y="{TOP}" width="{steps * STEP_W}" height="{PLOT_H}" '
             'fill="none" stroke="black"/>']
    parts += _axes(steps, capacity, chip.bank_bytes, y)
    for buf in plan.buffers:
        parts += _rect(buf, plan.placement.addresses[buf.id], steps, y)
    parts += _legend(LEFT + steps * STEP_W + 12)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def _axes(steps: int, capacity: int, bank: int, y) -> list[str]:
    out = []
    for t in range(steps):
        out.append(f'<text x="{LEFT + (t + 0.5) * STEP_W:.1f}" y="{TOP + PLOT_H + 14}" '
                   f'text-anchor="middle">T{t}</text>')
    out.append(f'<text x="{LEFT + steps * STEP_W / 2:.1f}" y="{TOP + PLOT_H + 34}" '
               'text-anchor="middle">timestep</text>')
    for addr in range(0, capacity + 1, bank):
        out.append(f'<line x1="{LEFT}" x2="{LEFT + steps * STEP_W}" y1="{y(addr):.1f}" '
                   f'y2="{y(addr):.1f}" stroke="#999" stroke-dasharray="3,3"/>')
        out.append(f'<text x="{LEFT - 4}" y="{y(addr) + 3:.1f}" text-anchor="end">{addr}</text>')
    out.append(f'<text x="12" y="{TOP + PLOT_H / 2}" transform="rotate(-90 12 {TOP + PLOT_H / 2})"'
               ' text-anchor="middle">LMEM address per lane (bytes; dashed: banks)</text>')
    return out


def _rect(buf, addr: int, steps: int, y) -> list[str]:
    end = steps - 1 if buf.resident else buf.end
    x0, x1 = LEFT + buf.start * STEP_W, LEFT + (end + 1) * STEP_W
    y0, y1 = y(addr + buf.size), y(addr)
    life = f"T{buf.start}..{'inf' if buf.resident else f'T{buf.end}'}"
    tip = escape(f"#{buf.id} {buf.kind} {buf.name} [{life}] @{addr} +{buf.size}B")
    out = [f'<g><title>{tip}</title><rect x="{x0 + 1}" y="{y0:.1f}" width="{x1 - x0 - 2}" '
           f'height="{max(y1 - y0, 0.5):.1f}" fill="{COLORS[buf.kind]}" stroke="black" '
           'stroke-width="0.5"/>']
    if buf.resident:
        out.append(f'<rect x="{x0 + 1}" y="{y0:.1f}" width="{x1 - x0 - 2}" '
                   f'height="{max(y1 - y0, 0.5):.1f}" fill="url(#resident)"/>')
    if y1 - y0 >= 11:
        out.append(f'<text x="{(x0 + x1) / 2:.1f}" y="{(y0 + y1) / 2 + 3:.1f}" fill="white" '
                   f'text-anchor="middle">{buf.id}</text>')
    out.append("</g>")
    return out


def _legend(x: int) -> list[str]:
    out = []
    for i, (kind, color) in enumerate([*COLORS.items(), ("resident", None)]):
        yy = TOP + i * 18
        fill = color or COLORS["weight"]
        out.append(f'<rect x="{x}" y="{yy}" width="12" height="12" fill="{fill}"/>')
        if color is None:
            out.append(f'<rect x="{x}" y="{yy}" width="12" height="12" fill="url(#resident)"/>')
        out.append(f'<text x="{x + 16}" y="{yy + 10}">{kind}</text>')
    return out


def write_timelines(program: Program, directory: str | Path) -> list[Path]:
    """One ``lmem_group_<i>.svg`` per NPU group."""
    paths = []
    for group in program.npu_groups:
        plan = group.plan
        title = (f"group {group.index}: {len(plan.group)} layers, {plan.slicing}, "
                 f"peak {plan.placement.peak} B/lane of {program.chip.lmem_bytes_per_lane}")
        path = Path(directory) / f"lmem_group_{group.index}.svg"
        paths.append(write_text(path, timeline_svg(plan, program.chip, title)))
    return paths
