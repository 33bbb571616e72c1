"""LMEM timeline pictures."""

import xml.etree.ElementTree as ET

from npubuild.npu import build_program, plan_groups, write_timelines
from npubuild.npu.builder import GraphBuilder
from npubuild.targets import load_chip

SVG = "{http://www.w3.org/2000/svg}"


def test_one_svg_per_group_with_one_rectangle_per_buffer(tmp_path):
    b = GraphBuilder({"x": (1, 16, 64, 64)})
    y = b.conv("x", 16)
    graph = b.build([b.add(y, b.lut(y))])
    program = build_program(plan_groups(graph, load_chip("npu-tiny")))
    paths = write_timelines(program, tmp_path)
    assert len(paths) == len(program.npu_groups)
    for path, group in zip(paths, program.npu_groups):
        root = ET.parse(path).getroot()
        titled = [g for g in root.iter(f"{SVG}g") if g.find(f"{SVG}title") is not None]
        assert len(titled) == len(group.plan.buffers)
        assert any("weight" in g.find(f"{SVG}title").text for g in titled)
