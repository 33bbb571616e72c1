"""Where the time of a frame goes: every NPU layer group (cycles from the compiled program, at
the chip's clock), the steps between groups, and every CPU part (a CPU segment of the split, or
a float layer compile left inside an NPU graph, timed with ONNX Runtime where compile ran), in
pipeline order, each with its milliseconds and share of the frame.

Read from report.json's ``estimate`` (``npu_seconds``, ``cycles``, ``cpu.parts``, per-graph
``between_groups_cycles``), the plans' per-group estimates (``compile/graph_<i>/plan.json``),
``split/graph_infos.json`` (the order) and ``split/support.json`` (what a CPU segment holds).
"""

from __future__ import annotations

from collections import Counter

from npubuild.report.artifacts import BuildArtifacts
from npubuild.report.html import details, esc, para
from npubuild.report.judged import is_number
from npubuild.report.speed import ms_text, speed

MAX_ROWS = 60  # beyond it the smallest parts fold into one row
TOP = 10  # a longer pipeline shows its largest parts first, the whole list folded


def time_rows(a: BuildArtifacts) -> list[dict]:
    """``{"part", "device", "what", "seconds"}`` in pipeline order (seconds None: not timed)."""
    estimate = a.report.get("estimate") or {}
    cycles, npu_seconds = estimate.get("cycles"), estimate.get("npu_seconds")
    if not (is_number(cycles) and is_number(npu_seconds) and cycles):
        return []
    clock = cycles / npu_seconds
    parts = ((estimate.get("cpu") or {}).get("parts") or {}) if isinstance(estimate.get("cpu"), dict) else {}
    graphs = (a.json("split/graph_infos.json") or {}).get("graphs") or []
    ops = _segment_ops(a)
    rows: list[dict] = []
    for i, graph in enumerate(graphs):
        name = f"graph_{i}"
        if graph.get("device") == "npu":
            rows += _npu_rows(a, name, clock, (estimate.get("graphs") or {}).get(name) or {})
            rows += [{"part": key.split("/", 1)[1] or key, "device": "CPU", "seconds": p.get("seconds"),
                      "what": f"float layer inside {name}: {p.get('reason', 'no integer kernel')}"}
                     for key, p in parts.items() if key.startswith(f"{name}/")]
        else:
            top = ", ".join(f"{op}×{n}" for op, n in ops.get(i, Counter()).most_common(3))
            part = parts.get(name) or {}
            rows.append({"part": name, "device": "CPU", "seconds": part.get("seconds"),
                         "what": f"CPU segment, {part.get('nodes', sum(ops.get(i, Counter()).values()))} "
                                 f"nodes: {top or '?'}"})
    return rows


def _segment_ops(a: BuildArtifacts) -> dict[int, Counter]:
    ops: dict[int, Counter] = {}
    for node in (a.json("split/support.json") or {}).get("nodes") or []:
        if isinstance(node.get("graph"), int) and node.get("op") != "Constant":
            ops.setdefault(node["graph"], Counter())[str(node.get("op"))] += 1
    return ops


def _npu_rows(a: BuildArtifacts, name: str, clock: float, graph_estimate: dict) -> list[dict]:
    plan = a.json(f"compile/{name}/plan.json") or {}
    layers = {g.get("index"): g.get("layers") or [] for g in plan.get("groups") or []
              if g.get("device", "npu") == "npu"}
    rows = []
    for group in (plan.get("estimate") or {}).get("groups") or []:
        names = layers.get(group.get("index")) or []
        span = f"{names[0]} … {names[-1]}" if len(names) > 1 else (names[0] if names else "")
        sliced = group.get("slicing") or {}
        cut = "×".join(str(sliced.get(k, 1)) for k in "nhc")
        rows.append({"part": f"{name} group {group.get('index')}", "device": "NPU",
                     "seconds": group.get("cycles", 0) / clock,
                     "what": f"{group.get('layers')} layers ({span}), slices n×h×c {cut}; "
                             f"{group.get('compute_cycles', 0):,} compute / "
                             f"{group.get('dma_cycles', 0):,} DMA cycles"})
    between = graph_estimate.get("between_groups_cycles")
    if between:
        steps = [g for g in plan.get("groups") or [] if g.get("device") == "cpu"
                 and g.get("executes") in ("dma", "npu")]
        kinds = Counter("whole-tensor DMA" if g.get("executes") == "dma" else "whole-tensor NPU"
                        for g in steps)
        rows.append({"part": f"{name} between groups", "device": "NPU", "seconds": between / clock,
                     "what": ", ".join(f"{n} {k} step{'s' * (n > 1)}" for k, n in kinds.items())
                             or "steps between layer groups"})
    return rows


def time_section(a: BuildArtifacts) -> str:
    estimate = a.report.get("estimate")
    rows = time_rows(a)
    if not rows:
        return a.not_built("compile", "report.json estimate")
    fps = speed(estimate)
    timed = all(is_number(r["seconds"]) for r in rows)
    frame = sum(r["seconds"] for r in rows if is_number(r["seconds"]))
    npu = sum(r["seconds"] for r in rows if r["device"] == "NPU")
    cpu = [r for r in rows if r["device"] == "CPU"]
    cpu_s = sum(r["seconds"] for r in cpu if is_number(r["seconds"]))
    head = (f"A frame: {ms_text(frame * 1000)} = NPU {ms_text(npu * 1000)} ({npu / frame:.0%})"
            + (f" + CPU {ms_text(cpu_s * 1000)} ({cpu_s / frame:.0%}, {len(cpu)} "
               f"part{'s' * (len(cpu) != 1)})" if cpu and timed else "")
            + f", run one after the other: {fps.deployed_fps or 1 / frame:,.0f} fps.")
    out = para(head, "summary")
    if not timed:
        out += para(fps.missing or "The CPU parts were not timed on this machine: shares are of "
                    "the NPU time alone.", "warn")
    largest = sorted(rows, key=lambda r: -(r["seconds"] or 0))[:TOP]
    if len(rows) > TOP:
        out += f"<h3>The {TOP} largest parts</h3>" + _table(largest, frame)
        out += details(f"all {len(rows)} parts in pipeline order", _table(rows, frame))
    else:
        out += _table(rows, frame)
    return out + para(
        "NPU time: the compiled program's cycles at the chip's clock (deterministic); CPU time: "
        "ONNX Runtime on the machine that ran compile (median of up to 20 runs). The estimate "
        "adds them, with no overlap.", "note")


def _table(rows: list[dict], frame: float) -> str:
    shown = rows
    if len(rows) > MAX_ROWS:
        keep = set(sorted(range(len(rows)), key=lambda i: -(rows[i]["seconds"] or 0))[:MAX_ROWS - 1])
        rest = [r for i, r in enumerate(rows) if i not in keep]
        shown = [r for i, r in enumerate(rows) if i in keep] + [{
            "part": f"{len(rest)} smaller parts", "device": "", "what": "",
            "seconds": sum(r["seconds"] or 0 for r in rest)}]
    body = []
    for r in shown:
        seconds = r["seconds"]
        share = seconds / frame if is_number(seconds) and frame else None
        bar = (f'<div class="bar {r["device"].lower()}" style="width:{share * 100:.1f}%"></div>'
               if share is not None else "")
        body.append(f'<tr><td><code>{esc(r["part"])}</code></td><td>{esc(r["device"])}</td>'
                    f'<td class="num">{esc(ms_text(seconds * 1000) if is_number(seconds) else "not timed")}</td>'
                    f'<td class="num">{esc(f"{share:.1%}" if share is not None else "—")}</td>'
                    f'<td class="barcell">{bar}</td><td>{esc(r["what"])}</td></tr>')
    return ('<table class="time"><thead><tr><th>part</th><th>on</th><th>time</th>'
            '<th>share of the frame</th><th></th><th>what</th></tr></thead><tbody>'
            + "".join(body) + "</tbody></table>")
