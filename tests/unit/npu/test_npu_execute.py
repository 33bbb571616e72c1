"""Programs run on a real LMEM array (toy integer ops) equal the untiled computation."""

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from npubuild.npu import build_program, plan_groups
from npubuild.npu.builder import GraphBuilder
from npubuild.targets import load_chip
from npubuild.targets.model import Chip
from tests.unit.npu.npu_executor import check_program


def small_chip(lmem: int) -> Chip:
    return Chip.model_validate({**load_chip("npu-tiny").model_dump(exclude_unset=True),
                                "lmem_bytes_per_lane": lmem})


def yolo_like(shape):
    b = GraphBuilder({"x": shape})
    y = b.conv("x", 16, k=3, s=2)
    y = b.mul(y, b.lut(y))
    a, c = b.split(y, [8, 8])
    c2 = b.conv(b.conv(c, 8, k=3), 8, k=3)
    y = b.concat([a, c, b.add(c, c2)])
    p = b.pool(y, k=5, s=1, p=2)
    up = b.resize(b.conv(p, 12, k=1), 2)
    return b.build([b.concat([up, b.conv("x", 4, k=1)]), p])


def test_h_sliced_groups_compute_exactly_the_untiled_result():
    program = build_program(plan_groups(yolo_like((1, 3, 64, 64)), small_chip(4096)))
    assert any(g.plan.slicing.h > 1 for g in program.npu_groups)
    check_program(program)


def test_n_and_c_sliced_groups_and_cpu_fallback_compute_exactly():
    b = GraphBuilder({"x": (3, 64, 12, 12)})
    y = b.conv(b.lut("x"), 96, k=3)  # 96×64×9 bytes of weights: C slicing on 8 × 4 KiB
    program = build_program(plan_groups(b.build([b.pool(y, 2)]), small_chip(4096),
                                        on_no_fit="cpu"))
    slicings = [g.plan.slicing for g in program.npu_groups]
    assert any(s.c > 1 for s in slicings) and any(s.n > 1 for s in slicings)
    check_program(program)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 2), st.integers(6, 20).map(lambda h: 2 * h),
       st.sampled_from([2048, 4096, 8192]), st.booleans())
def test_random_shapes_and_lmem_sizes(batch, height, lmem, grouping):
    graph = yolo_like((batch, 3, height, 2 * height))
    check_program(build_program(plan_groups(graph, small_chip(lmem), grouping=grouping,
                                            on_no_fit="cpu")))


def test_the_executor_catches_a_broken_allocation():
    import dataclasses

    from npubuild.npu.layer_group import LayerGroups

    groups = plan_groups(yolo_like((1, 3, 32, 32)), small_chip(8192))
    plan = groups.npu_groups[0]
    a, b = next((a, b) for a in plan.buffers for b in plan.buffers
                if a.id < b.id and a.kind == b.kind == "activation" and a.live_with(b))
    addresses = {**plan.placement.addresses, b.id: plan.placement.addresses[a.id]}
    broken = dataclasses.replace(plan, placement=dataclasses.replace(plan.placement,
                                                                    addresses=addresses))
    items = tuple(broken if item is plan else item for item in groups.items)
    program = build_program(LayerGroups(groups.graph, groups.chip, True, items))
    try:
        check_program(program)
    except AssertionError:
        return
    raise AssertionError("two live buffers at one address went unnoticed")
