"""report.html for a 30-second decision: judged and reported-only figures apart (an unjudged
hand-over tensor is never red under a PASS), every judged number beside its threshold, the task
metric with its evidence, fps deployed and NPU alone, where the time goes, placement words that
match what runs where, per-layer counts, a way from a failing tensor to `npubuild view`, and a
split graph readable at any segment count."""

from __future__ import annotations

import json
import re
from pathlib import Path

from npubuild.report import render_report
from npubuild.report.splitgraph import split_graph_svg

from tests.unit.report.current import mark_current


def dump(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def section(html: str, key: str) -> str:
    return re.search(rf'<section id="{key}">(.*?)</section>', html, re.S).group(1)


def head(html: str) -> str:
    return html.split("<nav>")[0]


ESTIMATE = {"cycles": 1000, "npu_seconds": 1e-4, "npu_fps": 10000.0, "fps": 1600.0,
            "cpu_seconds": 5.25e-4, "gmem_bytes": 10, "gmem_bytes_no_grouping": 20,
            "cpu": {"parts": {"graph_1": {"seconds": 5e-4, "nodes": 1},
                              "graph_0//head/Concat": {"seconds": 2.5e-5, "nodes": 1,
                                                       "reason": "no integer kernel"}}},
            "graphs": {"graph_0": {"cycles": 1000, "between_groups_cycles": 200}}}


def build(root: Path, *, estimate=ESTIMATE, passed=True, handover=0.97, vendor=None) -> Path:
    """A two-segment build (NPU graph_0, CPU graph_1) as its stages would leave it."""
    dump(root / "recipe.lock", {"recipe": "r.yaml", "resolved": {"verify": {
        "min_cosine": 0.99, "min_task_agreement": 0.9, "handover": {}}}})
    dump(root / "report.json", {"split": {"npu_nodes": 9, "cpu_nodes": 1, "npu_segments": 1,
                                          "cpu_segments": 1}, "estimate": estimate,
                                "vendor": vendor})
    dump(root / "verify" / "verify.json", {
        "passed": passed, "failures": [] if passed else ["output 'y': cosine 0.9 < 0.99"],
        "samples": 7,
        "outputs": {"y": {"cosine": 0.995 if passed else 0.9, "min_sample_cosine": 0.993}},
        "npu_outputs": {"/head/Conv_output_0": {"cosine": handover, "min_sample_cosine": 0.95}},
        "task": {"task": "detector", "float_boxes": 2, "matched": 2, "box_recall": 1.0,
                 "agreement": 1.0, "agreement_is": "box recall"}})
    dump(root / "split" / "graph_infos.json", {"graphs": [
        {"device": "npu", "inputs": ["x"], "outputs": ["/head/Conv_output_0"]},
        {"device": "cpu", "inputs": ["/head/Conv_output_0"], "outputs": ["y"]}], "tensors": {}})
    dump(root / "split" / "support.json", {"nodes": [
        {"name": "up", "op": "ConvTranspose", "device": "cpu", "graph": 1, "reasons": ["no"]}]})
    dump(root / "compile" / "graph_0" / "plan.json", {
        "groups": [{"index": 0, "device": "npu", "layers": ["conv0", "conv1", "conv2"]},
                   {"index": 1, "device": "cpu", "layer": "r", "executes": "dma",
                    "reason": "reshape: a whole-tensor DMA step"},
                   {"index": 2, "device": "cpu", "layer": "s", "executes": "npu", "reason": "softmax"},
                   {"index": 3, "device": "cpu", "layer": "/head/Concat", "executes": "cpu",
                    "reason": "no integer kernel"}],
        "estimate": {"groups": [{"index": 0, "layers": 3, "cycles": 800, "compute_cycles": 500,
                                 "dma_cycles": 300, "slicing": {"n": 1, "h": 2, "c": 1}}]}})
    dump(root / "quantize" / "per_layer.json", {"tensors": [
        {"tensor": "y", "cosine": 0.4999, "samples": 2}, {"tensor": "a", "cosine": 0.999, "samples": 2},
        {"tensor": "b", "cosine": 0.95, "samples": 2}, {"tensor": "c", "cosine": 0.9999, "samples": 2}]})
    mark_current(root, "split", "quantize", "compile", "verify")
    return root


def test_an_unjudged_hand_over_tensor_is_never_red_under_a_pass(tmp_path):
    html = render_report(build(tmp_path))
    verify = section(html, "verify")
    assert "Tensors the NPU hands over (vs the float pipeline) — reported only" in verify
    assert 'class="cell-bad"' not in verify and 'class="cell-reported">0.97</td>' in verify
    assert 'class="cell-good">0.995 ✓ <small>≥ 0.99</small>' in verify
    assert 'class="bad"' not in head(html) and '<tr class="reported">' in head(html)
    assert "1 figures judged" not in head(html)
    assert "3 figures judged against thresholds: all met; 2 reported only" in head(html)


def test_the_task_metric_says_what_it_rests_on(tmp_path):
    html = render_report(build(tmp_path))
    assert "box recall 1.00 ≥ 0.9 over 2 float boxes in 7 images" in head(html)
    assert "over 2 float boxes in 7 images." in section(html, "verify")


def test_fps_deployed_and_npu_alone_are_both_labelled_with_the_cpu_share(tmp_path):
    top = head(render_report(build(tmp_path)))
    assert "fps deployed (NPU + CPU)</div><div class=\"tile-value\">1,600" in top
    assert "0.625 ms per frame" in top and "NPU alone: 10,000 fps (0.1 ms)" in top
    assert "CPU: 0.525 ms = 84% of the frame (2 parts)" in top


def test_after_a_cache_restore_the_npu_fps_stays_and_says_why_the_cpu_part_is_missing(tmp_path):
    restored = {k: v for k, v in ESTIMATE.items() if k not in ("fps", "cpu_seconds")}
    restored["cpu"] = {"parts": {k: {"nodes": 1} for k in ESTIMATE["cpu"]["parts"]}}
    top = head(render_report(build(tmp_path, estimate=restored)))
    assert "fps NPU alone</div><div class=\"tile-value\">10,000" in top
    assert "CPU part not measured here: compile was restored from a cache" in top
    assert "`npubuild run R --force compile` measures them" in top


def test_where_the_time_goes_per_layer_group_and_cpu_part(tmp_path):
    time = section(render_report(build(tmp_path)), "time")
    assert ("A frame: 0.625 ms = NPU 0.1 ms (16%) + CPU 0.525 ms (84%, 2 parts), run one after "
            "the other: 1,600 fps.") in time
    parts = re.findall(r"<tr><td><code>([^<]+)</code></td><td>(\w+)</td><td class=\"num\">([^<]+)"
                       r"</td><td class=\"num\">([^<]+)</td>", time)
    assert parts == [("graph_0 group 0", "NPU", "80 µs", "12.8%"),
                     ("graph_0 between groups", "NPU", "20 µs", "3.2%"),
                     ("/head/Concat", "CPU", "25 µs", "4.0%"),
                     ("graph_1", "CPU", "0.5 ms", "80.0%")]
    assert "CPU segment, 1 nodes: ConvTranspose×1" in time
    assert "3 layers (conv0 … conv2), slices n×h×c 1×2×1" in time


def test_placement_words_match_what_runs_where(tmp_path):
    html = render_report(build(tmp_path))
    expected = ("1 whole-tensor DMA step and 1 whole-tensor NPU step between layer groups (on the "
                "NPU); 1 layer on the CPU between groups (no integer kernel)")
    assert expected in section(html, "coverage") and expected in section(html, "lmem")
    assert "left to the CPU by compile" not in html
    assert "+ 1 layer on the CPU (compile)" in head(html)


def test_per_layer_figures_are_counted_labelled_and_tied_to_verify(tmp_path):
    quant = section(render_report(build(tmp_path)), "quantization")
    assert "4 tensors compared, 2 below 0.99." in quant
    assert "<th>cosine (mean per sample)</th>" in quant and 'class="bad"' not in quant
    assert '<td class="lower">0.4999</td>' in quant
    assert "0.995000 all samples, 0.993000 worst sample (judged)" in quant  # the same tensor, y


def test_a_failing_tensor_says_how_to_open_it_in_netron(tmp_path):
    html = render_report(build(tmp_path, passed=False))
    verify = section(html, "verify")
    assert "<h3>Where to look</h3>" in verify
    assert "<code>npubuild view r.yaml quantize --graph N</code>" in verify
    assert 'class="cell-bad">0.9 ✗ <small>≥ 0.99</small>' in verify
    assert '<tr class="bad"><td title="y"><a href="#fig-accuracy-outputs-y' in head(html)


def test_every_in_page_link_has_its_target(tmp_path):
    for passed in (True, False):
        html = render_report(build(tmp_path / str(passed), passed=passed))
        for anchor in re.findall(r'href="#([^"]+)"', html):
            assert f'id="{anchor}"' in html, anchor


def many_segments(n: int) -> dict:
    graphs, tensors = [], {"t0": {"attr": "input", "shape": [1, 3, 8, 8]}}
    for i in range(n):
        graphs.append({"device": "npu" if i % 2 == 0 else "cpu", "inputs": [f"t{i}"],
                       "outputs": [f"t{i + 1}"]})
    tensors[f"t{n}"] = {"attr": "output", "shape": [1, 10]}
    return {"graphs": graphs, "tensors": tensors}


def test_a_many_segment_split_graph_is_drawn_top_down_at_full_size():
    few, many = split_graph_svg(many_segments(2), None), split_graph_svg(many_segments(9), None)
    assert 'class="chart"' in few  # across, scaled to the page
    assert 'class="chart natural"' in many  # top-down, at its own size: text stays 11-14 px
    width, height = map(float, re.search(r'viewBox="0 0 (\d+) (\d+)"', many).groups())
    assert width <= 1160 < height
    tops = [float(y) for y in re.findall(r'<rect x="[\d.]+" y="([\d.]+)" width="210"', many)]
    assert tops == sorted(tops) and len(tops) == 9  # graph_0 above graph_1 above ...


def test_a_real_chip_names_whose_estimate_each_speed_figure_is(tmp_path):
    from npubuild.report.summary import headline_lines

    root = build(tmp_path, estimate={"cycles": 976364, "npu_fps": 512.1},
                 vendor={"backend": "vela", "cycles": 1046251, "inferences_per_second": 477.9})
    top = head(render_report(root))
    assert "speed of the NPU part</div><div class=\"tile-value\">478 inferences/s" in top
    assert "512 fps (npubuild&#x27;s model of the chip)" in top and "NPU alone" not in top
    line = next(x for x in headline_lines(root) if x.startswith("NPU part"))
    assert line == ("NPU part: 478 inferences/s (vela's estimate), 512 fps (npubuild's model of "
                    "the chip); a real-chip build times no CPU part")
