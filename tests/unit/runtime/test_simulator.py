"""The bit-exact simulator: a real LMEM array, the program file only, and loud faults when an
allocation or a halo is wrong."""

import copy
import dataclasses

import numpy as np
import pytest

from npubuild.npu import build_program, estimate
from npubuild.npu.from_qgraph import layers_from_qgraph, plan_qgraph
from npubuild.npu.layer_group import GroupPlan, LayerGroups
from npubuild.npu.program_file import ProgramFile, load_program, program_document, write_program
from npubuild.quant.qgraph import QGraph
from npubuild.quant.reference import run_quantized, run_reference
from npubuild.runtime.runner import GraphInfo
from npubuild.runtime.simulator import Simulator, SimulatorFault, simulator_backend
from npubuild.targets import load_chip
from tests.unit.npu.qstacks import Stack, int_inputs, quantize, simulate_and_compare

TINY = load_chip("npu-tiny")


@pytest.fixture(scope="module")
def sliced():
    """Conv 3x3 → pool → conv 3x3 stride 2 → SiLU-like table on npu-tiny: H slices, halos."""
    s = Stack((1, 16, 96, 96))
    a = s.conv("x", 16, 3)
    b = s.pool(a, "max", 3, 1, 1)
    c = s.conv(b, 16, 3, 2)
    qgraph = quantize(s.model([s.binary(s.unary(c, "Sigmoid"), c, "Mul")]))
    layers = layers_from_qgraph(qgraph)
    groups = plan_qgraph(layers, TINY)
    return qgraph, layers, groups


def _file(layers, groups) -> ProgramFile:
    program = build_program(groups)
    return ProgramFile(*program_document(program, layers, estimate(program)))


def test_h_slices_with_halos_are_bit_identical_to_the_untiled_reference(sliced):
    qgraph, layers, groups = sliced
    plan = next(g for g in groups.npu_groups if g.slicing.h > 1)
    rows = [s.window.rows[plan.group.inputs[0]] for s in plan.tiling.slices]
    assert any(a.stop > b.start for a, b in zip(rows, rows[1:]))  # neighbouring slices overlap
    pf = _file(layers, groups)
    sim = Simulator(pf)
    for seed in (1, 2):
        inputs = int_inputs(qgraph, seed)
        got = sim.run(inputs)
        simulate_and_compare(qgraph, pf, inputs)
    assert sim.lmem.dtype == np.int8 and sim.lmem.shape == (TINY.lanes, TINY.lmem_bytes_per_lane)
    assert sim.stats.computes > len(qgraph.layers) and set(got) >= set(qgraph.outputs)


def _overlapped(groups: LayerGroups, kinds: tuple[str, str]) -> LayerGroups:
    """Move one buffer onto another one live at the same time (a broken allocator)."""
    items = list(groups.items)
    for i, plan in enumerate(items):
        if not isinstance(plan, GroupPlan):
            continue
        for a in plan.buffers:
            for b in plan.buffers:
                if (a.kind, b.kind) == kinds and a.id != b.id and a.live_with(b) \
                        and b.start > a.start:
                    addresses = {**plan.placement.addresses, b.id: plan.placement.addresses[a.id]}
                    placement = dataclasses.replace(plan.placement, addresses=addresses)
                    items[i] = dataclasses.replace(plan, placement=placement)
                    return dataclasses.replace(groups, items=tuple(items))
    raise AssertionError(f"no live {kinds} pair to overlap")


@pytest.mark.parametrize("kinds", [("activation", "activation"), ("weight", "activation")])
def test_two_live_buffers_overlapped_on_purpose_are_caught(sliced, kinds):
    qgraph, layers, groups = sliced
    broken = _file(layers, _overlapped(groups, kinds))
    with pytest.raises(SimulatorFault, match="which is live at this timestep") as fault:
        Simulator(broken).run(int_inputs(qgraph))
    assert fault.value.group is not None and fault.value.slice is not None
    assert fault.value.tensor


def test_a_dropped_halo_row_is_caught_as_a_read_of_unwritten_lmem(sliced):
    qgraph, layers, groups = sliced
    pf = _file(layers, groups)
    doc = copy.deepcopy(pf.doc)
    group = next(g for g in doc["groups"] if g["device"] == "npu" and g["slicing"]["h"] > 1)
    load = next(st for st in group["slices"][1]["steps"]
                if st["op"] == "load" and st["rows"] and st["rows"][0] > 0)
    load["rows"] = [load["rows"][0] + 1, load["rows"][1]]  # the halo's first row never arrives
    with pytest.raises(SimulatorFault, match="not written during the buffer's lifetime") as fault:
        Simulator(ProgramFile(doc, pf.arrays)).run(int_inputs(qgraph))
    assert fault.value.slice == 1 and fault.value.tensor == load["tensor"]


def test_a_step_outside_its_buffers_lifetime_is_caught(sliced):
    qgraph, layers, groups = sliced
    pf = _file(layers, groups)
    doc = copy.deepcopy(pf.doc)
    group = next(g for g in doc["groups"] if g["device"] == "npu")
    store = next(st for st in group["slices"][0]["steps"] if st["op"] == "store")
    store["timestep"] += 1
    with pytest.raises(SimulatorFault, match="outside its lifetime"):
        Simulator(ProgramFile(doc, pf.arrays)).run(int_inputs(qgraph))


@pytest.mark.parametrize("op", ["load", "store"])
def test_a_dma_step_beyond_its_tensors_batch_is_a_fault_naming_it_not_a_clipped_copy(sliced, op):
    """GTCRN's group of two batches stored [0, 33) of a batch-1 tensor: numpy clipped or failed
    to broadcast (a ValueError with no group or slice) instead of the simulator saying so."""
    qgraph, layers, groups = sliced
    pf = _file(layers, groups)
    doc = copy.deepcopy(pf.doc)
    group = next(g for g in doc["groups"] if g["device"] == "npu")
    step = next(st for st in group["slices"][0]["steps"] if st["op"] == op)
    step["batch"] = [1, 2]  # one item, as the buffer holds, but the tensor has only item 0
    with pytest.raises(SimulatorFault, match=r"N \[1, 2\) of .* outside") as fault:
        Simulator(ProgramFile(doc, pf.arrays)).run(int_inputs(qgraph))
    assert fault.value.group == group["index"] and fault.value.tensor == step["tensor"]


def test_it_runs_the_program_file_alone(sliced, tmp_path, monkeypatch):
    qgraph, layers, groups = sliced
    path = write_program(tmp_path / "program.npz", build_program(groups), layers)
    inputs = int_inputs(qgraph)
    expected = run_reference(qgraph, inputs)

    def poisoned(*args, **kwargs):
        raise AssertionError("the simulator must not read the quantized graph")

    monkeypatch.setattr(QGraph, "load", poisoned)
    got = Simulator(load_program(path)).run(inputs)
    for t in qgraph.outputs:
        np.testing.assert_array_equal(got[t], expected[t])


def test_simulators_of_one_chip_share_one_lmem_and_interleaved_runs_stay_exact(sliced):
    """A split into many NPU graphs has a simulator per graph; each holding its own LMEM and
    tag plane (5 bytes per LMEM byte, all touched by every run) cost 9 GB on a 109-graph model.
    They share one per thread, which every run resets, so no run sees another's data."""
    qgraph, layers, groups = sliced
    first, second = Simulator(_file(layers, groups)), Simulator(_file(layers, groups))
    assert first.lmem is second.lmem and first.tags is second.tags
    a, b = int_inputs(qgraph, 1), int_inputs(qgraph, 2)
    alone = {t: v.copy() for t, v in first.run(a).items()}
    second.run(b)  # leaves its own data in the shared LMEM
    again = first.run(a)
    for t in qgraph.outputs:
        np.testing.assert_array_equal(again[t], alone[t])
        np.testing.assert_array_equal(again[t], run_reference(qgraph, a)[t])


def test_inputs_of_the_wrong_shape_or_type_are_refused(sliced):
    qgraph, layers, groups = sliced
    sim = Simulator(_file(layers, groups))
    with pytest.raises(SimulatorFault, match="the program takes int8"):
        sim.run({"x": np.zeros((1, 16, 96, 96), np.int16)})
    with pytest.raises(SimulatorFault, match="not given"):
        sim.run({})


def test_runner_backend_quantizes_simulates_and_dequantizes(sliced, tmp_path):
    qgraph, layers, groups = sliced
    write_program(tmp_path / "compile" / "graph_0" / "program.npz", build_program(groups), layers)
    backend = simulator_backend(tmp_path)
    info = GraphInfo(0, "npu", tuple(qgraph.inputs), tuple(qgraph.outputs), tmp_path / "m.onnx",
                     None)
    feeds = {"x": np.random.default_rng(5).uniform(-1, 1.5, (1, 16, 96, 96)).astype(np.float32)}
    got = backend(info, feeds)
    want = run_quantized(qgraph, feeds)
    for t in qgraph.outputs:
        assert got[t].dtype == np.float32
        np.testing.assert_array_equal(got[t], want[t])
