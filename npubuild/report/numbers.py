"""Report sections with the numbers: per-layer quantization error (worst first), the compiled
plan's layer groups and LMEM timelines, and the performance estimate with and without grouping.

Compile artifacts are found by pattern (``compile/**/plan*.json``, ``compile/**/*.svg``) so the
page shows whatever the compile stage writes; field names follow `npubuild.npu.plan_json` and
`npubuild.npu.estimate.report_fields`.
"""

from __future__ import annotations

from typing import Any

from npubuild.report import charts, timeline
from npubuild.report.artifacts import BuildArtifacts
from npubuild.report.html import Raw, details, esc, fmt, generic, kv_table, para, table

SHOWN_LAYERS = 20
LAYER_LIMIT = 400
PICTURE_LIMIT = 48
OPEN_PICTURES = 2
LAYER_COLUMNS = ("graph", "tensor", "layer", "kind", "device", "dtype", "cosine", "euclid",
                 "sqnr_db", "max_abs")


# -- quantization ------------------------------------------------------------------------------
def quantization_section(a: BuildArtifacts) -> str:
    per_layer = a.json("quantize/per_layer.json")
    if per_layer is None:
        return a.not_built("quantize", "quantize/per_layer.json")
    summary = a.report.get("quantization") or {}
    calibration = a.json("quantize/calibration.json") or {}
    out = kv_table([(k, summary.get(k, calibration.get(k))) for k in
                    ("scheme", "granularity", "method", "calibration_samples")]
                   + [("float overrides", summary.get("overrides"))])
    out += _cpu_layers(summary.get("graphs") or {})
    out += search_section(summary)
    crosscheck = per_layer.get("crosscheck") or summary.get("crosscheck")
    if crosscheck:
        out += details("integer reference vs the QDQ model in ONNX Runtime (cross-check)",
                       generic(crosscheck))
    tensors = per_layer.get("tensors") or []
    out += _reported_note(a, tensors)
    chart = charts.layer_error_chart(network_order(a, tensors),
                                     (a.recipe.get("verify") or {}).get("min_cosine"))
    if chart:
        out += f"<h3>Error per layer, input to output</h3><figure>{chart}</figure>"
    out += _histograms(tensors)
    return out + _layers(tensors, _verify_cosines(a)) + _ranges(calibration)


def _reported_note(a: BuildArtifacts, tensors: list[dict]) -> str:
    """The count summary, and what these figures are: reported, not judged, and computed
    otherwise than verify's (so 0.4999 here and 0.9907 in verify are both true)."""
    cosines = [t["cosine"] for t in tensors if isinstance(t.get("cosine"), (int, float))]
    low = sum(c < LOW_COSINE for c in cosines)
    samples = max((t.get("samples") or 0 for t in tensors), default=0)
    return (para(f"{len(cosines):,} tensors compared, {low:,} below {LOW_COSINE}.", "summary")
            + para(f"Reported, not judged: quantize's integer reference against float on "
                   f"{samples} compare sample{'s' * (samples != 1)}, per tensor the mean of the "
                   "per-sample cosines (a sample whose reference is near zero, e.g. a text map "
                   "of a photo without text, counts with its own near-random cosine). Verify "
                   "judges the deployed pipeline's outputs with one cosine over all samples "
                   "together and the worst non-quiet sample: where a tensor is also judged "
                   "there, the verify column gives that figure.", "note"))


def _verify_cosines(a: BuildArtifacts) -> dict[str, str]:
    """Tensor name -> verify's figure for it (outputs, hand-overs), as text with its name."""
    from npubuild.report.headline import verify_view
    from npubuild.report.judged import tensor_figures

    report, spec = verify_view(a)
    if a.json("verify/verify.json") is None:
        return {}
    out = {}
    for group, name, found in tensor_figures(report, spec):
        cos = {f.key.rsplit(".", 1)[-1]: f for f in found}
        if group != "slices" and "cosine" in cos:
            judged = "judged" if cos["cosine"].judged else "reported"
            out[name] = (f"{cos['cosine'].value:.6f} all samples"
                         + (f", {cos['min_sample_cosine'].value:.6f} worst sample"
                            if "min_sample_cosine" in cos and cos["min_sample_cosine"].value is not None
                            else "") + f" ({judged})")
    return out


def search_section(summary: dict) -> str:
    """What the precision search chose and why (report.json's ``quantization.search``), or
    that int8 passed verify's thresholds without it."""
    unset = summary.get("unset") or []
    intro = ("scheme, granularity, method and weight rounding as the recipe fixes them" if not unset else
             f"not set in the recipe, chosen: {', '.join(f'{k} {summary.get(k)}' for k in unset)}")
    int8 = summary.get("int8_verdict") or {}
    search = summary.get("search")
    if search is None:
        verdict = "int8 passes verify's thresholds on the verify samples" if int8.get("passed") \
            else "int8 misses verify's thresholds and the search is off (quantization.auto: false)"
        return f"<h3>Precision search</h3>{para(f'{verdict}; {intro}.')}"
    chosen = search.get("chosen") or []
    calibration = search.get("calibration") or {}
    lines = [f"int8 missed verify's thresholds ({'; '.join(int8.get('failures') or [])}); "
             f"{intro}.",
             f"{len(chosen)} of {search.get('candidates')} candidate tensors kept out of int8 "
             f"({', '.join(sorted({c['precision'] for c in chosen})) or 'none'}); verify's "
             f"thresholds {'hold' if search.get('passed') else 'still miss'} on the integer "
             f"reference; {search.get('evaluations')} choices scored with fake quantization.",
             f"calibration: {calibration.get('method')} "
             + (f"({len(calibration.get('per_tensor') or {})} tensor(s) on their own method) "
                if calibration.get("per_tensor") else "")
             + (f"measured {calibration['measured']}" if calibration.get("measured") else "")]
    if search.get("note"):
        lines.append(search["note"])
    rows = [(c["tensor"], c["precision"], c.get("rank"), c.get("share_of_needed_gain"),
             c.get("measured_in_block_of", 1)) for c in chosen]
    body = "".join(para(line) for line in lines)
    body += table(["tensor", "precision", "rank", "share of the needed gain (measured)",
                   "measured in a block of"], rows) if rows else ""
    return f"<h3>Precision search</h3>{body}" + para("quantize/search.json has every choice "
                                                     "scored and the confirmations", "note")


HISTOGRAMS_SHOWN = 6


def _histograms(tensors: list[dict]) -> str:
    """Calibration histograms of the worst tensors that recorded one (quantize keeps them for
    its worst few)."""
    worst = sorted((t for t in tensors if t.get("histogram")), key=_worst_first)[:HISTOGRAMS_SHOWN]
    if not worst:
        return ""
    cells = "".join(f"<figure>{charts.histogram_chart(t)}</figure>" for t in worst)
    return (f"<h3>Calibration histograms of the {len(worst)} worst tensors</h3>"
            f'<div class="gallery">{cells}</div>'
            + para("float values on the verify data over each tensor's quantized range "
                   "(log counts); values outside the range are clipped", "note"))


def network_order(a: BuildArtifacts, tensors: list[dict]) -> list[dict]:
    """Per-layer rows in the order the quantized graphs compute them (their ``layers``), so the
    chart shows where along the network the error grows; rows the graphs do not name last."""
    position: dict[tuple, int] = {}
    for path in a.glob("quantize/graph_*.qgraph.json"):
        graph = path.name.split(".")[0]
        layers = (a.json(a.rel(path)) or {}).get("layers") or []
        for layer in layers:
            for out in layer.get("outputs") or []:
                position.setdefault((graph, out), len(position))
    end = len(position)
    return sorted(tensors, key=lambda r: position.get((r.get("graph"), r.get("tensor")), end))


def _cpu_layers(graphs: dict) -> str:
    rows = [[graph, item.get("layer"), item.get("reason")] for graph, info in graphs.items()
            for item in (info.get("cpu_layers") or []) if isinstance(item, dict)]
    if not rows:
        return ""
    return ("<h3>Layers kept in float (no integer kernel)</h3>"
            + table(["submodel", "layer", "why"], rows, limit=len(rows)))


def _layers(tensors: list[dict], verify: dict[str, str]) -> str:
    ranked = sorted(tensors, key=_worst_first)
    head = f"<h3>Per-layer error vs float, worst first ({len(ranked)} tensors)</h3>"
    out = head + _layer_table(ranked[:SHOWN_LAYERS], 0, verify)
    out += para("mean cosine per sample, reported only: darker text below 0.99, bold below 0.9 "
                "(never red: no threshold judges a layer)", "note")
    rest = ranked[SHOWN_LAYERS:]
    if rest:
        out += details(f"the other {len(rest)} tensors", _layer_table(rest, SHOWN_LAYERS, verify))
    return out


def _worst_first(item: dict) -> tuple:
    cosine = item.get("cosine")
    return (cosine is None, cosine if isinstance(cosine, (int, float)) else 0.0)


def _layer_table(rows: list[dict], start: int, verify: dict[str, str] | None = None) -> str:
    verify = {k: v for k, v in (verify or {}).items()
              if any(str(r.get("tensor")) == k for r in rows)}  # the column only where it says
    body = [[start + i + 1, *(_layer_cell(r, c) for c in LAYER_COLUMNS),
             *([verify.get(str(r.get("tensor")), "")] if verify else [])]
            for i, r in enumerate(rows)]
    classes = [["", *(_cosine_class(r.get(c)) if c == "cosine" else "" for c in LAYER_COLUMNS)]
               for r in rows]
    headers = ["#", *(LAYER_HEADERS.get(c, c) for c in LAYER_COLUMNS),
               *(["verify (its cosine)"] if verify else [])]
    return table(headers, body, classes=classes, limit=LAYER_LIMIT,
                 hidden_note="see quantize/per_layer.json")


LAYER_HEADERS = {"cosine": "cosine (mean per sample)", "sqnr_db": "SQNR dB",
                 "max_abs": "max abs error"}
LOW_COSINE = 0.99


def _layer_cell(row: dict, column: str) -> Any:
    value = row.get(column)
    return Raw(esc(fmt(value, 6))) if column == "cosine" else value


def _cosine_class(value: Any) -> str:
    """Reported-only styles (`low`, `lower`): distinct from a judged failure's red."""
    if not isinstance(value, (int, float)):
        return ""
    return "lower" if value < 0.9 else "low" if value < LOW_COSINE else ""


def _ranges(calibration: dict) -> str:
    rows = [[graph, name, t.get("min"), t.get("max"), t.get("scale"), t.get("zero_point"),
             t.get("source")]
            for graph, info in (calibration.get("graphs") or {}).items()
            for name, t in (info.get("tensors") or {}).items()]
    if not rows:
        return ""
    return details(f"calibrated ranges of {len(rows)} tensors", table(
        ["submodel", "tensor", "min", "max", "scale", "zero point", "source"], rows,
        limit=LAYER_LIMIT, hidden_note="see quantize/calibration.json"))


# -- compile: groups and LMEM timelines --------------------------------------------------------
def lmem_section(a: BuildArtifacts) -> str:
    plans = a.glob("compile/**/plan*.json")
    if not plans:
        return a.not_built("compile", "compile/…/plan.json")
    out = ""
    for path in plans:
        plan = a.json(a.rel(path))
        out += _plan(a, path)
        chip = plan.get("chip") or {}
        capacity, bank = chip.get("lmem_bytes_per_lane"), chip.get("bank_bytes")
        npu = [g for g in plan.get("groups") or [] if g.get("device", "npu") == "npu"]
        for i, group in enumerate(npu[:PICTURE_LIMIT]):
            figure = timeline.lmem_timeline(group, capacity or 0, bank)
            if not figure:
                continue
            summary = (f"LMEM timeline of group {group.get('index')}: "
                       f"{len(group.get('buffers') or [])} buffers over "
                       f"{group.get('timesteps')} timesteps (hover a buffer for its name)")
            out += details(summary, f"<figure>{figure}</figure>", open_=i < OPEN_PICTURES)
        if len(npu) > PICTURE_LIMIT:
            out += para(f"{len(npu) - PICTURE_LIMIT} more groups' timelines not drawn "
                        f"(see {a.rel(path)})", "hidden-note")
    return out


def _plan(a: BuildArtifacts, path) -> str:
    plan = a.json(a.rel(path))
    groups = plan.get("groups") or []
    npu = [g for g in groups if g.get("device", "npu") == "npu"]
    cpu = [g for g in groups if g.get("device") == "cpu"]
    rows = [[g.get("index"), len(g.get("layers") or []), _slicing(g.get("slicing")),
             g.get("timesteps"), len(g.get("slices") or []), len(g.get("buffers") or []),
             (g.get("lmem") or {}).get("peak_bytes_per_lane"),
             (g.get("lmem") or {}).get("bank_crossings")] for g in npu]
    out = f"<h3>{esc(a.rel(path))}: {len(npu)} layer group{'s' * (len(npu) != 1)}</h3>"
    out += table(["group", "layers", "slicing n×h×c", "timesteps", "slices", "buffers",
                  "LMEM peak B/lane", "bank crossings"], rows)
    if cpu:
        out += details(between_groups_text(cpu), table(
            ["step", "layer", "runs on", "why"],
            [[g.get("index"), g.get("layer"), RUNS_ON.get(g.get("executes"), "CPU"), g.get("reason")]
             for g in cpu]))
    return out


RUNS_ON = {"dma": "NPU (DMA)", "npu": "NPU", "cpu": "CPU"}


def between_groups_text(steps: list[dict]) -> str:
    """What runs between layer groups, in words that match where it runs: "6 whole-tensor DMA
    steps and 2 whole-tensor NPU steps between layer groups (on the NPU), 1 layer on the CPU"."""
    dma = sum(g.get("executes") == "dma" for g in steps)
    npu = sum(g.get("executes") == "npu" for g in steps)
    cpu = len(steps) - dma - npu
    on_npu = [f"{dma} whole-tensor DMA step{'s' * (dma != 1)}" if dma else "",
              f"{npu} whole-tensor NPU step{'s' * (npu != 1)}" if npu else ""]
    parts = [" and ".join(p for p in on_npu if p) + " between layer groups (on the NPU)"
             if dma or npu else "",
             f"{cpu} layer{'s' * (cpu != 1)} on the CPU between groups (no integer kernel)"
             if cpu else ""]
    return "; ".join(p for p in parts if p)


def _slicing(slicing: Any) -> str:
    if isinstance(slicing, dict):
        return "×".join(str(slicing.get(k, "?")) for k in ("n", "h", "c"))
    return fmt(slicing)


# -- estimate ----------------------------------------------------------------------------------
ESTIMATE_ROWS = (("cycles", "cycles", "cycles_no_grouping"), ("fps", "fps", "fps_no_grouping"),
                 ("GMEM bytes moved", "gmem_bytes", "gmem_bytes_no_grouping"),
                 ("LMEM peak bytes (all lanes)", "lmem_peak_bytes", None),
                 ("layer groups", "groups", None))


def estimate_section(a: BuildArtifacts) -> str:
    estimate = a.report.get("estimate")
    plans = [a.json(a.rel(p)) for p in a.glob("compile/**/plan*.json")]
    if not estimate and not any(p.get("estimate") for p in plans):
        return a.not_built("compile", "report.json estimate")
    if not estimate:  # only the plan files have it: no baseline to compare with
        first = next(p["estimate"] for p in plans if p.get("estimate"))
        estimate = {k: v for k, v in first.items() if k != "groups"}
    out = _estimate_table(estimate)
    for plan in plans:
        groups = (plan.get("estimate") or {}).get("groups")
        if groups:
            out += details(f"per layer group ({len(groups)})", _group_table(groups),
                           open_=len(groups) <= 8)
    return out


GROUP_COLUMNS = ("index", "layers", "slicing", "compute_cycles", "dma_cycles", "cycles",
                 "gmem_read", "gmem_write", "lmem_peak_bytes_per_lane")


def _group_table(groups: list[dict]) -> str:
    rows = [[_slicing(g.get(c)) if c == "slicing" else g.get(c) for c in GROUP_COLUMNS]
            for g in groups]
    return table(["group", "layers", "slicing n×h×c", "compute cycles", "DMA cycles", "cycles",
                  "GMEM read", "GMEM write", "LMEM peak B/lane"], rows)


def _estimate_table(estimate: dict) -> str:
    rows, used = [], set()
    for label, grouped, baseline in ESTIMATE_ROWS:
        with_, without = estimate.get(grouped), estimate.get(baseline) if baseline else None
        ratio = (with_ / without if isinstance(with_, (int, float)) and without else None)
        rows.append([label, with_, without, ratio])
        used |= {grouped, baseline}
    out = table(["", "with layer grouping", "one layer per group", "ratio"], rows)
    extra = [(k, v) for k, v in estimate.items() if k not in used and k != "graphs"]
    return out + (kv_table(extra) if extra else "")
