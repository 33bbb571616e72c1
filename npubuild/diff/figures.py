"""The figures a reviewer compares between two versions, per chip pair, read from the stage
manifests that the build directory or the content cache hold (nothing is built to get them),
plus the figures measured on the build machine (deployment fps: the CPU parts timed) from
report.json where its compile key is the one expected.

Every row has a stable ``key``, its field path in report.json (`npubuild.report.judged`), and
each side's threshold verdict, so a regression against a threshold is data, not display text.
"""

from __future__ import annotations

from typing import Any

from npubuild.report.judged import Figure, all_figures, field_key, is_number
from npubuild.report.speed import speed
from npubuild.timings import MEASURED_ESTIMATE_KEYS

# (key path in the merged report, label) in the order a reviewer reads them, after the verdict,
# the task metric and the fps
SCALARS = (
    (("estimate", "cycles"), "NPU cycles per frame"),
    (("estimate", "gmem_bytes"), "GMEM bytes grouped"),
    (("estimate", "gmem_bytes_lower_bound"), "GMEM bytes lower bound"),
    (("estimate", "gmem_bytes_no_grouping"), "GMEM bytes one layer per group"),
    (("estimate", "lmem_peak_bytes"), "LMEM peak bytes"),
    (("simulator", "bit_exact"), "simulator bit-exact"),
    (("split", "npu_segments"), "NPU segments"),
    (("split", "cpu_segments"), "CPU segments"),
)


def merged_report(expected: dict) -> dict:
    """The report fragments of every stage that has a manifest (built or in a cache)."""
    report: dict = {}
    for _, manifest, _ in expected.values():
        if manifest:
            report.update(manifest.get("report", {}))
    return report


def with_measurements(report: dict, expected: dict, written: dict) -> dict:
    """``report`` plus the measured estimate figures of ``written`` (a build dir's report.json)
    when that build's compile key is the expected one; else they stay absent."""
    parts = expected.get("compile", (None, None, ""))[0]
    same = parts is not None and ((written.get("stages") or {}).get("compile") or {}).get("key") == parts.key
    measured = (written.get("estimate") or {}) if same else {}
    if not measured or not isinstance(report.get("estimate"), dict):
        return report
    estimate = {**report["estimate"], **{k: measured[k] for k in MEASURED_ESTIMATE_KEYS
                                         if k in measured}}
    return {**report, "estimate": estimate}


def figures(report: dict, verify_spec: dict | None) -> list[Figure]:
    """One build's figures: verdict, task metric (with its evidence), fps deployed and NPU
    alone, every judged or reported tensor figure, NPU coverage, cycles, GMEM, LMEM."""
    out: list[Figure] = []
    verdict = _get(report, ("verify", "passed"))
    if verdict is not None:
        out.append(Figure("verify.passed", "verdict", verdict))
    judged = all_figures(report, verify_spec)
    out += [f for f in judged if f.key.startswith("accuracy.task")]
    if isinstance(report.get("estimate"), dict):
        fps = speed(report["estimate"])
        out.append(Figure("estimate.fps", "fps deployed (NPU + CPU parts)", fps.deployed_fps,
                          evidence=fps.missing))
        out.append(Figure("estimate.npu_fps", "fps NPU alone", fps.npu_fps))
    out += [f for f in judged if not f.key.startswith("accuracy.task")]
    out += coverage(report.get("split") or {})
    out += [Figure(field_key(*path), label, _get(report, path))
            for path, label in SCALARS if _get(report, path) is not None]
    out += vendor(report)  # real chips: the vendor's own figures
    return out


def vendor(report: dict) -> list[Figure]:
    """A real chip's figures as its toolchain reports them (`npubuild.backends.figures`), each
    keyed by its path in report.json: ``vendor.cycles``, and per graph and quantizer the
    vendor artifact's cosine (``compile.graphs.graph_0.quantizers.npubuild.proof["y"].cosine``)."""
    from npubuild.backends.figures import VENDOR

    found = report.get("vendor") or {}
    out = [Figure(field_key("vendor", key), label, found[key]) for label, key in VENDOR
           if found.get(key) is not None]
    toolchain = found.get("toolchain") or {}
    if toolchain:
        out.append(Figure("vendor.toolchain", "toolchain", " ".join(
            f"{k}=={v}" for k, v in toolchain.items() if k != "toolchain")))
    for graph, info in ((report.get("compile") or {}).get("graphs") or {}).items():
        for quantizer, q in (info.get("quantizers") or {}).items():
            for tensor, m in (q.get("proof") or {}).items():
                out.append(Figure(field_key("compile", "graphs", graph, "quantizers", quantizer,
                                            "proof", tensor, "cosine"),
                                  f"{quantizer} quantizer cosine {graph}:{tensor}", m.get("cosine")))
    return out


def coverage(split: dict) -> list[Figure]:
    """NPU share of the nodes and (where the split stage counted them) of the MACs; derived
    from ``split.npu_<unit>`` and ``split.cpu_<unit>``."""
    out = []
    for unit in ("nodes", "macs"):
        npu, cpu = split.get(f"npu_{unit}"), split.get(f"cpu_{unit}")
        if isinstance(npu, int) and isinstance(cpu, int) and npu + cpu:
            out.append(Figure(f"split.npu_share_of_{unit}",
                              f"NPU share of {'MACs' if unit == 'macs' else unit}",
                              npu / (npu + cpu)))
    return out


def compare(a: list[Figure], b: list[Figure], *, a_built: bool = True) -> list[dict]:
    """Rows for every figure either side has (a's order first): both values, the change, each
    side's threshold verdict, and whether b regresses (fails a threshold a met, or a
    pass -> fail verdict) or fixes one."""
    by_a, by_b = {f.key: f for f in a}, {f.key: f for f in b}
    rows = []
    for key in dict.fromkeys([*by_a, *by_b]):
        fa, fb = by_a.get(key), by_b.get(key)
        shown = fb or fa
        ok_a, ok_b = _ok(fa), _ok(fb)
        rows.append({
            "key": key, "label": shown.label,
            "a": fa.value if fa else None, "b": fb.value if fb else None,
            "change": change(fa.value if fa else None, fb.value if fb else None),
            "limit": shown.limit, "limit_name": shown.limit_name,
            "direction": "min" if shown.higher_is_better else "max",
            "ok": {"a": ok_a, "b": ok_b},
            "regression": bool(a_built and ok_b is False and ok_a is not False),
            "fixed": bool(ok_a is False and ok_b is True),
            **({"evidence": {"a": fa.evidence if fa else "", "b": fb.evidence if fb else ""}}
               if (fa and fa.evidence) or (fb and fb.evidence) else {})})
    return rows


def _ok(figure: Figure | None) -> bool | None:
    if figure is None:
        return None
    if figure.key == "verify.passed":
        return figure.value
    return figure.ok


def change(a: Any, b: Any) -> dict | None:
    """``{"delta": b - a, "relative": (b - a) / a}`` (relative None when a is 0); None when a
    side is missing or not a number."""
    if not (is_number(a) and is_number(b)):
        return None
    return {"delta": b - a, "relative": (b - a) / a if a else None}


def _get(data: Any, path: tuple) -> Any:
    for part in path:
        data = data.get(part) if isinstance(data, dict) else None
    return data
