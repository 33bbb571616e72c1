"""Report sections about the graph: the imported model and the rewrites applied to it, op
coverage (every CPU node with the reason it left the NPU), and the segment picture.
"""

from __future__ import annotations

from collections import Counter

from npubuild.report.artifacts import BuildArtifacts
from npubuild.report.html import details, fmt, generic, kv_table, para, records, table
from npubuild.report.splitgraph import split_graph_svg

NODE_LIMIT = 500


# -- model and rewrites ------------------------------------------------------------------------
def model_section(a: BuildArtifacts) -> str:
    return (f"<h3>Import</h3>{_import(a)}<h3>Surgery</h3>{_surgery(a)}"
            f"<h3>Fusion</h3>{_fusion(a)}")


def _import(a: BuildArtifacts) -> str:
    info = a.json("import/import.json")
    if info is None:
        return a.not_built("import", "import/import.json")
    out = kv_table([("format", info.get("format")), ("nodes", info.get("nodes")),
                    ("opset", info.get("opset")), ("inputs", tensors(info.get("inputs"))),
                    ("outputs", tensors(info.get("outputs"))),
                    ("proof vs source", info.get("proof"))])
    ops = info.get("ops") or {}
    return out + details(f"{len(ops)} op types", table(["op", "count"], ops.items()))


def tensors(specs: dict | None) -> str:
    return ", ".join(f"{name} {spec.get('shape')} {spec.get('dtype', '')}".strip()
                     for name, spec in (specs or {}).items())


def _surgery(a: BuildArtifacts) -> str:
    log = a.json("surgery/log.json")
    if log is None:
        return a.not_built("surgery", "surgery/log.json")
    steps = log.get("steps") or []
    if not steps:
        return para("no surgery steps in the recipe")
    rows = [[s.get("index"), s.get("rewrite"), s.get("args"),
             f"{fmt(s.get('nodes_before'))} → {fmt(s.get('nodes_after'))}",
             _count(s.get("nodes_removed")), _count(s.get("nodes_added")),
             _count(s.get("nodes_changed")), s.get("check"), s.get("max_rel"),
             ", ".join(s.get("not_comparable") or {}) or "—"] for s in steps]
    return table(["#", "rewrite", "args", "nodes", "removed", "added", "changed", "check",
                  "max rel error", "not compared"], rows)


def _count(change) -> object:
    return change.get("count") if isinstance(change, dict) else change


def _fusion(a: BuildArtifacts) -> str:
    log = a.json("fusion/log.json")
    if log is None:
        return a.not_built("fusion", "fusion/log.json")
    rules = log.get("rules") or []
    rows = [[r.get("rule"), r.get("kind"), r.get("fired"), (r.get("check") or {}).get("identical"),
             (r.get("check") or {}).get("max_abs"), len(r.get("near_misses") or [])] for r in rules]
    out = para(f"nodes {fmt(log.get('nodes_before'))} → {fmt(log.get('nodes_after'))}")
    out += table(["rule", "kind", "fired", "bit-identical", "max abs error", "near misses"], rows)
    misses = [m if isinstance(m, dict) else {"near miss": m}
              for r in rules for m in (r.get("near_misses") or [])]
    if misses:
        out += details(f"{len(misses)} near misses (why a rule did not fire)", records(misses))
    for warning in log.get("warnings") or []:
        out += para(f"warning: {fmt(warning)}", "warn")
    return out


# -- op coverage -------------------------------------------------------------------------------
def coverage_section(a: BuildArtifacts) -> str:
    support = a.json("split/support.json")
    if support is None:
        return a.not_built("split", "split/support.json")
    nodes = support.get("nodes") or []
    out = kv_table([(k, support.get(k)) for k in
                    ("chip", "policy", "npu_nodes", "cpu_nodes", "npu_segments", "cpu_segments")])
    cpu = [n for n in nodes if n.get("device") != "npu"]
    out += f"<h3>CPU nodes ({len(cpu)}), each with its reason</h3>"
    if cpu:
        out += table(["node", "op", "submodel", "why not on the NPU"],
                     ([n.get("name"), n.get("op"), _graph(n.get("graph")),
                       "; ".join(map(str, n.get("reasons") or [])) or "—"] for n in cpu),
                     limit=len(cpu))
    else:
        out += para("split placed every node in an NPU submodel", "ok")
    inside = _between_groups(a)
    if inside:
        out += para(f"Inside the NPU submodels, compile runs {inside}: see Layer groups and "
                    "LMEM, and Where the time goes.", "note")
    out += "<h3>By op type</h3>" + _by_op(nodes)
    return out + details(f"all {len(nodes)} nodes", table(
        ["node", "op", "device", "submodel"],
        ([n.get("name"), n.get("op"), n.get("device"), _graph(n.get("graph"))] for n in nodes),
        limit=NODE_LIMIT, hidden_note="see split/support.json"))


def _by_op(nodes: list[dict]) -> str:
    npu = Counter(n.get("op") for n in nodes if n.get("device") == "npu")
    cpu = Counter(n.get("op") for n in nodes if n.get("device") != "npu")
    ops = sorted(set(npu) | set(cpu), key=lambda op: (-cpu[op], -npu[op], str(op)))
    rows = [[op, npu[op], cpu[op]] for op in ops]
    classes = [["", "", "bad" if cpu[op] else ""] for op in ops]
    return table(["op", "on NPU", "on CPU"], rows, classes=classes)


def _between_groups(a: BuildArtifacts) -> str:
    """What compile runs between layer groups, over every NPU submodel, in words that match
    where it runs (`npubuild.report.numbers.between_groups_text`)."""
    from npubuild.report.numbers import between_groups_text

    steps = [g for path in a.glob("compile/**/plan*.json")
             for g in (a.json(a.rel(path)) or {}).get("groups") or [] if g.get("device") == "cpu"]
    return between_groups_text(steps) if steps else ""


def _graph(index) -> str:
    return "—" if index is None else f"graph_{index}"


# -- segments ----------------------------------------------------------------------------------
def segments_section(a: BuildArtifacts) -> str:
    infos = a.json("split/graph_infos.json")
    if infos is None:
        return a.not_built("split", "split/graph_infos.json")
    picture = split_graph_svg(infos, a.json("split/support.json"))
    out = (f'<figure><div class="graphbox">{picture}</div><figcaption>split/graph_infos.json, '
           "laid out by grandalf: "
           "submodels in green (NPU) and grey (CPU), the tensors between them; hover for names. "
           "<code>npubuild view RECIPE split</code> opens a submodel in Netron.</figcaption></figure>"
           if picture else "")
    rows = [[f"graph_{i}", g.get("device"), ", ".join(g.get("inputs") or []),
             ", ".join(g.get("outputs") or []), (g.get("model_info") or {}).get("model_path")]
            for i, g in enumerate(infos.get("graphs") or [])]
    out += table(["submodel", "device", "inputs", "outputs", "file"], rows)
    extra = {k: infos.get(k) for k in ("platform", "layout", "dynamic", "graph_num")}
    return out + details("graph_infos.json fields", generic(extra))
