"""The row a reviewer reads first: verdict, worst cosines, fps, NPU coverage, GMEM, LMEM peak.

Every tile reads ``report.json`` (the stages' figures) and ``verify/verify.json`` leniently:
a figure a build does not have yet shows as "—" with the stage that would give it.
"""

from __future__ import annotations

from typing import Any

from npubuild.report.artifacts import BuildArtifacts
from npubuild.report.html import esc, fmt

COSINE_GROUPS = (("output", ("outputs",)), ("NPU hand-over", ("npu_outputs",)),
                 ("slice", ("slices",)))


def exact(value: Any) -> str:
    """A threshold as the recipe wrote it (0.99995 stays 0.99995, never rounded to 1)."""
    return repr(value) if isinstance(value, float) else fmt(value)


def cosine_text(value: Any) -> str:
    return f"{value:.6f}" if isinstance(value, (int, float)) else "—"


def worst_cosines(a: BuildArtifacts) -> list[tuple[str, str, float | None, float | None]]:
    """(group, name, worst-sample cosine, all-samples cosine) for every output, NPU hand-over
    and slice verify (or, before verify, quantize) recorded; worst first within a group."""
    verify = a.json("verify/verify.json") or {}
    sources = {"outputs": verify.get("outputs") or (a.report.get("accuracy") or {}).get("outputs"),
               "npu_outputs": verify.get("npu_outputs"),
               "slices": verify.get("slices") or (a.report.get("verify") or {}).get("slices")}
    rows = []
    for group, (key,) in COSINE_GROUPS:
        items = sources.get(key) or {}
        if isinstance(items, list):  # slices may come as a list of {name, cosine, ...}
            items = {str(i.get("name", n)): i for n, i in enumerate(items) if isinstance(i, dict)}
        found = [(group, str(name), _num(m.get("min_sample_cosine", m.get("cosine"))),
                  _num(m.get("cosine"))) for name, m in items.items() if isinstance(m, dict)]
        rows += sorted(found, key=lambda r: (r[2] is None, r[2] or 0.0))
    return rows


def _num(v: Any) -> float | None:
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else None


def tiles(a: BuildArtifacts, verdict: tuple[str, str], limits: dict) -> list[tuple[str, str, str]]:
    """(title, big value HTML, detail HTML) per tile."""
    report = a.report
    split, estimate = report.get("split") or {}, report.get("estimate") or {}
    kind, text = verdict
    limit_text = ", ".join(f"{k} {exact(v)}" for k, v in limits.items()) or "no thresholds"
    task = (a.json("verify/verify.json") or {}).get("task")
    if isinstance(task, dict) and isinstance(task.get("agreement"), (int, float)):
        limit_text += f"; {task.get('agreement_is', 'task agreement')} {task['agreement']:.3f}"
    out = [("verdict", f'<span class="badge big {esc(kind)}">{esc(text)}</span>', esc(limit_text))]
    cosines = worst_cosines(a)
    if cosines:
        worst = min((c for c in cosines if c[2] is not None), key=lambda c: c[2], default=None)
        lines = ('<table class="mini"><tr><th></th><th>worst image</th><th>all</th></tr>' + "".join(
            f'<tr class="{_judge(c[2], limits)}"><td title="{esc(c[0])} {esc(c[1])}">'
            f"<code>{esc(_short(c[1]))}</code></td><td>{esc(cosine_text(c[2]))}</td>"
            f'<td class="muted">{esc(cosine_text(c[3]))}</td></tr>' for c in cosines) + "</table>")
        out.append(("worst cosine (worst image)", esc(cosine_text(worst[2] if worst else None)),
                    lines))
    else:
        out.append(("worst cosine", "—", "verify not built"))
    out.append(("fps (NPU estimate)", esc(fmt(estimate.get("fps"))),
                f"<div>{esc(fmt(estimate.get('cycles')))} cycles per frame</div>"
                f"<div>one layer per group: {esc(fmt(estimate.get('fps_no_grouping')))} fps</div>"))
    out.append(_coverage(split))
    out.append(_gmem(estimate))
    out.append(_lmem(a, estimate))
    return out


def _judge(value: float | None, limits: dict) -> str:
    low = limits.get("min_cosine")
    if value is None or low is None:
        return ""
    return "bad" if value < low else ""


def _short(name: str, keep: int = 30) -> str:
    return name if len(name) <= keep else "…" + name[-(keep - 1):]


def _coverage(split: dict) -> tuple[str, str, str]:
    npu, cpu = split.get("npu_nodes"), split.get("cpu_nodes")
    if not isinstance(npu, int) or not isinstance(cpu, int) or not npu + cpu:
        return ("NPU coverage", "—", "split not built")
    lines = [f"nodes: {npu:,} of {npu + cpu:,} ({npu / (npu + cpu):.1%})"]
    macs, cpu_macs = split.get("npu_macs"), split.get("cpu_macs")
    big = f"{npu / (npu + cpu):.1%}"
    title = "NPU coverage (nodes)"
    if isinstance(macs, int) and isinstance(cpu_macs, int) and macs + cpu_macs:
        big, title = f"{macs / (macs + cpu_macs):.2%}", "NPU coverage (MACs)"
        lines.append(f"MACs: {_si(macs)} of {_si(macs + cpu_macs)}")
    lines.append(f"{split.get('npu_segments', '?')} NPU + {split.get('cpu_segments', '?')} CPU "
                 "segments")
    return (title, esc(big), "".join(f"<div>{esc(line)}</div>" for line in lines))


def _gmem(estimate: dict) -> tuple[str, str, str]:
    grouped = estimate.get("gmem_bytes")
    if grouped is None:
        return ("GMEM traffic", "—", "compile not built")
    lower, per_layer = estimate.get("gmem_bytes_lower_bound"), estimate.get("gmem_bytes_no_grouping")
    lines = [f"lower bound: {_bytes(lower)}",
             f"one layer per group: {_bytes(per_layer)}"
             + (f" ({per_layer / grouped:.1f}×)" if per_layer and grouped else "")]
    return ("GMEM traffic (grouped)", esc(_bytes(grouped)),
            "".join(f"<div>{esc(line)}</div>" for line in lines))


def _lmem(a: BuildArtifacts, estimate: dict) -> tuple[str, str, str]:
    peak = estimate.get("lmem_peak_bytes")
    if peak is None:
        return ("LMEM peak", "—", "compile not built")
    plans = [a.json(a.rel(p)) for p in a.glob("compile/**/plan*.json")]
    chip = next((p.get("chip") for p in plans if isinstance(p, dict) and p.get("chip")), {}) or {}
    capacity = (chip.get("lanes") or 0) * (chip.get("lmem_bytes_per_lane") or 0)
    detail = f"of {_bytes(capacity)} ({peak / capacity:.0%})" if capacity else ""
    return ("LMEM peak (all lanes)", esc(_bytes(peak)), esc(detail))


def _bytes(n: Any) -> str:
    if not isinstance(n, (int, float)):
        return "—"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(n) < 1024 or unit == "GiB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.2f} {unit}"
        n /= 1024
    return str(n)


def _si(n: int) -> str:
    for unit, size in (("G", 1e9), ("M", 1e6), ("k", 1e3)):
        if n >= size:
            return f"{n / size:.2f} {unit}"
    return str(n)


def headline(a: BuildArtifacts, verdict: tuple[str, str], limits: dict) -> str:
    """The tiles as one flex row."""
    cells = "".join(f'<div class="tile"><div class="tile-title">{esc(title)}</div>'
                    f'<div class="tile-value">{value}</div><div class="tile-detail">{detail}</div>'
                    f"</div>" for title, value, detail in tiles(a, verdict, limits))
    return f'<div class="headline">{cells}</div>'
