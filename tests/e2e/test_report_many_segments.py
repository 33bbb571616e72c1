"""report.html of a build with many segments, in headless Chromium: a model whose Conv layers
alternate with Sin (on the CPU: no NPU kernel) splits into 9 segments; the page stays within a
laptop's width, the split graph's text is drawn at a readable size (it was about 5 px for 9
segments), the headline fits the first screen, and every in-page link has its target."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from npubuild import api
from npubuild.report import write_report
from tests.e2e.test_report_browser import NEEDS_CHROMIUM, chromium

SEGMENTS = 9
RECIPE = """\
version: 1
name: many-segments
model:
  path: chain.onnx
  inputs:
    - name: x
      shape: [1, 3, 16, 16]
      preprocess: {resize: [16, 16], scale: 0.00392156862745098}
quantization:
  calibration: {data: "pkg:skimage/data/[a-c]*.png", samples: 2}
verify: {data: "pkg:skimage/data/[g-h]*.png", samples: 2, min_cosine: 0.9}
"""

LAYOUT_PROBE = """<script>
window.addEventListener("load", () => {
  const graph = document.querySelector("#segments svg");
  const titles = Array.from(graph.querySelectorAll('text[font-weight="700"]'));
  const heights = titles.map(t => t.getBoundingClientRect().height);
  const anchors = Array.from(document.querySelectorAll('a[href^="#"]'));
  const dangling = anchors.filter(a => !document.getElementById(a.getAttribute("href").slice(1)));
  document.body.dataset.layout = JSON.stringify({
    scrollWidth: document.documentElement.scrollWidth,
    headlineBottom: Math.round(document.querySelector(".headline").getBoundingClientRect().bottom),
    segments: titles.length,
    smallestTitle: Math.min(...heights),
    graphWidth: Math.round(graph.getBoundingClientRect().width),
    dangling: dangling.length,
    timeRows: document.querySelectorAll("#time table.time tbody tr").length,
  });
});
</script>
</body>"""


def chain_model(path: Path, segments: int) -> None:
    """Conv, Sin, Conv, Sin, … : every Sin is a CPU segment between two NPU ones."""
    rng = np.random.default_rng(0)
    nodes, inits, current = [], [], "x"
    for i in range((segments + 1) // 2):
        w = numpy_helper.from_array(rng.normal(0, 0.3, (3, 3, 3, 3)).astype(np.float32), f"w{i}")
        inits.append(w)
        nodes.append(helper.make_node("Conv", [current, f"w{i}"], [f"conv{i}"], name=f"conv{i}",
                                      pads=[1, 1, 1, 1]))
        current = f"conv{i}"
        if 2 * i + 1 < segments:
            nodes.append(helper.make_node("Sin", [current], [f"sin{i}"], name=f"sin{i}"))
            current = f"sin{i}"
    graph = helper.make_graph(
        nodes, "chain", [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 3, 16, 16])],
        [helper.make_tensor_value_info(current, TensorProto.FLOAT, [1, 3, 16, 16])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    onnx.save(model, path)


@pytest.fixture(scope="module")
def page(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("segments")
    chain_model(root / "chain.onnx", SEGMENTS)
    (root / "recipe.yaml").write_text(RECIPE)
    session = api.session_for(root / "recipe.yaml", build_root=root / "build", cache=root / "cache")
    report = api.build(session)
    assert report["split"]["npu_segments"] + report["split"]["cpu_segments"] == SEGMENTS
    return write_report(session.paths.root, root / "report.html")


@NEEDS_CHROMIUM
def test_a_many_segment_report_stays_readable_in_a_browser(page, tmp_path):
    import json

    probe = tmp_path / "probe.html"
    probe.write_text(page.read_text().replace("</body>", LAYOUT_PROBE))
    dom = chromium(tmp_path / "profile", "--window-size=1280,900", "--dump-dom", probe.as_uri())
    found = re.search(r'data-layout="([^"]*)"', dom)
    assert found, "the layout probe did not run"
    layout = json.loads(found.group(1).replace("&quot;", '"'))
    assert layout["segments"] == SEGMENTS
    assert layout["smallestTitle"] >= 13  # 14 px bold titles drawn at full size, not ~5 px
    assert layout["scrollWidth"] <= 1280 and layout["graphWidth"] <= 1240
    assert layout["headlineBottom"] < 900 and layout["dangling"] == 0
    assert layout["timeRows"] >= SEGMENTS  # every group and CPU part, in pipeline order
