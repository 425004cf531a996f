"""`compile`: the named pipeline, verifying between passes: sbp-infer,
sbp-insert-boxing, sbp-simplify, and with `to_plan` (the default)
sbp-to-plan, plan-fuse-elementwise (with `fuse`, the default),
plan-allocate-memory and plan-verify. The module is verified after every
pass except next to plan-verify, which verifies it first itself and then
only reads it."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from .plan_allocate_memory import PlanAllocateMemoryPass
from .plan_fuse_elementwise import PlanFuseElementwisePass
from .plan_verify import PlanVerifyPass
from .sbp_infer import SbpInferPass
from .sbp_insert_boxing import SbpInsertBoxingPass
from .sbp_simplify import SbpSimplifyPass
from .sbp_to_plan import SbpToPlanPass


@dataclass(frozen=True)
class CompilePass(ModulePass):
    name = "compile"

    strategy: str = "auto"
    device: str = "cpu"
    to_plan: bool = True
    """Lower to the physical plan; false stops at boxed sbp-level IR."""
    fuse: bool = True
    """Fuse elementwise chains in the plan (plan-fuse-elementwise)."""

    def passes(self) -> list[ModulePass]:
        passes: list[ModulePass] = [
            SbpInferPass(strategy=self.strategy, device=self.device),
            SbpInsertBoxingPass(),
            SbpSimplifyPass(),
        ]
        if self.to_plan:
            passes += [SbpToPlanPass(), *([PlanFuseElementwisePass()] if self.fuse else []), PlanAllocateMemoryPass(),
                       PlanVerifyPass()]
        return passes

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        passes = self.passes()
        for i, p in enumerate(passes):
            p.apply(ctx, op)
            if not skips_verify(p, passes[i + 1] if i + 1 < len(passes) else None):
                op.verify()


def skips_verify(done: ModulePass, following: ModulePass | None) -> bool:
    """Whether verifying the module after `done` is redundant: plan-verify
    starts by verifying the module itself and then only reads it. (Verifying
    a plan walks every register and actor of every device; twice more per
    compile was a fifth of the time on large graphs.)"""
    return isinstance(done, PlanVerifyPass) or isinstance(following, PlanVerifyPass)
