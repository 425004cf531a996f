"""The physical plan: the allocator on random lifetimes, and compiled random
graphs run on real per-device arenas against the reference interpreter."""

import os
import statistics

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from random_graphs import text
from test_sbp_infer import MESHES, hinted_graphs
from xdsl.context import Context

import sbpc
from sbpc.lowering.compile import CompilePass
from sbpc.lowering.plan_allocate_memory import Buffer, live_bound, place
from sbpc.semantics.plan_simulator import run_plan
from sbpc.semantics.reference import evaluate


@st.composite
def lifetimes(draw):
    n = draw(st.integers(1, 40))
    length = draw(st.integers(1, 30))
    buffers = []
    for _ in range(n):
        start = draw(st.integers(-1, length))
        end = draw(st.integers(start, length + 1))
        size = 64 * draw(st.integers(1, 64))
        buffers.append(Buffer(size, start, end))
    return buffers


RATIOS: list[float] = []


@settings(max_examples=200, deadline=None)
@given(lifetimes())
def test_allocator_never_overlaps_live_buffers(buffers):
    arena = place(buffers)
    for i, a in enumerate(buffers):
        assert a.offset >= 0 and a.offset + a.size <= arena
        for b in buffers[i + 1 :]:
            if a.start <= b.end and b.start <= a.end:
                assert a.offset + a.size <= b.offset or b.offset + b.size <= a.offset, (a, b)
    bound = live_bound(buffers)
    assert bound <= arena
    RATIOS.append(arena / bound)


def test_allocator_is_close_to_the_lower_bound():
    # Runs after the property test above has filled RATIOS (same module).
    if len(RATIOS) < 20:
        test_allocator_never_overlaps_live_buffers()
    ratios = sorted(RATIOS)
    median = statistics.median(ratios)
    print(f"\narena / live-set bound over {len(ratios)} random cases: median {median:.3f}, "
          f"p90 {ratios[int(0.9 * len(ratios))]:.3f}, max {ratios[-1]:.3f}")
    assert median <= 1.05


# 3-D meshes too; SBPC_RANDOM_EXAMPLES raises the count (the reliability
# campaign's 2000).
@settings(max_examples=int(os.environ.get("SBPC_RANDOM_EXAMPLES", "20")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(hinted_graphs(meshes=(*MESHES, (2, 2, 2), (1, 2, 2))), st.sampled_from(["auto", "greedy"]))
def test_compiled_plans_on_real_arenas_match_the_reference(case, strategy):
    expected = evaluate(case.module, case.feeds)
    CompilePass(strategy=strategy).apply(Context(), case.module)
    # The plan file is all the runtime gets: run what reparses from its text.
    plan_text = text(case.module)
    reloaded = sbpc.parse_module(plan_text)
    assert text(reloaded) == plan_text
    got = run_plan(reloaded, case.feeds)
    for name in expected:
        np.testing.assert_allclose(got[name], expected[name], rtol=2e-4, atol=2e-5, err_msg=plan_text)


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(hinted_graphs(meshes=(*MESHES, (2, 2, 2))))
def test_devices_alike_get_the_allocation_of_their_own(case):
    """plan-allocate-memory gives a device whose body equals one allocated
    before (data-parallel ranks) that device's allocation: what allocating
    every device by itself gives."""
    from sbpc.dialects import plan
    from sbpc.lowering.plan_allocate_memory import PlanAllocateMemoryPass, allocate_device

    for p in CompilePass().passes():  # compile up to the allocation
        if isinstance(p, PlanAllocateMemoryPass):
            break
        p.apply(Context(), case.module)
    by_itself = case.module.clone()
    PlanAllocateMemoryPass().apply(Context(), case.module)
    for program in plan.programs(by_itself):
        for device in program.devices():
            allocate_device(device)
    assert text(case.module) == text(by_itself)


def test_plan_verify_checks_a_device_that_differs_from_its_alikes():
    """plan-verify checks the memory of one of the devices alike; a device
    changed since (its body no longer equal) is checked on its own."""
    from pathlib import Path

    import pytest
    from xdsl.utils.exceptions import PassFailedException

    from sbpc.dialects import plan
    from sbpc.dialects.plan_analysis import lifetimes
    from sbpc.lowering.plan_verify import PlanVerifyPass

    module = sbpc.parse_module((Path(__file__).resolve().parents[2] / "examples" / "mlp_train.mlir").read_text())
    CompilePass().apply(Context(), module)
    PlanVerifyPass().apply(Context(), module)  # four ranks alike pass
    last = plan.programs(module)[0].devices()[-1]
    life = lifetimes(last)
    temporaries = [r for r in last.registers() if r.is_persistent is None]
    a, b = next((a, b) for a in temporaries for b in temporaries
                if a is not b and a.offset != b.offset
                and life[a.sym_name.data][0] <= life[b.sym_name.data][1]
                and life[b.sym_name.data][0] <= life[a.sym_name.data][1])
    b.offset = a.offset  # two registers live together now share bytes, on the last rank alone
    with pytest.raises(PassFailedException, match=f"@{last.sym_name.data}: registers @.* overlap in the arena"):
        PlanVerifyPass().apply(Context(), module)
