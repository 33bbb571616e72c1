"""The split as a graph: submodels (NPU / CPU segments) and the tensors between them, laid out
left to right by grandalf's Sugiyama layout and drawn as inline SVG (a hover shows each
tensor's full name and shape, each segment's op counts and file).

Read from ``split/graph_infos.json`` (segments, their inputs and outputs, tensor shapes) and
``split/support.json`` (which ops each segment holds).
"""

from __future__ import annotations

from collections import Counter
from html import escape

from npubuild.report.charts import WIDTH, svg

SEGMENT_W, SEGMENT_H, TENSOR_W, TENSOR_H = 210, 74, 200, 40
GAP_LAYERS, MARGIN = 70, 16
DEVICE_STYLE = {"npu": ("#e3f4e1", "#2e7d32"), "cpu": ("#eef0f3", "#57606a")}


class _View:
    """What grandalf needs of a vertex: its size; it writes back ``xy``."""

    def __init__(self, w: float, h: float):
        self.w, self.h, self.xy = w, h, (0.0, 0.0)


class _EdgeView:
    def __init__(self):
        self.points: list = []

    def setpath(self, points) -> None:
        self.points = list(points)


def nodes_and_edges(infos: dict, support: dict | None) -> tuple[list[dict], list[tuple[str, str]]]:
    """Vertices (tensors and segments, in file order) and edges tensor → segment → tensor."""
    tensors = infos.get("tensors") or {}
    ops: dict[int, Counter] = {}
    for node in (support or {}).get("nodes") or []:
        if isinstance(node.get("graph"), int) and node.get("op") != "Constant":
            op = str(node.get("op")).removeprefix("fused op ")  # support.json's label
            ops.setdefault(node["graph"], Counter())[op] += 1
    vertices, edges, seen = [], [], set()

    def tensor(name: str) -> str:
        key = f"t:{name}"
        if key not in seen:
            seen.add(key)
            vertices.append({"id": key, "kind": "tensor", "name": name,
                             "attr": (tensors.get(name) or {}).get("attr", "intermediate"),
                             "shape": (tensors.get(name) or {}).get("shape")})
        return key

    for i, graph in enumerate(infos.get("graphs") or []):
        key = f"g:{i}"
        for name in graph.get("inputs") or []:
            edges.append((tensor(name), key))
        vertices.append({"id": key, "kind": "segment", "index": i,
                         "device": graph.get("device", "?"), "ops": ops.get(i, Counter()),
                         "file": (graph.get("model_info") or {}).get("model_path")})
        seen.add(key)
        for name in graph.get("outputs") or []:
            edges.append((key, tensor(name)))
    return vertices, edges


def layout(vertices: list[dict], edges: list[tuple[str, str]], across: bool = True
           ) -> tuple[dict, list]:
    """grandalf's Sugiyama layout: the placed vertices by id and, per edge, its view with the
    bend points. grandalf lays layers out top-down; ``across`` swaps the box sides so the
    picture reads left to right."""
    from grandalf.graphs import Edge, Graph, Vertex
    from grandalf.layouts import SugiyamaLayout

    by_id = {}
    for v in vertices:
        vertex = Vertex(v["id"])
        w, h = (SEGMENT_W, SEGMENT_H) if v["kind"] == "segment" else (TENSOR_W, TENSOR_H)
        vertex.view = _View(h + 12, w) if across else _View(w + 16, h)
        by_id[v["id"]] = vertex
    links = []
    for a, b in edges:
        edge = Edge(by_id[a], by_id[b])
        edge.view = _EdgeView()
        links.append(edge)
    for component in Graph(list(by_id.values()), links).C:
        sugiyama = SugiyamaLayout(component)
        sugiyama.yspace, sugiyama.xspace = (GAP_LAYERS, 12) if across else (GAP_DOWN, 16)
        sugiyama.init_all()
        sugiyama.draw()
    return by_id, links


GAP_DOWN = 36  # between layers when drawn top-down
READABLE = 1.25  # a left-right picture wider than WIDTH × this (text below ~10 px) is drawn top-down


def split_graph_svg(infos: dict, support: dict | None) -> str:
    """The inline SVG, or "" when there is nothing to draw: left to right while that fits the
    page at (nearly) full size, else top-down, so the text stays readable at any segment
    count (a 9-segment graph drawn across was scaled to about 5 px text)."""
    vertices, edges = nodes_and_edges(infos, support)
    if not vertices:
        return ""
    drawn = _draw(vertices, edges, across=True)
    if drawn[0] > WIDTH * READABLE:
        drawn = _draw(vertices, edges, across=False)
    width, height, body, across = drawn
    label = "split graph: segments and the tensors between them"
    return svg(width, height, body, label, natural=not across)


def _draw(vertices: list[dict], edges: list, *, across: bool):
    by_id, links = layout(vertices, edges, across)

    def our(xy) -> tuple[float, float]:  # grandalf's y runs along the layers
        return (xy[1], xy[0]) if across else (xy[0], xy[1])

    placed = [our(by_id[v["id"]].view.xy) for v in vertices]
    half_w, half_h = max(SEGMENT_W, TENSOR_W) / 2, SEGMENT_H / 2
    x0 = min(x for x, _ in placed) - half_w - MARGIN
    y0 = min(y for _, y in placed) - half_h - MARGIN
    width = max(x for x, _ in placed) - x0 + half_w + MARGIN
    height = max(y for _, y in placed) - y0 + half_h + MARGIN

    def at(point) -> tuple[float, float]:
        x, y = our(point)
        return x - x0, y - y0

    body = ['<defs><marker id="arrow" viewBox="0 0 10 10" refX="9" refY="5" markerWidth="7" '
            'markerHeight="7" orient="auto-start-reverse"><path d="M0,0L10,5L0,10z" '
            'fill="#57606a"/></marker></defs>']
    for edge, (a, b) in zip(links, edges):
        body.append(_edge(edge.view.points, by_id[a], by_id[b], at, across))
    for v in vertices:
        cx, cy = at(by_id[v["id"]].view.xy)
        body.append(_segment(v, cx, cy) if v["kind"] == "segment" else _tensor(v, cx, cy))
    return width, height, body, across


def _edge(points, a, b, at, across: bool = True) -> str:
    """A path from the side of ``a`` facing ``b`` to the side of ``b`` facing ``a`` (right to
    left across, bottom to top down) through grandalf's bends."""
    pts = [at(p) for p in points] if points else [at(a.view.xy), at(b.view.xy)]
    start, end = at(a.view.xy), at(b.view.xy)
    if across:
        pts[0] = (start[0] + a.view.h / 2, start[1])
        pts[-1] = (end[0] - b.view.h / 2 - 2, end[1])
    else:
        ha, hb = _half_height(a), _half_height(b)
        pts[0] = (start[0], start[1] + ha)
        pts[-1] = (end[0], end[1] - hb - 2)
    d = f"M{pts[0][0]:.1f},{pts[0][1]:.1f}"
    for (x1, y1), (x2, y2) in zip(pts, pts[1:]):
        if across:
            mid = (x1 + x2) / 2
            d += f" C{mid:.1f},{y1:.1f} {mid:.1f},{y2:.1f} {x2:.1f},{y2:.1f}"
        else:
            mid = (y1 + y2) / 2
            d += f" C{x1:.1f},{mid:.1f} {x2:.1f},{mid:.1f} {x2:.1f},{y2:.1f}"
    return (f'<path d="{d}" fill="none" stroke="#57606a" stroke-width="1.3" '
            'marker-end="url(#arrow)"/>')


def _half_height(vertex) -> float:
    return (SEGMENT_H if vertex.data.startswith("g:") else TENSOR_H) / 2


def _segment(v: dict, cx: float, cy: float) -> str:
    fill, stroke = DEVICE_STYLE.get(v["device"], ("#fff", "#333"))
    ops = v["ops"]
    top = ", ".join(f"{op}×{n}" for op, n in ops.most_common(3))
    x, y = cx - SEGMENT_W / 2, cy - SEGMENT_H / 2
    tip = (f"graph_{v['index']} on the {v['device'].upper()}: {sum(ops.values())} nodes"
           f" ({', '.join(f'{op}×{n}' for op, n in ops.most_common())}); file {v['file']}")
    return (f'<g><title>{escape(tip)}</title><rect x="{x:.1f}" y="{y:.1f}" width="{SEGMENT_W}" '
            f'height="{SEGMENT_H}" rx="8" fill="{fill}" stroke="{stroke}" stroke-width="2"/>'
            f'<text x="{x + 10:.1f}" y="{y + 22:.1f}" font-weight="700" font-size="14">'
            f'graph_{v["index"]} · {escape(v["device"].upper())}</text>'
            f'<text x="{x + 10:.1f}" y="{y + 42:.1f}">{sum(ops.values())} nodes</text>'
            f'<text x="{x + 10:.1f}" y="{y + 60:.1f}" fill="#57606a">{escape(_clip(top, 30))}</text>'
            "</g>")


def _tensor(v: dict, cx: float, cy: float) -> str:
    x, y = cx - TENSOR_W / 2, cy - TENSOR_H / 2
    shape = "×".join(map(str, v["shape"])) if isinstance(v.get("shape"), list) else "?"
    role = {"input": "model input", "output": "model output"}.get(v["attr"], "tensor")
    stroke = "#1a4f8b" if v["attr"] in ("input", "output") else "#8c959f"
    tip = f"{role} {v['name']}: shape {v.get('shape')}"
    return (f'<g><title>{escape(tip)}</title><rect x="{x:.1f}" y="{y:.1f}" width="{TENSOR_W}" '
            f'height="{TENSOR_H}" rx="{TENSOR_H / 2}" fill="#fff" stroke="{stroke}"/>'
            f'<text x="{cx:.1f}" y="{y + 17:.1f}" text-anchor="middle" font-family="monospace" '
            f'font-size="11">{escape(_clip(v["name"], 30, tail=True))}</text>'
            f'<text x="{cx:.1f}" y="{y + 32:.1f}" text-anchor="middle" fill="#57606a" '
            f'font-size="11">{escape(shape)}</text></g>')


def _clip(text: str, keep: int, tail: bool = False) -> str:
    if len(text) <= keep:
        return text
    return "…" + text[-(keep - 1):] if tail else text[: keep - 1] + "…"
