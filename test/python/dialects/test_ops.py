"""The op is the unit of change: every lg op carries its rules and
properties, and every backend implements every op (or says, in its one
registry, that the op runs elsewhere). A new op that misses a backend, or
a property set that disagrees with the ops' traits, fails here."""

from __future__ import annotations

import numpy as np
import pytest
from support.every_op import every_op_graph
from xdsl.dialects.builtin import TensorType, f32, i64
from xdsl.ir import Block

from sbpc.codegen import generators as codegen
from sbpc.dialects import lg, plan
from sbpc.dialects.backends import Backend
from sbpc.dialects.sbp import global_shape
from sbpc.runtime import numpy_kernels
from sbpc.semantics.local_eval import LOCAL
from sbpc.semantics.reference import REFERENCE, evaluate

STRUCTURE = {lg.GraphOp, lg.OutputOp, lg.InputOp, lg.ParamOp, lg.ConstantOp}
"""lg ops that are not kernels: the graph's frame and its sources."""

BACKENDS: list[Backend] = [REFERENCE, numpy_kernels.NUMPY, codegen.CUDA]

NOT_DIFFERENTIABLE = {lg.ArgmaxOp, lg.TopkOp, lg.OneHotOp, lg.TokenCrossEntropyGradOp,
                      lg.GroupedMatmulGradWeightOp, lg.UniformOp}
"""Ops lg-autodiff refuses to differentiate through (by design: they only
appear in backward graphs, or have no useful gradient here; a random draw
reads no float to pass a gradient to)."""


def test_every_lg_op_is_structure_or_a_kernel():
    ops = list(lg.LG.operations)
    assert set(ops) == STRUCTURE | set(lg.COMPUTE_OPS)
    assert len(lg.COMPUTE_OPS) == len(ops) - len(STRUCTURE)


@pytest.mark.parametrize("backend", BACKENDS, ids=lambda b: b.name)
def test_every_backend_implements_every_op(backend: Backend):
    missing = backend.missing(lg.COMPUTE_OPS)
    assert not missing, f"{backend.name} lacks {[op.name for op in missing]}"


def test_backends_hold_only_known_ops():
    known = {*lg.COMPUTE_OPS}
    assert set(numpy_kernels.NUMPY.ops()) - known == {numpy_kernels.Fused}
    assert set(codegen.CUDA.ops()) <= known
    assert set(LOCAL.ops()) - known == {numpy_kernels.Fused}


def test_a_missing_implementation_is_reported():
    class Unregistered(lg.NegOp):
        name = "lg.unregistered"

    for backend in BACKENDS:
        assert backend.missing([*lg.COMPUTE_OPS, Unregistered]) == [Unregistered]
    with pytest.raises(KeyError, match="lg.unregistered"):
        REFERENCE[Unregistered]
    twice = Backend("test")
    twice.register(lg.NegOp, 1)
    with pytest.raises(ValueError, match="registered twice"):
        twice.register(lg.NegOp, 2)


def test_property_sets_follow_the_traits():
    elementwise = {op for op in lg.COMPUTE_OPS if lg.is_elementwise(op)}
    assert {op.name for op in elementwise} == plan.FUSABLE_KERNELS
    assert plan.FUSABLE_KERNELS | {plan.FUSED} == plan.IN_PLACE_KERNELS
    assert {lg.ReshapeOp.name} == plan.REINTERPRETING_KERNELS
    for op in lg.COMPUTE_OPS:
        # CUDA fuses exactly the elementwise ops; the runtime lets exactly the
        # in-place ones write over an input.
        cuda = codegen.CUDA[op]
        assert isinstance(cuda, codegen.ElementwiseExpr) == (op in elementwise), op.name
        aliased = op.name in plan.IN_PLACE_KERNELS | plan.REINTERPRETING_KERNELS
        assert numpy_kernels._alias_safe(op) == aliased, op.name


def test_elementwise_ops_are_elementwise():
    # The trait's claim, checked against the reference kernels: a kernel of
    # pieces is the piece of the kernel, with broadcasting.
    rng = np.random.default_rng(0)
    x = np.abs(rng.normal(size=(6, 4))).astype(np.float32) + 0.5
    y = np.abs(rng.normal(size=(4,))).astype(np.float32) + 0.5
    block = Block(arg_types=[TensorType(f32, [6, 4]), TensorType(f32, [4]), TensorType(i64, [6, 4]),
                             TensorType(i64, [4])])
    whole_numbers = (rng.integers(-9, 9, (6, 4)), rng.integers(-3, 3, (4,)))  # for integer division (and by 0)
    for op_cls in (op for op in lg.COMPUTE_OPS if lg.is_elementwise(op)):
        integers = op_cls is lg.FloorDivOp
        a, b = block.args[2:] if integers else block.args[:2]
        op = op_cls(a) if issubclass(op_cls, lg.UnaryOp) else op_cls(a, b)
        args = (x,) if issubclass(op_cls, lg.UnaryOp) else whole_numbers if integers else (x, y)
        whole = REFERENCE[op_cls](op, *args)
        rows = REFERENCE[op_cls](op, *(v[2:5] if v.ndim == 2 else v for v in args))
        np.testing.assert_allclose(rows, whole[2:5], rtol=1e-6, err_msg=op_cls.name)


def test_gradient_rules_live_with_the_ops():
    assert {op for op in lg.COMPUTE_OPS if not op.differentiable()} == NOT_DIFFERENTIABLE
    for op in lg.COMPUTE_OPS:
        assert op.sbp_rule is not lg.SbpRules.sbp_rule, f"{op.name} has no SBP rule"
        assert op.rule is not lg.LgOp.rule, f"{op.name} has no shape rule"


def test_op_class_by_name():
    assert lg.op_class("lg.matmul") is lg.MatmulOp
    with pytest.raises(KeyError, match="lg.nothing"):
        lg.op_class("lg.nothing")


def test_sbp_values_are_one_type_read_through_properties():
    from sbpc.dialects.plain_sbp import plain_nd
    from sbpc.dialects.sbp import Sbp, format_nd, nd_from_plain, nd_to_plain

    assert Sbp.of("S01") is Sbp.S(1) and Sbp.of("B") is Sbp.B
    assert (Sbp.S(2).kind, Sbp.S(2).axis, Sbp.S(2).is_split) == ("S", 2, True)
    assert (Sbp.PMAX.kind, Sbp.PMAX.axis, Sbp.PMAX.is_partial) == ("P", None, True)
    with pytest.raises(ValueError, match="'Q' is not an SBP"):
        Sbp.of("Q")
    nd = plain_nd(["S0", "B", "Pmax"])
    assert all(type(s) is Sbp for s in nd)
    assert nd_to_plain(nd_from_plain(nd)) == nd
    assert format_nd(nd) == format_nd(nd_from_plain(nd)) == "[S<0>, B, P<max>]"
    # every pass gets Sbp values from the op rules, not text
    sigs = lg.MatmulOp.signatures(((8, 4), (4, 2)), (8, 2), 2, (("transpose_lhs", False), ("transpose_rhs", False)))
    assert all(type(s) is Sbp for ins, outs in sigs for nd in (ins, outs) for s in nd)


def test_every_shape_rule_gives_the_shape_the_reference_computes():
    """Each op of the every-op graph (test/filecheck/lg/ops.mlir) is parsed
    against its rule (the verifier compares the written type with the
    rule's), and the reference interpreter's numpy result has that shape:
    a wrong shape rule fails one or the other."""
    module, feeds = every_op_graph()
    trace = {}
    evaluate(module, feeds, trace=trace)
    graph = next(op for op in module.ops if isinstance(op, lg.GraphOp))
    seen = set()
    for op in graph.body.ops:
        if isinstance(op, lg.OutputOp):
            continue
        for result in op.results:
            assert trace[result].shape == global_shape(result.type), f"{op.name}: {trace[result].shape}"
        seen.add(type(op))
    assert set(lg.LG.operations) - seen == {lg.GraphOp, lg.OutputOp}
