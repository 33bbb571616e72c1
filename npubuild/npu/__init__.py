"""The hardware-independent core of ``compile``: layer groups, LMEM allocation, the program.

Reads top to bottom as the compiler does:

    graph = layers_from_onnx(model)                  # or LayerSpecs from the quantized graph
    groups = plan_groups(graph, chip)                # tail→head search, N/H(/C) slicing, LMEM fit
    program = build_program(groups)                  # DMA + compute steps per group and slice
    write_plan("plan.json", program, estimate(program))
    write_timelines(program, "lmem/")                # LMEM timeline pictures

and for a quantized graph (what the ``compile`` stage does):

    layers = layers_from_qgraph(qgraph)              # views, kernels, weight records, breakers
    program = build_program(plan_qgraph(layers, chip))
    write_program("program.npz", program, layers)    # what npubuild.runtime.simulator executes
    dump_ir(qgraph, "graph_ir_0/", values, "sample") # seed 004's per-layer JSON + .npy
"""

from __future__ import annotations

from npubuild.npu.backward_h import Needed, Rows, input_rows, overlap, overlap_ok, split_rows
from npubuild.npu.buffers import Buffer, group_buffers, schedule
from npubuild.npu.estimate import Estimate, compare, estimate, gmem_lower_bound, report_fields
from npubuild.npu.from_onnx import layers_from_onnx
from npubuild.npu.from_qgraph import QLayers, layers_from_qgraph, plan_qgraph
from npubuild.npu.ir_dump import dump_ir
from npubuild.npu.layer_group import CpuLayer, GroupPlan, LayerGroups, fit_group, plan_groups
from npubuild.npu.layers import Group, LayerGraph, LayerSpec
from npubuild.npu.lmem import LmemOverflow, Placement, allocate, conflicts
from npubuild.npu.plan_json import plan_dict, write_plan
from npubuild.npu.program import Program, build_program
from npubuild.npu.program_file import ProgramFile, load_program, write_program
from npubuild.npu.tiling import Slicing, TilingRejected, tile_group
from npubuild.npu.timeline import timeline_svg, write_timelines

__all__ = [
    "Buffer", "CpuLayer", "Estimate", "Group", "GroupPlan", "LayerGraph", "LayerGroups",
    "LayerSpec", "LmemOverflow", "Needed", "Placement", "Program", "ProgramFile", "QLayers",
    "Rows", "Slicing", "TilingRejected", "allocate", "build_program", "compare", "conflicts",
    "dump_ir", "estimate", "fit_group", "gmem_lower_bound", "group_buffers", "input_rows",
    "layers_from_onnx", "layers_from_qgraph", "load_program", "overlap", "overlap_ok",
    "plan_dict", "plan_groups", "plan_qgraph", "report_fields", "schedule", "split_rows",
    "tile_group", "timeline_svg", "write_plan", "write_program", "write_timelines",
]
