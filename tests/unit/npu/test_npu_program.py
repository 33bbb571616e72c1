"""The program's steps and plan.json."""

import json

from npubuild.npu import Rows, build_program, estimate, plan_dict, plan_groups, write_plan
from npubuild.npu.builder import GraphBuilder
from npubuild.npu.program import Compute, Dma
from npubuild.targets import load_chip


def program_for(shape=(1, 16, 160, 160), chip="npu-tiny"):
    b = GraphBuilder({"x": shape})
    y = b.conv("x", 16, k=3, s=2)
    y = b.mul(y, b.lut(y))
    y = b.add(y, b.conv(y, 16, k=3))
    z = b.resize(b.pool(y, k=3, s=1, p=1), 2)
    return build_program(plan_groups(b.build([y, z]), load_chip(chip)))


def test_stores_partition_every_group_output_and_reads_stay_inside_buffers():
    program = program_for()
    assert any(g.plan.slicing.h > 1 for g in program.npu_groups)
    for group in program.npu_groups:
        stored: dict[str, list[Rows]] = {}
        for piece in group.slices:
            for step in piece.steps:
                if isinstance(step, Dma) and step.op == "store":
                    assert step.rows_held.contains(step.rows)
                    stored.setdefault(step.tensor, []).append(step.rows)
                if isinstance(step, Compute):
                    assert all(op.rows_held.contains(op.rows) for op in step.inputs)
        for tensor, rows in stored.items():
            rows.sort()
            height = program.graph.shapes[tensor][2]
            assert rows[0].start == 0 and rows[-1].stop == height
            assert all(a.stop == b.start for a, b in zip(rows, rows[1:]))


def test_every_read_buffer_is_written_earlier_in_the_slice():
    for group in program_for().npu_groups:
        for piece in group.slices:
            written = {}
            for step in piece.steps:
                if isinstance(step, Compute):
                    for op in step.inputs:
                        assert written[op.buffer] < step.timestep, (step.layer, op.tensor)
                    written.update({op.buffer: step.timestep for op in step.outputs})
                elif step.op == "load" and step.rows is not None:
                    written[step.buffer] = step.timestep


def test_weights_load_once_when_slices_share_them():
    for group in program_for().npu_groups:
        loads = [s for p in group.slices for s in p.steps
                 if isinstance(s, Dma) and s.op == "load" and s.tensor.endswith("/weight")]
        assert len(loads) == sum(1 for l in group.plan.group.layers if l.weight_bytes)


def test_plan_json_is_strict_json_with_the_documented_structure(tmp_path):
    program = program_for()
    data = plan_dict(program, estimate(program))
    json.dumps(data, allow_nan=False)
    assert data["format"] == "npubuild.plan/1"
    assert {"chip", "layout", "gmem", "layers", "groups", "estimate"} <= set(data)
    group = next(g for g in data["groups"] if g["slicing"]["h"] > 1)
    assert {"layers", "inputs", "outputs", "slicing", "timesteps", "buffers", "lmem",
            "slices"} <= set(group)
    weights = [b for b in group["buffers"] if b["kind"] == "weight"]
    assert weights and all(b["lifetime"][1] is None for b in weights)  # resident
    step_ops = {s["op"] for s in group["slices"][0]["steps"]}
    assert step_ops == {"load", "compute", "store"}
    path = write_plan(tmp_path / "plan.json", program)
    assert json.loads(path.read_text())["groups"][0]["device"] == "npu"
