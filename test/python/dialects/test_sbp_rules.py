"""Every SBP signature an op's rule offers is valid: distributing the global
operands by it, running each device's local kernel and combining by the
result's SBP reproduces the reference interpreter, on random graphs."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.every_op import every_op_graph
from support.random_graphs import random_graphs

from sbpc.dialects import lg
from sbpc.dialects.dtypes import numpy_dtype
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


def check_every_signature(graph: lg.GraphOp, feeds, p: int, rng) -> dict[type, int]:
    """Every 1-D signature each op of `graph` offers on a mesh of `p`, checked
    against the reference's values; how many each op class offered."""
    trace: dict = {}
    evaluate(graph.parent_op(), feeds, trace=trace)
    checked: dict[type, int] = {}
    for op in graph.body.ops:
        if isinstance(op, (lg.OutputOp, *SOURCES)):
            continue
        shapes = [global_shape(o.type) for o in op.operands]
        out_shape = global_shape(op.results[0].type)
        # every signature, those on rows grouped by expert included
        for ins, outs in type(op).grouped_signatures(tuple(shapes), out_shape, p, tuple(sorted(op.params().items()))):
            check_op(op, [(s,) for s in ins], (outs[0],), (p,), trace, rng)
            checked[type(op)] = checked.get(type(op), 0) + 1
    return checked


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(random_graphs(), st.sampled_from([2, 3]), st.integers(0, 2**16))
def test_every_1d_signature_reproduces_the_reference(case, p, seed):
    check_every_signature(case.module.ops.last, case.feeds, p, np.random.default_rng(seed))


@pytest.mark.parametrize("p", [2, 3])
def test_every_op_class_and_every_signature_its_rule_offers_reproduce_the_reference(p):
    """Every op class in one graph (test/filecheck/lg/ops.mlir), every
    signature its rule offers on a mesh of 2 (even pieces) and 3 (uneven and
    empty ones), against the reference: a rule that offers a wrong signature
    fails here, whichever graphs the random test happens to draw."""
    module, feeds = every_op_graph()
    graph = next(op for op in module.ops if isinstance(op, lg.GraphOp))
    checked = check_every_signature(graph, feeds, p, np.random.default_rng(p))
    every = {c for c in lg.LG.operations if c not in (lg.GraphOp, lg.OutputOp, *SOURCES)}
    assert every <= set(checked), f"op classes the graph lacks: {sorted(c.name for c in every - set(checked))}"
    splits = {c.name for c, n in checked.items() if n > 1}
    assert len(splits) >= len(every) - 3, f"op classes offering only one signature: {sorted(every - splits)}"
