"""What a reviewer reads first: the headline row before any section, exact thresholds, build
times of the run that built each stage, charts sized to the page with every mark named on
hover, and the hash table folded away at the end."""

from __future__ import annotations

import json
import re
from pathlib import Path

from npubuild.report import SECTIONS, render_report
from npubuild.report.charts import WIDTH, layer_error_chart
from npubuild.report.timeline import live_bytes, lmem_timeline
from npubuild.report.splitgraph import nodes_and_edges, split_graph_svg


def dump(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def reviewed_build(root: Path) -> Path:
    dump(root / "report.json", {
        "stages": {"verify": {"status": "current", "seconds": 0.0, "key": "k", "built_seconds": 12.5}},
        "split": {"npu_nodes": 90, "cpu_nodes": 10, "npu_macs": 999_000, "cpu_macs": 1_000,
                  "npu_segments": 1, "cpu_segments": 1},
        "estimate": {"fps": 1234.5, "cycles": 810, "gmem_bytes": 1000, "gmem_bytes_lower_bound": 900,
                     "gmem_bytes_no_grouping": 5000, "lmem_peak_bytes": 2048}})
    dump(root / "recipe.lock", {"recipe": "r.yaml", "resolved": {"verify": {"min_cosine": 0.99995}},
                                "stages": {"verify": {"key": "k", "files": {"verify.json": "ab" * 32}}}})
    dump(root / "verify" / "verify.json", {
        "passed": False, "outputs": {"out": {"cosine": 0.99991, "min_sample_cosine": 0.9998}},
        "npu_outputs": {"/head/p3": {"cosine": 0.99999, "min_sample_cosine": 0.99996}},
        "slices": {"class scores": {"cosine": 0.99997, "min_sample_cosine": 0.99990}}})
    dump(root / "verify" / "manifest.json", {"stage": "verify", "key": "k", "files": {}})
    return root


def test_the_headline_comes_first_with_every_figure_beside_its_exact_threshold(tmp_path):
    html = render_report(reviewed_build(tmp_path))
    head = html.split("<nav>")[0]
    assert 'class="headline"' in head and "<section" not in head
    assert 'badge big fail">FAIL' in head
    # the judged output with each value beside its exact threshold, then what nothing judges
    # (a hand-over tensor, a slice the recipe does not list): grey and labelled, never red
    rows = re.findall(r'<tr class="(\w+)"><td title="([^"]+)">', head)
    assert rows == [("bad", "out"), ("reported", "class scores"), ("reported", "/head/p3")]
    assert "0.999800 ✗ <small>≥ 0.99995</small>" in head
    assert "reported only, no threshold" in head and "0.999960</td>" in head
    assert "2 figures judged against thresholds: 2 below; 4 reported only" in head
    for figure in ("99.90%", "MACs: 999.00 k of 1.00 M", "1,234", "0.81 ms per frame",
                   "1,000 B", "lower bound: 900 B", "one layer per group: 4.88 KiB (5.0×)",
                   "2.00 KiB"):
        assert figure in head, figure


def test_thresholds_in_the_verify_section_are_not_rounded(tmp_path):
    verify = re.search(r'<section id="verify">(.*?)</section>', render_report(reviewed_build(tmp_path)), re.S)
    assert "0.99991 ✗ <small>≥ 0.99995</small>" in verify.group(1)


def test_stage_table_shows_the_build_time_of_the_run_that_built_the_stage(tmp_path):
    stages = re.search(r'<section id="stages">(.*?)</section>', render_report(reviewed_build(tmp_path)), re.S)
    assert re.search(r"<td>verify</td><td><span[^>]*>current</span></td><td>12.50</td><td>0</td>",
                     stages.group(1))


def test_the_lock_hashes_come_last_and_folded(tmp_path):
    html = render_report(reviewed_build(tmp_path))
    assert SECTIONS[-1][0] == "recipe"
    recipe = re.search(r'<section id="recipe">(.*?)</section>', html, re.S).group(1)
    assert "<details><summary>1 stage keys, 1 artifact hashes" in recipe
    assert "<details open" not in recipe


def test_the_lmem_timeline_fits_the_page_and_names_every_buffer():
    buffers = [{"id": i, "kind": "activation", "name": f"t{i}", "layer": None,
                "lifetime": [i, i + 2], "bytes_per_lane": 100, "addr": 100 * (i % 3)}
               for i in range(157)]
    picture = lmem_timeline({"index": 0, "timesteps": 159, "buffers": buffers}, 4096, 1024)
    assert re.search(rf'viewBox="0 0 {WIDTH} \d+" width="{WIDTH}"', picture)
    assert len(re.findall(r"<title>buffer #\d+ activation t\d+", picture)) == 157
    assert "peak 300 B per lane at T2" in picture  # three buffers live from T2 on


def test_live_bytes_counts_a_buffer_from_its_first_to_its_last_timestep():
    buffers = [{"id": 0, "lifetime": [0, 1], "bytes_per_lane": 10, "addr": 0},
               {"id": 1, "lifetime": [1, 3], "bytes_per_lane": 5, "addr": 10}]
    assert live_bytes(buffers, 5) == [10, 15, 5, 5, 0]


def test_the_layer_chart_has_one_named_bar_per_tensor():
    rows = [{"tensor": f"t{i}", "cosine": c} for i, c in enumerate([0.5, 0.999, 0.99999, None])]
    chart = layer_error_chart(rows, 0.99)
    assert re.findall(r"<title>#\d (t\d) ", chart) == ["t0", "t1", "t2"]
    assert 'fill="#9a5b00"><title>#1 t0' in chart  # below 0.9: dark amber, not a verdict's red


def test_the_split_graph_has_every_segment_and_every_tensor_between_them():
    infos = {"graphs": [{"device": "npu", "inputs": ["x"], "outputs": ["a", "b"]},
                        {"device": "cpu", "inputs": ["a", "b"], "outputs": ["y"]}],
             "tensors": {"x": {"shape": [1, 3, 8, 8], "attr": "input"},
                         "y": {"shape": [1, 10], "attr": "output"}}}
    vertices, edges = nodes_and_edges(infos, {"nodes": [{"graph": 0, "op": "Conv"}]})
    assert [v["id"] for v in vertices] == ["t:x", "g:0", "t:a", "t:b", "g:1", "t:y"]
    assert edges == [("t:x", "g:0"), ("g:0", "t:a"), ("g:0", "t:b"), ("t:a", "g:1"),
                     ("t:b", "g:1"), ("g:1", "t:y")]
    picture = split_graph_svg(infos, {"nodes": [{"graph": 0, "op": "Conv"}]})
    assert picture.count('marker-end="url(#arrow)"') == 6 and "graph_1 · CPU" in picture
    assert "<title>model input x: shape [1, 3, 8, 8]</title>" in picture
    lefts = [float(x) for x in re.findall(r'<rect x="([\d.]+)"', picture)]
    assert lefts == sorted(lefts)  # left to right: x, graph_0, a/b, graph_1, y
