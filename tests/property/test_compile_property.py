"""Hypothesis: random quantized conv/pool/add/concat/resize stacks compiled for npu-tiny (so H is
sliced, with halos) run in the simulator bit-identically to the untiled integer reference."""

from collections import Counter

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from npubuild.npu import conflicts
from npubuild.targets import Chip, load_chip
from tests.unit.npu.qstacks import compile_qgraph, quantize, simulate_and_compare, stacks

TINY = load_chip("npu-tiny")
SETTINGS = settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(stacks(), st.sampled_from(["pow2_symmetric", "symmetric", "asymmetric"]),
       st.sampled_from(["per_tensor", "per_channel"]))
def test_tiled_stacks_on_npu_tiny_equal_the_untiled_reference(stack_outputs, scheme, granularity):
    stack, outputs = stack_outputs
    qgraph = quantize(stack.model(outputs), scheme, granularity=granularity)
    # a layer too big for npu-tiny even alone (a wide, tall depthwise conv) runs on the CPU:
    # the rest must still be tiled exactly
    _, program, program_file = compile_qgraph(qgraph, TINY, on_no_fit="cpu")
    sliced = [g for g in program.npu_groups if g.plan.slicing.h > 1]
    event(f"H-sliced groups: {'some' if sliced else 'none'}")
    for group in program.npu_groups:
        plan = group.plan
        assert conflicts(plan.buffers, plan.placement, TINY.lmem_bytes_per_lane) == []
        _stores_cover_each_output_once(group)
    simulate_and_compare(qgraph, program_file)


def _stores_cover_each_output_once(group) -> None:
    rows: dict[tuple, Counter] = {}
    for piece in group.slices:
        for step in piece.steps:
            if getattr(step, "op", "") == "store":
                key = (step.tensor, step.batch, step.channels)
                rows.setdefault(key, Counter()).update(range(step.rows.start, step.rows.stop))
    for (tensor, _, _), counts in rows.items():
        height = group.plan.group.shapes[tensor][2]
        assert sorted(counts) == list(range(height)) and set(counts.values()) == {1}, tensor


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(stacks(), st.sampled_from([4, 8, 16]), st.sampled_from([8192, 16384, 32768, 65536]),
       st.sampled_from([1, 2, 4]))
def test_any_lmem_geometry_compiles_bit_exact(stack_outputs, lanes, lmem, banks):
    """The same stacks on chips with other lane counts, LMEM sizes and banks: the slicing, the
    cuts between groups and the allocation change, the simulator's results do not."""
    stack, outputs = stack_outputs
    qgraph = quantize(stack.model(outputs), "asymmetric", granularity="per_channel")
    chip = Chip(**{**TINY.model_dump(exclude_unset=True), "lanes": lanes,
                   "lmem_bytes_per_lane": lmem, "lmem_banks": banks})
    _, program, program_file = compile_qgraph(qgraph, chip, on_no_fit="cpu")
    event(f"slicings: {sorted({str(g.plan.slicing) for g in program.npu_groups})[:2]}")
    for group in program.npu_groups:
        plan = group.plan
        assert conflicts(plan.buffers, plan.placement, lmem) == []
        _stores_cover_each_output_once(group)
    simulate_and_compare(qgraph, program_file)
