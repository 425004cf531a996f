"""`sbp-fuse-norms`: fuses layernorm's gradient back into row kernels where
the layout sbp-infer chose keeps each row on one device.

lg-autodiff emits layernorm's gradient as single ops (LayerNormOp.gradient):
the statistics recomputed (mean, centring, variance, rsqrt, the normalized
input: 7 ops) and the input's gradient from them (7 more). Laid out one op
at a time, sbp-infer may split the normalized axis (a tensor-parallel
activation: each row's sums become partial sums of a few bytes) or take the
gradient partial (linear in it: no all_reduce before the backward). A fused
op chosen before inference could do neither: in lg-autodiff,
lg.layernorm_grad took the 2-D GPT on 4 ranks from 5.2 to 6.6 ms a step
(simulated) and cost `test_bucketing`'s GPT its gradient buckets. So the
decision is made after inference, as XLA fuses after SPMD partitioning.

This pass rewrites, in each graph:

- the input's gradient (`lg.input_gradient_of`) into one
  lg.layernorm_grad(x, dxhat): every row's statistics recomputed in cache,
  where its 14 ops made a pass over the tensor each;
- then the statistics (`lg.normalization_of`) that still have a reader
  (the weight's gradient: dy * x̂) into one lg.layernorm of x, without its
  affine part.

A part fuses where its values are 32- or 64-bit floats (in 16 bits each op
rounds its result, which a fused kernel would not: plan-fuse-elementwise
keeps them apart too), its ops read one another directly (sbp-insert-boxing
put no collective between them: their layouts agree), the fused op's
signature is one its rule allows (`nd_signatures`: no split of a normalized
axis, a partial gradient only under a whole or row-split input), and
nothing outside the part reads the ops it replaces. The fused op keeps
the replaced value's type, so nothing downstream changes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import (
    BFloat16Type,
    DenseArrayBase,
    Float16Type,
    FloatAttr,
    IntegerAttr,
    ModuleOp,
    TensorType,
    f64,
    i32,
    i64,
)
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import InsertPoint, Rewriter
from xdsl.transforms.dead_code_elimination import is_trivially_dead

from sbpc.dialects import lg
from sbpc.dialects.sbp import (
    PLACEMENT_ATTR,
    SIGNATURE_ATTR,
    DTensorType,
    element_type,
    global_shape,
    lookup_placement,
    nd_to_plain,
    signature_of,
)
from sbpc.planning.sbp_problem import nd_signatures


def _fused(cls: type[lg.LgOp], found: lg.Recognized, params: dict) -> Operation | None:
    """The op of class `cls` that computes `found`'s value from its
    operands, typed and signed as that value; None where the layout or
    other readers forbid it."""
    root = found.ops[-1]
    replaced = set(found.ops)
    for op in found.ops[:-1]:
        if any(use.operation not in replaced for result in op.results for use in result.uses):
            return None
    value = root.results[0]
    types = [v.type for v in (*found.operands, value)]
    if any(isinstance(element_type(t), Float16Type | BFloat16Type) for t in types):
        return None  # each op rounds to 16 bits: a fused kernel, keeping its rows in float32, computes otherwise
    attributes: dict[str, Attribute] = {}
    if all(isinstance(t, DTensorType) for t in types):
        placements = {t.placement_name for t in types if isinstance(t, DTensorType)}
        if len(placements) != 1:
            return None
        mesh = lookup_placement(root, placements.pop()).mesh()
        ins = tuple(nd_to_plain(v.type.nd_sbp) for v in found.operands if isinstance(v.type, DTensorType))
        out = nd_to_plain(value.type.nd_sbp) if isinstance(value.type, DTensorType) else ()
        allowed = nd_signatures(cls, [global_shape(v.type) for v in found.operands], global_shape(value.type),
                                mesh.shape, params)
        if (ins, out) not in allowed:
            return None
        attributes[SIGNATURE_ATTR] = signature_of(ins, [out])
    elif not all(isinstance(t, TensorType) for t in types):
        return None
    if PLACEMENT_ATTR in root.attributes:
        attributes[PLACEMENT_ATTR] = root.attributes[PLACEMENT_ATTR]
    properties: dict[str, Attribute] = {"axis": IntegerAttr(found.axis, i64),
                                        "epsilon": FloatAttr(found.epsilon, f64)}
    if cls is lg.LayerNormOp:  # (its weight and bias are optional operands: none here)
        properties["operandSegmentSizes"] = DenseArrayBase.from_list(i32, [1, 0, 0])
    return cls.create(operands=list(found.operands), properties=properties, attributes=attributes,
                      result_types=[value.type])


def _replace(found: lg.Recognized, fused: Operation) -> None:
    """`fused` in place of `found`'s value; its ops erased, and what they
    alone read (the normalization an input gradient read, unless the
    weight's gradient reads it too; epsilon's constant)."""
    root = found.ops[-1]
    Rewriter.insert_op(fused, InsertPoint.before(root))
    root.results[0].replace_all_uses_with(fused.results[0])
    dead = list(found.ops)
    while dead:
        op = dead.pop()
        if op.parent is None or not is_trivially_dead(op):
            continue
        producers = [v.owner for v in op.operands if isinstance(v.owner, Operation)]
        Rewriter.erase_op(op)
        dead.extend(producers)


FUSIONS: tuple[tuple[Callable[[SSAValue], lg.Recognized | None], type[lg.LgOp], dict], ...] = (
    (lg.input_gradient_of, lg.LayerNormGradOp, {}),
    (lg.normalization_of, lg.LayerNormOp, {"affine": False, "has_bias": False}),
)
"""What is fused, in order: each input gradient first, since its ops read
the normalization, which fuses only where nothing else does."""


@dataclass(frozen=True)
class SbpFuseNormsPass(ModulePass):
    name = "sbp-fuse-norms"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for recognize, cls, params in FUSIONS:
            for mul in [o for o in op.walk() if isinstance(o, lg.MulOp)]:
                if mul.parent is None:  # erased by an earlier fusion
                    continue
                found = recognize(mul.result)
                if found is None:
                    continue
                fused = _fused(cls, found, {"axis": found.axis, **params})
                if fused is not None:
                    _replace(found, fused)
