"""report.html from build directories with only some stages: sections say "not built", text is
escaped, every picture is inlined, and nothing points at the network."""

from __future__ import annotations

import base64
import io
import json
import re
import shutil
from pathlib import Path

import pytest
from PIL import Image

from npubuild import api
from npubuild.report import SECTIONS, render_report, write_report
from npubuild.report.artifacts import BuildArtifacts
from npubuild.report.overview import verdict
from tests.conftest import TINY_RECIPE, write_recipe
from tests.unit.report.current import mark_current

EVIL = '<img src=x onerror="alert(1)">&amp;/model.0/Conv'


def section(html: str, key: str) -> str:
    match = re.search(rf'<section id="{key}">(.*?)</section>', html, re.S)
    assert match, f"no section {key}"
    return match.group(1)


def images(html: str) -> list[str]:
    return re.findall(r'<img src="([^"]*)"', html)


def dump(path: Path, data) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data))


def png_bytes() -> bytes:
    out = io.BytesIO()
    Image.new("RGB", (8, 6), (200, 30, 30)).save(out, format="PNG")
    return out.getvalue()


@pytest.fixture(scope="module")
def tiny_split(tmp_path_factory) -> Path:
    """The real tiny model built up to split, with its Relu forced to the CPU."""
    root = tmp_path_factory.mktemp("report")
    recipe = write_recipe(root, TINY_RECIPE + "split:\n  force_cpu: [Relu]\n")
    session = api.session_for(recipe, build_root=root / "build", cache=root / "cache")
    api.build(session, "split")
    return session.paths.root


@pytest.fixture
def synthetic(tmp_path) -> Path:
    """Every later stage's files, in the shapes the report reads."""
    root = tmp_path / "build" / "syn"
    dump(root / "report.json", {"recipe": "r.yaml", "target": "npu-16m", "stages": {
        "verify": {"status": "built", "seconds": 1.5, "key": "ab" * 32}},
        "estimate": {"cycles": 500, "cycles_no_grouping": 1000, "fps": 1e6, "fps_no_grouping": 5e5,
                     "gmem_bytes": 300, "gmem_bytes_no_grouping": 900, "lmem_peak_bytes": 4096,
                     "groups": 2}})
    dump(root / "quantize" / "per_layer.json", {"tensors": [
        {"tensor": f"t{i}", "layer": f"l{i}", "cosine": c}
        for i, c in enumerate([0.99, 0.5, None, 0.9])]})
    buffers = [{"id": i, "kind": ("activation", "weight")[i % 2], "name": f"buf{i}",
                "layer": EVIL if i == 3 else None, "lifetime": [i % 4, i % 4 + 1],
                "bytes_per_lane": 16, "addr": 16 * (i % 3)} for i in range(6)]
    dump(root / "compile" / "graph_0" / "plan.json", {
        "chip": {"lanes": 4, "lmem_bytes_per_lane": 128, "bank_bytes": 32},
        "groups": [{"index": 0, "device": "npu", "layers": ["a", "b"],
                    "slicing": {"n": 1, "h": 2, "c": 1}, "timesteps": 6, "buffers": buffers,
                    "lmem": {"peak_bytes_per_lane": 64, "bank_crossings": 0}},
                   {"index": 1, "device": "cpu", "layer": EVIL, "reason": "no kernel"}]})
    dump(root / "verify" / "verify.json", {
        "verdict": {"passed": False, "reasons": ["cosine 0.5 < 0.99"]},
        "outputs": {"output0": {"cosine": 0.5, "max_abs": 3.0}},
        "thresholds": {"min_cosine": 0.99},
        "bisection": {"stage": "quantize", "tensor": EVIL}})
    (root / "verify" / "detections.png").write_bytes(png_bytes())
    mark_current(root, "quantize", "compile", "verify")
    return root


def test_an_empty_build_directory_says_not_built_everywhere(tmp_path):
    html = render_report(tmp_path)
    assert html.startswith("<!DOCTYPE html>") and html.rstrip().endswith("</html>")
    for key, _, _ in SECTIONS:
        assert "not built" in section(html, key), key
    assert 'class="error"' not in html and images(html) == []


def test_a_build_up_to_split_fills_the_early_sections_only(tiny_split):
    html = render_report(tiny_split)
    assert 'class="error"' not in html
    for key in ("recipe", "stages", "model", "coverage", "segments"):
        assert "has not written" not in section(html, key), key
    for key, stage in (("verify", "verify"), ("quantization", "quantize"), ("lmem", "compile"),
                       ("estimate", "compile")):
        assert f"not built: {stage} has not written" in section(html, key), key
    coverage = section(html, "coverage")
    assert "CPU nodes (1)" in coverage and "relu" in coverage
    assert "forced to the CPU by split.force_cpu[0] (&#x27;Relu&#x27;)" in coverage
    assert "no verdict: verify not built" in html


def test_node_names_and_reasons_are_escaped(tiny_split, tmp_path):
    build = tmp_path / "b"
    (build / "split").mkdir(parents=True)
    support = json.loads((tiny_split / "split" / "support.json").read_text())
    support["nodes"][1].update(name=EVIL, reasons=["rank <4> & </td> broken"])
    dump(build / "split" / "support.json", support)
    mark_current(build, "split")
    coverage = section(render_report(build), "coverage")
    assert "<img" not in coverage and "</td> broken" not in coverage
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&amp;amp;/model.0/Conv" in coverage
    assert "rank &lt;4&gt; &amp; &lt;/td&gt; broken" in coverage


def test_pictures_are_inlined_and_charts_are_inline_svg(synthetic, tiny_split):
    shutil.copytree(tiny_split / "split", synthetic / "split")
    mark_current(synthetic, "split")
    html = render_report(synthetic)
    (source,) = images(html)  # the one raster picture: the detections
    assert base64.b64decode(source.split(",", 1)[1]) == png_bytes()
    lmem = section(html, "lmem")
    assert lmem.count("<title>buffer #") == 6 and "&lt;img src=x" in lmem and "<img" not in lmem
    segments = section(html, "segments")
    assert segments.count('<svg class="chart') == 1 and "graph_0 · NPU" in segments


def test_no_link_leaves_the_page(synthetic):
    html = render_report(synthetic)
    assert not re.search(r'(href|src)\s*=\s*"(?!#|data:)', html)
    for anchor in re.findall(r'href="#([^"]+)"', html):
        assert f'id="{anchor}"' in html


def test_verdict_metrics_bisection_and_detections(synthetic):
    html = render_report(synthetic)
    verify = section(html, "verify")
    assert 'badge fail">FAIL' in verify and "cosine 0.5 &lt; 0.99" in verify
    assert '<td id="fig-accuracy-outputs-output0-cosine" class="cell-bad">0.5 ✗ <small>≥ 0.99</small>' in verify
    assert "Stage bisection" in verify and "&lt;img src=x" in verify
    assert "Detections: float (green) vs deployed (red)" in verify
    assert "data:image/png;base64," in verify
    assert 'badge big fail">FAIL' in html.split("<nav>")[0]  # also in the headline


@pytest.mark.parametrize("value, kind", [("pass", "pass"), ("PASSED", "pass"), (True, "pass"),
                                         ({"passed": True}, "pass"), ("fail", "fail"),
                                         (False, "fail"), ({"status": "failed"}, "fail"),
                                         ("maybe", "none")])
def test_verdict_forms(tmp_path, value, kind):
    dump(tmp_path / "verify" / "verify.json", {"verdict": value})
    mark_current(tmp_path, "verify")
    assert verdict(BuildArtifacts(tmp_path))[0] == kind


def test_per_layer_table_is_worst_first(synthetic):
    quant = section(render_report(synthetic), "quantization")
    assert re.findall(r"<td>(t\d)</td>", quant) == ["t1", "t3", "t0", "t2"]


def test_estimate_compares_with_and_without_grouping(synthetic):
    estimate = section(render_report(synthetic), "estimate")
    assert re.search(r"<td>GMEM bytes moved</td><td>300</td><td>900</td><td>0.3333</td>", estimate)
    assert re.search(r"<td>cycles</td><td>500</td><td>1,000</td><td>0.5</td>", estimate)


def test_long_tables_say_how_many_rows_they_hide(tmp_path):
    nodes = [{"name": f"n{i}", "op": "Relu", "device": "cpu" if i % 2 else "npu", "graph": 0,
              "reasons": ["because"]} for i in range(700)]
    dump(tmp_path / "split" / "support.json", {"nodes": nodes})
    mark_current(tmp_path, "split")
    coverage = section(render_report(tmp_path), "coverage")
    assert "CPU nodes (350)" in coverage and coverage.count("<td>because</td>") == 350
    assert "200 more rows not shown (see split/support.json)" in coverage


def test_an_unreadable_artifact_breaks_only_its_section(tiny_split, tmp_path):
    build = tmp_path / "b"
    for name in ("report.json", "recipe.lock"):
        (build / name).parent.mkdir(parents=True, exist_ok=True)
        (build / name).write_bytes((tiny_split / name).read_bytes())
    (build / "split").mkdir()
    (build / "split" / "support.json").write_text("{not json")
    shutil.copy(tiny_split / "split" / "manifest.json", build / "split" / "manifest.json")
    html = render_report(build)
    assert 'class="error"' in section(html, "coverage")
    assert html.count('class="error"') == 1 and "<table>" in section(html, "stages")


def test_write_report_is_atomic_and_render_is_pure(tiny_split, tmp_path):
    before = sorted(p.relative_to(tiny_split) for p in tiny_split.rglob("*"))
    out = write_report(tiny_split, tmp_path / "verify" / "report.html")
    assert out.read_text() == render_report(tiny_split)
    assert [p.name for p in out.parent.iterdir()] == ["report.html"]
    assert sorted(p.relative_to(tiny_split) for p in tiny_split.rglob("*")) == before


def test_a_running_stage_can_be_read_from_its_scratch_directory(synthetic, tmp_path):
    scratch = tmp_path / "scratch-verify"
    (synthetic / "verify").rename(scratch)
    assert "no verdict: verify not built" in render_report(synthetic)
    html = render_report(synthetic, stage_dirs={"verify": scratch})
    assert 'badge fail">FAIL' in html and "<figcaption>verify/detections.png</figcaption>" in html
