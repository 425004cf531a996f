"""`compile`: the named pipeline, verifying between passes: sbp-infer,
sbp-insert-boxing, sbp-simplify, and with `to_plan` (the default)
sbp-to-plan, plan-fuse-elementwise (with `fuse`, the default),
plan-allocate-memory and plan-verify."""

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
        for p in self.passes():
            p.apply(ctx, op)
            op.verify()
