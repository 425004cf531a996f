"""Every SBP signature an op's rule offers is valid: distributing the global
operands by it, running each device's local kernel and combining by the
result's SBP reproduces the reference interpreter, on random graphs."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.random_graphs import random_graphs

from sbpc.dialects import lg
from sbpc.dialects.pieces import numpy_dtype
from sbpc.dialects.sbp import global_shape
from sbpc.semantics.local_eval import run_distributed
from sbpc.semantics.reference import evaluate

SOURCES = (lg.InputOp, lg.ParamOp, lg.ConstantOp)


def check_op(op, in_nds, out_nd, mesh, trace, rng):
    inputs = [trace[o] for o in op.operands]
    expected = trace[op.results[0]]
    got = run_distributed(
        op, in_nds, out_nd, mesh, inputs, expected.shape, numpy_dtype(op.results[0].type.element_type), rng
    )
    np.testing.assert_allclose(
        got, expected, rtol=2e-4, atol=2e-5,
        err_msg=f"{op.name} with signature {tuple(in_nds)} -> {out_nd} on mesh {mesh}",
    )


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(random_graphs(), st.sampled_from([2, 3]), st.integers(0, 2**16))
def test_every_1d_signature_reproduces_the_reference(case, p, seed):
    trace = {}
    evaluate(case.module, case.feeds, trace=trace)
    rng = np.random.default_rng(seed)
    graph = case.module.ops.last
    for op in graph.body.ops:
        if isinstance(op, (lg.OutputOp, *SOURCES)):
            continue
        shapes = [global_shape(o.type) for o in op.operands]
        out_shape = global_shape(op.results[0].type)
        for ins, outs in type(op).signatures(tuple(shapes), out_shape, p, tuple(sorted(op.params().items()))):
            check_op(op, [(s,) for s in ins], (outs[0],), (p,), trace, rng)
