"""The physical plan (sbp-to-plan and the passes after it): compiled random
graphs run on real per-device arenas against the reference interpreter,
and a device that shares another's body is what its rank gets by itself."""

import os

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.random_graphs import MESHES, hinted_graphs, text
from xdsl.context import Context

import sbpc
from sbpc.lowering.compile import CompilePass
from sbpc.semantics.plan_interpreter import run_plan
from sbpc.semantics.reference import evaluate


# 3-D meshes too; SBPC_RANDOM_EXAMPLES raises the count (the reliability
# campaign's 2000).
@settings(max_examples=int(os.environ.get("SBPC_RANDOM_EXAMPLES", "10")), deadline=None,
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
def test_shared_bodies_are_what_each_rank_gets_by_itself(case):
    """A device `like` another, once expanded, is what sbp-to-plan gives
    that rank with share_bodies=false, through fusion and allocation: only
    ranks lowered to equal bodies share one."""
    from sbpc.dialects import plan
    from sbpc.lowering.sbp_to_plan import SbpToPlanPass

    each = case.module.clone()
    for module, share in ((case.module, True), (each, False)):
        for p in CompilePass().passes():
            (SbpToPlanPass(share_bodies=share) if isinstance(p, SbpToPlanPass) else p).apply(Context(), module)
    assert not any(d.like for p in plan.programs(each) for d in p.devices())
    for program in plan.programs(case.module):
        for device in program.devices():
            device.expand()
    assert text(case.module) == text(each)


def test_a_device_like_another_runs_its_own_pieces_and_kernels():
    """A data-parallel plan on 2 ranks gives rank 1 rank 0's body; rank 1's
    load takes both devices (program.rank_plans), and the kernels generated
    for it start where rank 1's pieces do (dropout's counters: the same
    values as the copy share_bodies=false gives rank 1)."""
    from sbpc.codegen.generators import describe
    from sbpc.dialects import plan
    from sbpc.lowering.sbp_to_plan import SbpToPlanPass
    from sbpc.runtime.program import rank_plans

    source = """
sbp.placement @dp cpu ranks [0, 1] mesh [2]
lg.graph @g on @dp {
  %x = lg.input "x" : tensor<8x4xf32>
  %seed = lg.param "rng.seed" init #lg.zeros state : tensor<i64>
  %step = lg.param "rng.step" init #lg.zeros state : tensor<i64>
  %xs = sbp.annotate %x : tensor<8x4xf32> -> !sbp.dtensor<8x4xf32, @dp, S<0>>
  %d = lg.dropout %xs, %seed, %step rate 5.000000e-01 stream 7
     : (!sbp.dtensor<8x4xf32, @dp, S<0>>, tensor<i64>, tensor<i64>) -> tensor<8x4xf32>
  lg.output ["d"] %d : tensor<8x4xf32>
}
"""
    shared, each = sbpc.parse_module(source), sbpc.parse_module(source)
    CompilePass().apply(Context(), shared)
    CompilePass(to_plan=False).apply(Context(), each)
    SbpToPlanPass(share_bodies=False).apply(Context(), each)
    rank0, rank1 = plan.programs(shared)[0].devices()
    assert rank1.like is not None and rank1.source() is rank0 and rank1.body.block.first_op is None
    assert rank1.registers() == rank0.registers() and rank1.actors() == rank0.actors()
    assert rank1.arena == rank0.arena and rank1.persistent == rank0.persistent
    own = plan.programs(each)[0].devices()[1]

    def dropout(device):
        registers = {r.sym_name.data: r for r in device.registers()}
        actor = next(a for a in device.actors() if isinstance(a, plan.ComputeOp) and a.kernel.data == "lg.dropout")
        return actor, registers

    actor, registers = dropout(rank1)
    assert describe(actor, registers, rank=1) == describe(*dropout(own))
    assert describe(actor, registers, rank=1) != describe(actor, registers)  # rank 0's rows start elsewhere
    text1 = rank_plans(shared, 2)[1]
    loaded = plan.programs(sbpc.parse_module(text1))[0].devices()
    assert [d.sym_name.data for d in loaded] == ["rank0", "rank1"] and loaded[1].like is not None
