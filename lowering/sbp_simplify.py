"""`sbp-simplify`: folds collective patterns.

- A chain of collectives that ends where it started (slice then all_gather
  back, all_to_all there and back, make_partial then all_reduce, ...) is the
  identity on a distributed value: uses of its end read its start.
- all_reduce then slice over the same mesh axes is one reduce_scatter.
- The same collective applied twice to one value (boxing for several
  consumers) keeps one result, except on a parameter: sbp-infer
  redistributes a parameter at each use on purpose, so a gathered copy
  lives only until its use (FSDP).
- Collectives nobody reads disappear.

Collectives never change the global value, so two values in one chain with
equal types (placement and nd-SBP) are interchangeable.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.pattern_rewriter import (
    GreedyRewritePatternApplier,
    PatternRewriter,
    PatternRewriteWalker,
    RewritePattern,
)
from xdsl.transforms.dead_code_elimination import is_trivially_dead

from sbpc.dialects import lg, sbp
from sbpc.dialects.sbp import DTensorType, lookup_placement, nd_to_plain
from sbpc.planning.boxing_planner import Step

from .sbp_insert_boxing import itemsize, step_bytes

BOXING_OPS = sbp.COLLECTIVE_OPS


class FoldRoundTrip(RewritePattern):
    """Walks up the chain of collectives feeding `op`; if some value on it
    has `op`'s result type, `op`'s result is that value."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if not isinstance(op, BOXING_OPS):
            return
        want = op.results[0].type
        value: SSAValue = op.operands[0]
        while True:
            if value.type == want:
                rewriter.replace(op, [], [value])
                return
            owner = value.owner
            if not isinstance(owner, BOXING_OPS):
                return
            value = owner.operands[0]


class AllReduceThenSlice(RewritePattern):
    """all_reduce (P -> B) then slice (B -> S) on the same axes: reduce_scatter."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if not isinstance(op, sbp.SliceOp):
            return
        reduce = op.input.owner
        if not isinstance(reduce, sbp.AllReduceOp) or not reduce.result.has_one_use():
            return
        axes = list(op.mesh_axes.get_values())
        if axes != list(reduce.mesh_axes.get_values()):
            return
        src, dst = reduce.input.type, op.result.type
        assert isinstance(src, DTensorType) and isinstance(dst, DTensorType)
        if not all(nd_to_plain(dst.nd_sbp)[a].is_split for a in axes):
            return  # a slice into rows owned at run time (G, I) keeps the whole: nothing to scatter
        moved = None
        if len(axes) == 1:
            mesh = lookup_placement(op, src.placement).mesh()
            step = Step("reduce_scatter", axes[0], nd_to_plain(src.nd_sbp), nd_to_plain(dst.nd_sbp))
            moved = step_bytes(step, src.get_shape(), itemsize(src), mesh.shape)
        rewriter.replace(op, sbp.ReduceScatterOp(reduce.input, axes, dst, bytes=moved))
        rewriter.erase(reduce)


def _key(op: Operation):
    return (type(op), op.results[0].type, tuple(sorted((k, str(v)) for k, v in op.properties.items())),
            tuple(id(o) for o in op.operands[1:]))


class ShareRepeatedBoxing(RewritePattern):
    """The same collective on the same value twice: keep the first."""

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if not isinstance(op, BOXING_OPS) or isinstance(op.operands[0].owner, lg.ParamOp):
            return
        block = op.parent_block()
        for use in op.operands[0].uses:
            other = use.operation
            if other is op or other.parent_block() is not block or not isinstance(other, BOXING_OPS):
                continue
            if _key(other) == _key(op) and block.get_operation_index(other) < block.get_operation_index(op):
                rewriter.replace(op, [], [other.results[0]])
                return


class EraseDeadBoxing(RewritePattern):
    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if isinstance(op, BOXING_OPS) and not op.results[0].uses:
            rewriter.erase(op)


class OnBoxingOps(RewritePattern):
    """`applier` on boxing ops; on any other op only the dead-code check
    the applier makes first (every pattern above matches boxing ops alone,
    so that is all the applier would do there). Trying the four patterns on
    every op of a large graph, twice, was most of the pass."""

    def __init__(self, applier: GreedyRewritePatternApplier):
        assert not applier.folding_enabled  # what the applier does on other ops, besides dead code
        self.applier = applier

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> None:
        if sbp.is_collective(type(op)):  # (BOXING_OPS, decided once per class)
            self.applier.match_and_rewrite(op, rewriter)
        elif self.applier.dce_enabled and is_trivially_dead(op):
            rewriter.erase(op)


@dataclass(frozen=True)
class SbpSimplifyPass(ModulePass):
    name = "sbp-simplify"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        PatternRewriteWalker(
            OnBoxingOps(GreedyRewritePatternApplier(
                [FoldRoundTrip(), AllReduceThenSlice(), ShareRepeatedBoxing(), EraseDeadBoxing()]
            )),
        ).rewrite_module(op)
