"""The few lines a finished `npubuild run` ends with: verdict, worst cosine, NPU coverage,
frames per second, GMEM traffic — the text form of report.html's headline row, read from the
same artifacts through the same functions; a figure whose stage was not built for this recipe
and chip is left out (and an earlier build's verdict is named as such, never shown as this one's)."""

from __future__ import annotations

from pathlib import Path

from npubuild.report.artifacts import BuildArtifacts
from npubuild.report.headline import build_figures, cpu_layers_inside, verify_view
from npubuild.report.judged import task_figure, tightest, worst_cosine
from npubuild.report.overview import verdict
from npubuild.report.speed import REAL_CHIP_CPU, fps_text, ms_text, speed, vendor_speed


def headline_lines(root: Path) -> list[str]:
    """The headline of the build in ``root`` (build/<name>/), one line per figure."""
    a = BuildArtifacts(Path(root))
    split, estimate = a.report.get("split") or {}, a.report.get("estimate") or {}
    lines = []
    kind, text = verdict(a)
    if kind != "none":
        lines.append(f"verify {'passed' if kind == 'pass' else 'failed' if kind == 'fail' else text}")
    elif a.stale("verify"):  # an earlier build's verdict is in the folder: say it is not this one
        lines.append(f"verify: {a.stale('verify')}")
    figures = build_figures(a)
    worst = tightest(figures)
    if worst is not None and worst.ok is False:
        lines.append(f"cosine furthest below its threshold: {worst.value:.6f} ({worst.label}), "
                     f"needs {worst.rule.split(' (')[0]}")
    elif worst is not None:
        lines.append(f"cosine closest to its threshold: {worst.value:.6f} ({worst.label}) "
                     f"{worst.rule.split(' (')[0]}")
    elif (worst := worst_cosine(figures)) is not None:
        lines.append(f"worst cosine {worst.value:.6f} ({worst.label}), reported only")
    report, spec = verify_view(a)
    task = task_figure(report, spec)
    if task is not None:
        rule = f" {task.rule.split(' (')[0]}" if task.judged else " (reported only)"
        shown = "undefined" if task.value is None else f"{task.value:.4f}"
        lines.append(f"{task.label} {shown}{rule}, {task.evidence}")
    if "npu_nodes" in split:
        nodes = split["npu_nodes"] + split.get("cpu_nodes", 0)
        share = split["npu_nodes"] / nodes if nodes else 0.0
        inside = cpu_layers_inside(a)
        lines.append(f"NPU coverage {split['npu_nodes']}/{nodes} nodes ({share:.0%})"
                     + (f"; compile runs {inside} layer{'s' * (inside != 1)} of the NPU graphs on the CPU"
                        if inside else ""))
    fps, real_chip = speed(estimate), vendor_speed(a.report.get("vendor"), estimate)
    if real_chip:
        lines.append(f"NPU part: {', '.join(real_chip)}; {REAL_CHIP_CPU}")
    elif fps.deployed_fps is not None:
        untimed = len(((estimate.get("cpu") or {}).get("not_measured") or {})
                      if isinstance(estimate.get("cpu"), dict) else {})
        lines.append(f"{fps_text(fps.deployed_fps)} fps deployed, {ms_text(fps.latency_ms)} per "
                     f"frame (NPU alone {fps_text(fps.npu_fps)} fps)"
                     + (f"; {untimed} CPU part{'s' * (untimed != 1)} not timed, left out: at most "
                        "this fast" if untimed else ""))
    elif fps.npu_fps is not None:
        lines.append(f"{fps_text(fps.npu_fps)} fps NPU alone; deployed fps unknown: {fps.missing}")
    grouped, per_layer = estimate.get("gmem_bytes"), estimate.get("gmem_bytes_no_grouping")
    if grouped is not None and per_layer:
        lines.append(f"GMEM {grouped:,} bytes per frame, {grouped / per_layer:.2f} of layer by "
                     f"layer ({per_layer:,})")
    return lines


def stage_summary(stage: str, report: dict) -> str:
    """What a stage decided, on one line, from its report fragment (what `-v` logs): the
    model's size, the rewrites, the placement, the precision, the tiling, the verdict."""
    describe = SUMMARIES.get(stage)
    try:
        return describe(report) if describe else ""
    except (KeyError, TypeError, ValueError, AttributeError, ZeroDivisionError):
        return ""  # a fragment in another shape: the stage line alone says enough


def _import(r: dict) -> str:
    info = r.get("import") or {}
    inputs = ", ".join(f"{k} {v.get('shape')}" for k, v in (info.get("inputs") or {}).items())
    return f"{info.get('format')} model, {info.get('nodes')} nodes, inputs {inputs}"


def _surgery(r: dict) -> str:
    info = r.get("surgery") or {}
    return (f"{info.get('steps', 0)} step(s), {info.get('nodes')} nodes after, largest relative "
            f"change {info.get('max_rel')}")


def _fusion(r: dict) -> str:
    info = r.get("fusion") or {}
    fired = ", ".join(f"{k}×{v}" for k, v in (info.get("rules") or {}).items()) or "none fired"
    return f"{info.get('nodes_before')} -> {info.get('nodes_after')} nodes; {fired}"


def _split(r: dict) -> str:
    info = r.get("split") or {}
    cpu = ", ".join(f"{k}×{v}" for k, v in (info.get("cpu_ops") or {}).items())
    return (f"{info['npu_segments']} NPU + {info['cpu_segments']} CPU segments, "
            f"{info['npu_nodes']} of {info['npu_nodes'] + info['cpu_nodes']} nodes on the NPU"
            + (f"; on the CPU: {cpu}" if cpu else ""))


def _quantize(r: dict) -> str:
    info = r.get("quantization") or {}
    dtypes: dict[str, int] = {}
    kept = 0
    for graph in (info.get("graphs") or {}).values():
        for dtype, n in (graph.get("tensor_dtypes") or {}).items():
            dtypes[dtype] = dtypes.get(dtype, 0) + n
        kept += len(graph.get("cpu_layers") or [])
    tensors = ", ".join(f"{n} {dtype}" for dtype, n in dtypes.items())
    return (f"{info.get('scheme')} {info.get('granularity')}, {info.get('method')} on "
            f"{info.get('calibration_samples')} samples; tensors: {tensors}"
            + (f"; {kept} layer(s) kept in float" if kept else ""))


def _compile(r: dict) -> str:
    graphs = (r.get("compile") or {}).get("graphs") or {}
    groups = sum(g.get("groups", 0) for g in graphs.values())
    sliced = sum(g.get("h_sliced_groups", 0) + g.get("c_sliced_groups", 0) for g in graphs.values())
    estimate = r.get("estimate") or {}
    return (f"{len(graphs)} NPU graph(s), {groups} layer groups ({sliced} sliced), "
            f"{estimate.get('cycles', 0):,} cycles per frame, GMEM {estimate.get('gmem_bytes', 0):,} B")


def _verify(r: dict) -> str:
    info = r.get("verify") or {}
    verdict = "passed" if info.get("passed") else f"failed ({len(info.get('failures') or [])} checks)"
    return f"{verdict} on {info.get('samples')} samples"


SUMMARIES = {"import": _import, "surgery": _surgery, "fusion": _fusion, "split": _split,
             "quantize": _quantize, "compile": _compile, "verify": _verify}


def stage_reason(status: str, reason: str) -> str:
    """A stage's reason in the words every command uses: a restored stage says where it came
    from ("from the cache; not in this build directory yet"), a stage to run why."""
    if status in ("restored", "will restore"):
        where = reason.partition(" (from the remote cache)")
        source = "the remote cache" if where[1] else "the cache"
        rest = "not in this build directory yet" if where[0] == "never built" else where[0]
        return f"from {source}; {rest}" if rest else f"from {source}"
    if status == "running" and reason == "never built":  # it may yet come from the cache
        return "not in this build directory yet"
    return reason
