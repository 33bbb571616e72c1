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
from npubuild.report.headline import exact
from npubuild.report.html import (Raw, badge, details, esc, fmt, generic, kv_table, para,
                                  pre_json, table)

METRICS = ("cosine", "euclid", "sqnr_db", "max_abs")
# verify.json fields that explain a figure rather than judge it: in verify.json, not as columns
BOOKKEEPING = {"identical", "max_rel", "rms_range_error", "worst_sample", "samples_judged",
               "channel_axis", "channels_judged", "axis", "start", "end"}
PASS_WORDS = ("pass", "passed", "ok", "accept", "accepted", "true")
KNOWN_VERIFY = {"outputs", "accuracy", "verdict", "passed", "reasons", "failures", "thresholds",
                "bisection", "simulator", "npu_outputs", "detections", "data"}
OK_STATUS = {"built": "ok", "current": "ok", "cached": "ok", "restored": "ok", "failed": "bad"}


# -- verdict and verify metrics ---------------------------------------------------------------
def verdict(a: BuildArtifacts) -> tuple[str, str]:
    """(kind, text) with kind ``pass``, ``fail`` or ``none`` (no verify result yet)."""
    data = a.json("verify/verify.json")
    if not isinstance(data, dict):
        return "none", "no verdict: verify not built"
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
    if data is None:
        out = a.not_built("verify", "verify/verify.json")
        accuracy = a.report.get("accuracy") or {}
        if accuracy.get("outputs"):
            out += para("Until verify runs, this is the accuracy an earlier stage recorded in "
                        "report.json (quantize: its integer reference on the "
                        f"{accuracy.get('data', 'calibration')} data), not the deployed "
                        "pipeline's:", "note")
            out += metrics_table(accuracy["outputs"], thresholds(a, {}))
    else:
        kind, text = verdict(a)
        out = f'<p class="verdict">{badge(text, kind)}</p>' + _reasons(data)
        out += metrics_table(_outputs(data), thresholds(a, data))
        if isinstance(data.get("npu_outputs"), dict) and data["npu_outputs"]:
            out += ("<h3>Tensors the NPU hands over (vs the float pipeline)</h3>"
                    + metrics_table(data["npu_outputs"], thresholds(a, data), label="tensor"))
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


def thresholds(a: BuildArtifacts, data: dict) -> dict:
    if isinstance(data.get("thresholds"), dict):
        return data["thresholds"]
    spec = a.recipe.get("verify") or {}
    return {k: spec[k] for k in ("min_cosine", "min_sqnr_db", "max_abs")
            if spec.get(k) is not None}


def metrics_table(outputs: Any, limits: dict, label: str = "output") -> str:
    if not isinstance(outputs, dict) or not outputs:
        return para("no per-output metrics recorded", "not-built")
    extra = [k for m in outputs.values() if isinstance(m, dict) for k in m
             if k not in METRICS and k not in BOOKKEEPING and not isinstance(m[k], (dict, list))]
    extra.sort(key=lambda k: k != "min_sample_cosine")  # the verdict's figure next to cosine
    columns = [*METRICS, *dict.fromkeys(extra)]
    rows, classes = [], []
    for name, m in outputs.items():
        m = m if isinstance(m, dict) else {}
        rows.append([name, *(_metric(m.get(c), c) for c in columns)])
        classes.append(["", *(_judge(m.get(c), c, limits) for c in columns)])
    out = table([label, *columns], rows, classes=classes)
    if limits:
        out += para("thresholds: " + ", ".join(f"{k} {exact(v)}" for k, v in limits.items()), "note")
    return out


def _metric(value: Any, column: str) -> Any:
    return Raw(esc(fmt(value, 6))) if "cosine" in column else value


def _judge(value: Any, column: str, limits: dict) -> str:
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return ""
    low = limits.get("min_cosine" if column == "min_sample_cosine" else f"min_{column}")
    high = limits.get(column) if column == "max_abs" else limits.get(f"max_{column}")
    if (low is not None and value < low) or (high is not None and value > high):
        return "bad"
    return "ok" if low is not None or high is not None else ""


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
                     info.get("seconds"), _hash(info.get("key")), info.get("reason", "")])
    out = table(["stage", "this run", "build seconds", "seconds this run", "key", "why"], rows)
    return out + para(f"build seconds: how long the run that built each stage's artifacts took "
                      f"({fmt(total)} s in all). built = ran in this run, "
                      "restored = copied from the content cache, current = already up to date (nothing to do).", "note")


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

