"""Report sections a reviewer reads first: the verdict and verify metrics, the recipe and its
lock hashes, and what each stage did in the last run.

``verify/verify.json`` is read leniently, so the page follows the verify stage as it grows:
per-output metrics under ``outputs`` (or ``accuracy.outputs``), the verdict as ``verdict``
(``"pass"``/``"fail"``, a bool, or ``{"passed"|"status", "reasons"}``) or ``passed``,
thresholds under ``thresholds`` (else the recipe's ``verify:``), ``bisection`` in any JSON
shape; fields the page does not know yet are shown as tables under "other verify fields".
"""

from __future__ import annotations

from typing import Any

from npubuild.report.artifacts import BuildArtifacts
from npubuild.report.headline import cosine_text, slug, verify_view
from npubuild.report.judged import Figure, counts, task_figure, tensor_figures
from npubuild.report.html import (Raw, badge, details, esc, fmt, generic, kv_table, para,
                                  pre_json, table)

METRICS = ("cosine", "euclid", "sqnr_db", "max_abs")
# verify.json fields that explain a figure rather than judge it: in verify.json, not as columns
BOOKKEEPING = {"identical", "max_rel", "rms_range_error", "reference_peak", "deployed_peak",
               "worst_sample", "samples_judged", "channel_axis", "channels_judged", "axis",
               "start", "end"}
PASS_WORDS = ("pass", "passed", "ok", "accept", "accepted", "true")
KNOWN_VERIFY = {"outputs", "accuracy", "verdict", "passed", "reasons", "failures", "thresholds",
                "bisection", "simulator", "npu_outputs", "detections", "data", "task", "slices",
                "samples"}
SHOWN_HANDOVERS = 8  # more hand-over tensors: the lowest shown, the rest folded
OK_STATUS = {"built": "ok", "current": "ok", "cached": "ok", "restored": "ok", "failed": "bad"}


# -- verdict and verify metrics ---------------------------------------------------------------
def verdict(a: BuildArtifacts) -> tuple[str, str]:
    """(kind, text) with kind ``pass``, ``fail`` or ``none`` (no verify result yet)."""
    data = a.json("verify/verify.json")
    if not isinstance(data, dict):
        return "none", ("no verdict: verify not built for this recipe" if a.stale("verify")
                        else "no verdict: verify not built")
    raw = data.get("verdict", data.get("passed"))
    if isinstance(raw, dict):
        raw = raw.get("passed", raw.get("status", raw.get("verdict")))
    text = str(raw).lower()
    if raw is True or text in PASS_WORDS:
        return "pass", "PASS"
    if raw is False or text.startswith(("fail", "reject", "false")):
        return "fail", "FAIL"
    return "none", f"verdict unclear: {raw}"


def verify_section(a: BuildArtifacts) -> str:
    data = a.json("verify/verify.json")
    report, spec = verify_view(a)
    figures = {(group, name): {f.key.rsplit(".", 1)[-1] if "worst_channel" not in f.key
                               else "worst_channel": f for f in found}
               for group, name, found in tensor_figures(report, spec)}
    if data is None:
        out = a.not_built("verify", "verify/verify.json")
        accuracy = a.report.get("accuracy") or {}
        if accuracy.get("outputs"):
            out += para("Until verify runs, this is the accuracy an earlier stage recorded in "
                        "report.json (quantize: its integer reference on the "
                        f"{accuracy.get('data', 'calibration')} data), not the deployed "
                        "pipeline's; the thresholds are verify's, not yet applied:", "note")
            out += metrics_table(accuracy["outputs"], _by_name(figures, "outputs"))
    else:
        kind, text = verdict(a)
        out = f'<p class="verdict">{badge(text, kind)}</p>' + _reasons(data)
        out += _judged_summary(list(figures.values()), report, spec)
        out += LEGEND
        out += "<h3>Model outputs (vs the float model)</h3>"
        out += metrics_table(_outputs(data), _by_name(figures, "outputs"))
        if isinstance(data.get("npu_outputs"), dict) and data["npu_outputs"]:
            handover = _by_name(figures, "handover")
            judged = any(f.judged for fs in handover.values() for f in fs.values())
            out += ("<h3>Tensors the NPU hands over (vs the float pipeline)"
                    + ("" if judged else " — reported only") + "</h3>")
            if not judged:
                out += para("No threshold judges these (verify.handover sets none): they explain "
                            "the outputs, which are judged. Low values are shown, never as "
                            "failures.", "note")
            out += _folded(data["npu_outputs"], handover, "tensor")
        if isinstance(data.get("slices"), dict) and data["slices"]:
            out += "<h3>Slices judged on their own</h3>"
            out += metrics_table(data["slices"], _by_name(figures, "slices"), label="slice")
        out += _task(report, spec)
        out += look_section(a, [f for fs in figures.values() for f in fs.values()])
        if data.get("bisection"):
            out += "<h3>Stage bisection</h3>" + generic(data["bisection"])
        extra = {k: v for k, v in data.items() if k not in KNOWN_VERIFY}
        if extra:
            out += details("other verify fields", generic(extra))
    simulator = (data or {}).get("simulator") or a.report.get("simulator")
    if simulator:
        out += "<h3>Simulator vs integer reference</h3>" + kv_table(
            [(k, v) for k, v in simulator.items() if not isinstance(v, (dict, list))])
        nested = {k: v for k, v in simulator.items() if isinstance(v, (dict, list))}
        if nested:
            out += details("per submodel", generic(nested))
    return out + _detections(a, data or {})


LEGEND = ('<p class="note legend"><span class="cell-good key">0.9990 ✓ ≥ 0.99</span> judged, met · '
          '<span class="cell-bad key">0.9800 ✗ ≥ 0.99</span> judged, missed · '
          '<span class="cell-reported key">0.9800</span> reported only (no threshold). '
          "cosine (all samples): one cosine over every verify sample together; cosine (worst "
          "sample): the lowest per-sample cosine, over samples whose reference is not near zero."
          "</p>")


def _folded(metrics: dict, judged: dict, label: str) -> str:
    """Many tensors: the lowest `SHOWN_HANDOVERS` (by worst-sample cosine), the rest folded."""
    if len(metrics) <= SHOWN_HANDOVERS:
        return metrics_table(metrics, judged, label=label)

    def low(item) -> float:
        m = item[1] if isinstance(item[1], dict) else {}
        value = m.get("min_sample_cosine", m.get("cosine"))
        return value if isinstance(value, (int, float)) else 2.0

    ranked = sorted(metrics.items(), key=low)
    head, rest = dict(ranked[:SHOWN_HANDOVERS]), dict(ranked[SHOWN_HANDOVERS:])
    return (metrics_table(head, judged, label=label)
            + details(f"the other {len(rest)} tensors", metrics_table(rest, judged, label=label)))


def _by_name(figures: dict, group: str) -> dict[str, dict[str, Figure]]:
    return {name: found for (g, name), found in figures.items() if g == group}


def _judged_summary(figures: list[dict], report: dict, spec: dict) -> str:
    flat = [f for found in figures for f in found.values()]
    task = task_figure(report, spec)
    total = counts(flat + ([task] if task else []))
    tensors = len(figures)
    text = (f"{tensors} tensor{'s' * (tensors != 1)} compared with the float model: "
            f"{total['judged']} figures judged against a threshold, {total['failed']} missed; "
            f"{total['reported']} reported only.")
    return para(text, "summary")


def _task(report: dict, spec: dict) -> str:
    task = task_figure(report, spec)
    if task is None:
        return ""
    cls = "cell-reported" if not task.judged else "cell-bad" if task.ok is False else "cell-good"
    rule = task.rule if task.judged else "reported only (verify.min_task_agreement sets none)"
    return ("<h3>Task</h3>" + f'<p><span class="{cls}">{esc(task.label)} '
            f"{esc(fmt(task.value, 4))}</span> {esc(rule)}, {esc(task.evidence)}.</p>")


def look_section(a: BuildArtifacts, figures: list[Figure]) -> str:
    """For every tensor that misses a threshold: where to look at it (`npubuild view`)."""
    failing = [f for f in figures if f.ok is False]
    if not failing:
        return ""
    recipe = a.lock.get("recipe") or "RECIPE"
    rows = []
    for f in failing:
        tensor = f.label.rsplit(" cosine", 1)[0].rsplit(" ", 2)[0] if " " in f.label else f.label
        rows.append(f'<li id="look-{slug(f.key)}"><code>{esc(tensor)}</code>: '
                    f"{esc(f.label)} {esc(cosine_text(f.value))} misses {esc(f.rule)}. Open the "
                    f"model in Netron and search the tensor: <code>npubuild view {esc(recipe)} "
                    "fusion</code> (the float graph) or <code>npubuild view "
                    f"{esc(recipe)} quantize --graph N</code> (the quantized submodel).</li>")
    return "<h3>Where to look</h3><ul>" + "".join(rows) + "</ul>"


def metrics_table(outputs: Any, judged: dict[str, dict[str, Figure]] | None = None,
                  label: str = "output") -> str:
    """One row per tensor; a judged figure shows ✓/✗ and its threshold in its cell, a
    reported one is plain."""
    if not isinstance(outputs, dict) or not outputs:
        return para("no per-output metrics recorded", "not-built")
    judged = judged or {}
    extra = [k for m in outputs.values() if isinstance(m, dict) for k in m
             if k not in METRICS and k not in BOOKKEEPING and not isinstance(m[k], (dict, list))]
    extra.sort(key=lambda k: k != "min_sample_cosine")  # the verdict's figure next to cosine
    columns = [*METRICS, *dict.fromkeys(extra)]
    head = "".join(f"<th>{esc(COLUMN_NAMES.get(c, c))}</th>" for c in [label, *columns])
    body = []
    for name, m in outputs.items():
        m = m if isinstance(m, dict) else {}
        cells = [f"<td><code>{esc(name)}</code></td>"]
        for c in columns:
            cells.append(_cell(m.get(c), c, (judged.get(name) or {}).get(c)))
        body.append("<tr>" + "".join(cells) + "</tr>")
    return (f'<div class="wide"><table><thead><tr>{head}</tr></thead><tbody>{"".join(body)}'
            "</tbody></table></div>")


COLUMN_NAMES = {"cosine": "cosine (all samples)", "min_sample_cosine": "cosine (worst sample)",
                "sqnr_db": "SQNR dB", "max_abs": "max abs error", "range_error": "error / range",
                "dead_channel_count": "dead channels"}


def _cell(value: Any, column: str, figure: Figure | None) -> str:
    shown = esc(fmt(value, 6) if "cosine" in column else fmt(value))
    if figure is None or not figure.judged:
        anchor = f' id="fig-{slug(figure.key)}"' if figure is not None else ""
        cls = ' class="cell-reported"' if figure is not None else ""
        return f"<td{anchor}{cls}>{shown}</td>"
    cls, mark = ("cell-bad", "✗") if figure.ok is False else ("cell-good", "✓")
    return (f'<td id="fig-{slug(figure.key)}" class="{cls}">{shown} {mark} '
            f'<small>{esc(figure.rule.split(" (")[0])}</small></td>')


def _outputs(data: dict) -> Any:
    return data.get("outputs") or (data.get("accuracy") or {}).get("outputs")


def _reasons(data: dict) -> str:
    found = data.get("reasons") or data.get("failures")
    if isinstance(data.get("verdict"), dict):
        found = found or data["verdict"].get("reasons") or data["verdict"].get("failures")
    if not found:
        return ""
    items = found if isinstance(found, list) else [found]
    return "<ul>" + "".join(f"<li>{esc(fmt(r))}</li>" for r in items) + "</ul>"


def _detections(a: BuildArtifacts, data: dict) -> str:
    pictures = a.glob("verify/detections*.png") + a.glob("verify/detections*.jpg")
    info = data.get("detections") if isinstance(data.get("detections"), dict) else {}
    if not pictures and not info:
        return ""
    out = "<h3>Detections: float (green) vs deployed (red)</h3>"
    if info:
        out += para(f"{fmt(info.get('matched'))} of {fmt(info.get('float_boxes'))} float boxes "
                    f"found again by the deployed pipeline (same class, IoU ≥ 0.5) on "
                    f"{fmt(info.get('images'))} images; class names from "
                    f"{info.get('class_names', 'the model')}.")
    for path in pictures:
        out += f"<figure>{a.picture(path, 'detections: float and deployed boxes')}"
        out += f"<figcaption>{esc(a.rel(path))}</figcaption></figure>"
    images = info.get("per_image") or []
    if images:
        rows = [[i.get("image"), _boxes(i.get("float")), _boxes(i.get("deployed")),
                 i.get("matched")] for i in images if isinstance(i, dict)]
        out += details(f"boxes per image ({len(rows)})",
                       table(["image", "float", "deployed", "matched"], rows, limit=len(rows)))
    return out


def _boxes(found: Any) -> str:
    if not isinstance(found, list) or not found:
        return "—"
    return "; ".join(f"{b.get('name', b.get('class'))} {fmt(b.get('score'))}"
                     for b in found if isinstance(b, dict))


# -- recipe and lock ---------------------------------------------------------------------------
def recipe_section(a: BuildArtifacts) -> str:
    if not a.lock:
        return a.not_built("the build", "recipe.lock")
    lock, recipe = a.lock, a.recipe
    pairs = [("recipe file", lock.get("recipe")),
             ("recipe sha256", _hash(lock.get("recipe_sha256"))),
             ("npubuild", lock.get("npubuild"))]
    pairs += [(key, _compact(value)) for key, value in recipe.items()]
    out = kv_table(pairs) + details("resolved recipe (every default filled in)", pre_json(recipe))
    rows, files = [], 0
    for stage, info in (lock.get("stages") or {}).items():
        rows.append((stage, Raw("<em>stage key</em>"), _hash(info.get("key"))))
        rows += [(stage, name, _hash(digest)) for name, digest in (info.get("files") or {}).items()]
        files += len(info.get("files") or {})
    out += "<h3>Lock: stage keys and artifact hashes</h3>"
    return out + details(f"{len(rows) - files} stage keys, {files} artifact hashes (recipe.lock)",
                         table(["stage", "file", "sha256"], rows, limit=500))


def _hash(digest: Any) -> Raw:
    if not digest:
        return Raw("—")
    return Raw(f'<code class="hash" title="{esc(digest)}">{esc(str(digest)[:16])}…</code>')


def _compact(value: Any, top: bool = True) -> str:
    """A recipe section on one line: nulls and empties left out, a rewrite step as name(args)."""
    if isinstance(value, dict):
        items = [(k, v) for k, v in value.items() if v not in (None, [], {})]
        if not top and len(items) == 1 and isinstance(items[0][1], dict):
            return f"{items[0][0]}({_compact(items[0][1])})"
        text = ", ".join(f"{k}={_compact(v, False)}" for k, v in items)
        return text if top else "{" + text + "}"
    if isinstance(value, list):
        return "[" + ", ".join(_compact(v, False) for v in value) + "]"
    return fmt(value)


# -- stages ------------------------------------------------------------------------------------
def stages_section(a: BuildArtifacts) -> str:
    stages = a.report.get("stages")
    if not stages:
        return a.not_built("the build", "report.json")
    rows, total = [], 0.0
    for name, info in stages.items():
        status = str(info.get("status", "?"))
        built_in = build_seconds(a, name, info)
        total += built_in or 0.0
        rows.append([name, badge(status, OK_STATUS.get(status, "muted")), built_in,
                     info.get("seconds"), _hash(info.get("key")), _why(status, info.get("reason", ""))])
    out = table(["stage", "this run", "build seconds", "seconds this run", "key", "why"], rows)
    return out + para(f"build seconds: how long the run that built each stage's artifacts took "
                      f"({fmt(total)} s in all). built = ran in this run, "
                      "restored = copied from the content cache, current = already up to date (nothing to do).", "note")


def _why(status: str, reason: str) -> str:
    """The stage's reason in the words the command line uses."""
    from npubuild.report.summary import stage_reason

    return stage_reason(status, reason)


def build_seconds(a: BuildArtifacts, stage: str, info: dict) -> float | None:
    """Seconds the stage took in the run that built its current artifacts (report.json's
    ``built_seconds``, else the manifest's), not this run's 0 s for a cached stage."""
    if isinstance(info.get("built_seconds"), (int, float)):
        return float(info["built_seconds"])
    manifest = a.json(f"{stage}/manifest.json")
    seconds = manifest.get("seconds") if isinstance(manifest, dict) else None
    return float(seconds) if isinstance(seconds, (int, float)) else None


def header_facts(a: BuildArtifacts) -> list[tuple[str, Any]]:
    report, recipe = a.report, a.recipe
    return [("recipe", report.get("recipe") or a.lock.get("recipe")),
            ("model", (recipe.get("model") or {}).get("path")),
            ("target", report.get("target") or recipe.get("target")),
            ("npubuild", report.get("npubuild") or a.lock.get("npubuild"))]

