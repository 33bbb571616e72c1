"""The row a reviewer reads first, for a decision in 30 seconds: the verdict with how much was
judged, every judged cosine beside its threshold (reported-only figures apart and never red),
fps deployed and NPU alone with the latency, NPU coverage, GMEM, LMEM peak.

Every tile reads ``report.json`` (the stages' figures) and ``verify/verify.json`` leniently: a
figure a build does not have yet shows as "—" with the stage that would give it. Which figure
is judged against what comes from `npubuild.report.judged`, as verify judged it.
"""

from __future__ import annotations

from typing import Any

from npubuild.report.artifacts import BuildArtifacts
from npubuild.report.html import esc, fmt
from npubuild.report.judged import (Figure, all_figures, counts, is_number, task_figure,
                                    tightest)
from npubuild.report.speed import REAL_CHIP_CPU, fps_text, ms_text, speed, vendor_speed

COSINE_GROUPS = (("output", ("outputs",)), ("NPU hand-over", ("npu_outputs",)),
                 ("slice", ("slices",)))
LOW_COSINE = 0.99  # what the per-layer count calls low (reported only: nothing judges it)


def exact(value: Any) -> str:
    """A threshold as the recipe wrote it (0.99995 stays 0.99995, never rounded to 1)."""
    return repr(value) if isinstance(value, float) else fmt(value)


def cosine_text(value: Any) -> str:
    return f"{value:.6f}" if isinstance(value, (int, float)) else "—"


def verify_view(a: BuildArtifacts) -> tuple[dict, dict]:
    """(the figures as report.json lays them out, the verify spec): verify.json's outputs,
    hand-overs, slices and task when verify ran, else what report.json has (quantize's
    estimate); the thresholds from the resolved recipe (else verify.json's ``thresholds``)."""
    verify = a.json("verify/verify.json") or {}
    report = dict(a.report)
    if verify:
        accuracy = {**(report.get("accuracy") or {})}
        for key in ("outputs", "task", "samples"):
            if verify.get(key) is not None:
                accuracy[key] = verify[key]
        report["accuracy"] = accuracy
        report["verify"] = {**(report.get("verify") or {}),
                            **{k: verify[k] for k in ("npu_outputs", "slices", "samples")
                               if verify.get(k) is not None}}
    spec = a.recipe.get("verify") or verify.get("thresholds") or {}
    return report, spec


def build_figures(a: BuildArtifacts) -> list[Figure]:
    """Every verify figure of the build with its threshold (`npubuild.report.judged`)."""
    report, spec = verify_view(a)
    return all_figures(report, spec)


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
    return float(v) if is_number(v) else None


def per_layer_counts(a: BuildArtifacts) -> tuple[int, int] | None:
    """(tensors compared per layer by quantize, how many below `LOW_COSINE`)."""
    per_layer = a.json("quantize/per_layer.json")
    if not isinstance(per_layer, dict):
        return None
    cosines = [t.get("cosine") for t in per_layer.get("tensors") or [] if is_number(t.get("cosine"))]
    return len(cosines), sum(c < LOW_COSINE for c in cosines)


def tiles(a: BuildArtifacts, verdict: tuple[str, str], limits: dict | None = None
          ) -> list[tuple[str, str, str]]:
    """(title, big value HTML, detail HTML) per tile."""
    report = a.report
    split, estimate = report.get("split") or {}, report.get("estimate") or {}
    figures = build_figures(a)
    return [_verdict(a, verdict, figures), _cosines(a, figures),
            _vendor_speed(report.get("vendor"), estimate) or _speed(estimate),
            _coverage(a, split), _gmem(estimate), _lmem(a, estimate)]


def _verdict(a: BuildArtifacts, verdict: tuple[str, str], figures: list[Figure]):
    kind, text = verdict
    lines = []
    judged = counts(figures)
    if kind != "none" and figures:
        failed = f"{judged['failed']} below" if judged["failed"] else "all met"
        lines.append(f"{judged['judged']} figures judged against thresholds: {failed}; "
                     f"{judged['reported']} reported only")
    report, spec = verify_view(a)
    task = task_figure(report, spec)
    if task is not None:
        rule = f" {task.rule.split(' (')[0]}" if task.judged else " (reported only)"
        lines.append(f"{task.label} {fmt(task.value, 4)}{rule} {task.evidence}")
    compared = per_layer_counts(a)
    if compared:
        lines.append(f"{compared[0]:,} tensors compared per layer, {compared[1]:,} below "
                     f"{LOW_COSINE} (reported only)")
    detail = "".join(f"<div>{esc(line)}</div>" for line in lines) or esc(text)
    return ("verdict", f'<span class="badge big {esc(kind)}">{esc(text)}</span>', detail)


def _cosines(a: BuildArtifacts, figures: list[Figure]):
    """Per tensor its worst-sample and all-samples cosine, each beside its threshold (✓/✗),
    judged tensors worst first; then the reported-only ones, grey and labelled (a hand-over
    tensor nothing judges is never red under a PASS)."""
    rows: dict[str, dict[str, Figure]] = {}
    for f in figures:
        if f.key.endswith(".min_sample_cosine"):
            rows.setdefault(f.key.rsplit(".", 1)[0], {})["worst"] = f
        elif f.key.endswith(".cosine") and "worst_channel" not in f.key:
            rows.setdefault(f.key.rsplit(".", 1)[0], {})["all"] = f
    if not rows:
        return ("worst cosine", "—", "verify not built")

    def low(r: dict) -> float:
        return min(f.value for f in r.values() if is_number(f.value))

    def margin(r: dict) -> float:
        return min(f.margin for f in r.values() if f.margin is not None)

    judged = sorted((r for r in rows.values() if any(f.judged for f in r.values())), key=margin)
    reported = sorted((r for r in rows.values() if not any(f.judged for f in r.values())), key=low)
    body = "".join(_cosine_row(r) for r in judged)
    if reported:
        body += ('<tr class="reported-head"><th colspan="3">reported only, no threshold</th></tr>'
                 + "".join(_cosine_row(r) for r in reported[:6]))
        if len(reported) > 6:
            body += f'<tr class="reported"><td colspan="3">{len(reported) - 6} more</td></tr>'
    table = ('<table class="mini"><tr><th></th><th>worst sample</th><th>all samples</th></tr>'
             + body + "</table>")
    worst = tightest(figures) or min((f for r in reported for f in r.values()),
                                     key=lambda f: f.value)
    title = ("cosine furthest below its threshold" if worst.ok is False else
             "cosine closest to its threshold" if judged else "worst cosine (reported only)")
    needs = (" needs " if worst.ok is False else " ") + worst.rule.split(" (")[0]
    big = (f'{esc(cosine_text(worst.value))} <span class="tile-sub">{esc(_short(worst.label, 48))}'
           f"{esc(needs) if worst.judged else ''}</span>")
    return (title, big, table)


def _cosine_row(row: dict[str, Figure]) -> str:
    any_figure = next(iter(row.values()))
    name = any_figure.label.rsplit(" cosine", 1)[0]
    judged = any(f.judged for f in row.values())
    failed = any(f.ok is False for f in row.values())
    cls = "bad" if failed else "good" if judged else "reported"
    cells = "".join(f"<td>{_cosine_cell(row.get(which))}</td>" for which in ("worst", "all"))
    return (f'<tr class="{cls}"><td title="{esc(name)}"><a href="#fig-{slug(any_figure.key)}">'
            f"<code>{esc(_short(name, 30))}</code></a></td>{cells}</tr>")


def _cosine_cell(f: Figure | None) -> str:
    if f is None:
        return "—"
    if not f.judged:
        return esc(cosine_text(f.value))
    mark = "✗" if f.ok is False else "✓"
    return f"{esc(cosine_text(f.value))} {mark} <small>{esc(f.rule.split(' (')[0])}</small>"


def slug(text: str) -> str:
    return "".join(c if c.isalnum() else "-" for c in text).strip("-")[:120]


def _short(name: str, keep: int = 30) -> str:
    return name if len(name) <= keep else "…" + name[-(keep - 1):]


def _vendor_speed(vendor: dict | None, estimate: dict):
    """A real chip's tile: the NPU part as its vendor and npubuild's model estimate it."""
    figures = vendor_speed(vendor, estimate)
    if not figures:
        return None
    detail = "".join(f"<div>{esc(f)}</div>" for f in [*figures, REAL_CHIP_CPU])
    return ("speed of the NPU part", esc(figures[0].split(" (")[0]), detail)


def _speed(estimate: dict):
    """fps deployed (NPU and CPU parts, one after the other) and NPU alone, both labelled, the
    latency, and the CPU's share of the frame; after a cache restore the NPU fps and why the
    CPU part is missing."""
    fps = speed(estimate)
    if fps.npu_fps is None and fps.deployed_fps is None:
        return ("fps", "—", "compile not built")
    lines = []
    if fps.deployed_fps is not None:
        title, big = "fps deployed (NPU + CPU)", fps_text(fps.deployed_fps)
        lines.append(f"{ms_text(fps.latency_ms)} per frame")
        lines.append(f"NPU alone: {fps_text(fps.npu_fps)} fps ({ms_text(fps.npu_latency_ms)})")
        if fps.cpu_seconds and fps.latency_ms:
            share = fps.cpu_seconds * 1000 / fps.latency_ms
            lines.append(f"CPU: {ms_text(fps.cpu_seconds * 1000)} = {share:.0%} of the frame "
                         f"({fps.cpu_parts} part{'s' * (fps.cpu_parts != 1)})")
        elif fps.cpu_parts == 0:
            lines.append("no CPU part: the NPU is the whole frame")
    else:
        title, big = "fps NPU alone", fps_text(fps.npu_fps)
        lines.append(f"{ms_text(fps.npu_latency_ms)} per frame on the NPU")
        lines.append(fps.missing or "deployment fps unknown: compile's CPU parts were not timed")
    detail = "".join(f"<div>{esc(line)}</div>" for line in lines)
    return (title, esc(big), detail + '<div><a href="#time">where the time goes</a></div>')


def cpu_layers_inside(a: BuildArtifacts) -> int:
    """Layers inside the NPU graphs that compile leaves to the CPU (quantize kept them in
    float, or the NPU has no kernel for them): split's node count does not show them."""
    return sum(g.get("executes") == "cpu" for path in a.glob("compile/**/plan*.json")
               for g in (a.json(a.rel(path)) or {}).get("groups") or [] if g.get("device") == "cpu")


def _coverage(a: BuildArtifacts, split: dict) -> tuple[str, str, str]:
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
    inside = cpu_layers_inside(a)
    if inside:
        lines.append(f"+ {inside} layer{'s' * (inside != 1)} on the CPU (compile)")
    return (title, esc(big), "".join(f"<div>{esc(line)}</div>" for line in lines))


def _gmem(estimate: dict) -> tuple[str, str, str]:
    grouped = estimate.get("gmem_bytes")
    if grouped is None:
        return ("GMEM traffic", "—", "compile not built")
    lower, per_layer = estimate.get("gmem_bytes_lower_bound"), estimate.get("gmem_bytes_no_grouping")
    lines = [f"lower bound: {_bytes(lower)}",
             f"one layer per group: {_bytes(per_layer)}"
             + (f" ({per_layer / grouped:.1f}×)" if per_layer and grouped else "")]
    return ("GMEM traffic per frame", esc(_bytes(grouped)),
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


def headline(a: BuildArtifacts, verdict: tuple[str, str], limits: dict | None = None) -> str:
    """The tiles as one grid row."""
    cells = "".join(f'<div class="tile"><div class="tile-title">{esc(title)}</div>'
                    f'<div class="tile-value">{value}</div><div class="tile-detail">{detail}</div>'
                    f"</div>" for title, value, detail in tiles(a, verdict, limits))
    return f'<div class="headline">{cells}</div>'
