"""`compile`: the named pipeline: sbp-infer, sbp-insert-boxing,
sbp-simplify, sbp-fuse-norms (with `fuse`, the default),
sbp-bucket-collectives (with `bucket`, the default), and with `to_plan`
(the default) sbp-to-plan, plan-fuse-elementwise (with `fuse`),
plan-allocate-memory and plan-verify.

The module is verified once after the sbp-level passes (before sbp-to-plan
reads them) and by plan-verify at the end, which verifies the module first
itself and then checks the plan; the passes before it (sbp-to-plan,
plan-fuse-elementwise, plan-allocate-memory) only build and annotate the
plan it checks. With `verify_each` (as mlir-opt's -verify-each; the test
suite turns it on through SBPC_VERIFY_EACH=1) the module is verified after
every sbp-level pass too, so an invalid rewrite is caught at the pass that
made it. Each of those verifies took 0.33 s of a 10k-op graph's 6.9 s."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from sbpc.dialects import collector_paused
from sbpc.planning.cost_model import DEFAULT_DEVICE

from .plan_allocate_memory import PlanAllocateMemoryPass
from .plan_fuse_elementwise import PlanFuseElementwisePass
from .plan_verify import PlanVerifyPass
from .sbp_bucket_collectives import SbpBucketCollectivesPass
from .sbp_fuse_norms import SbpFuseNormsPass
from .sbp_infer import SbpInferOptions, SbpInferPass
from .sbp_insert_boxing import SbpInsertBoxingPass
from .sbp_simplify import SbpSimplifyPass
from .sbp_to_plan import SbpToPlanPass


@dataclass(frozen=True)
class CompilePass(SbpInferOptions, ModulePass):
    name = "compile"

    to_plan: bool = True
    """Lower to the physical plan; false stops at boxed sbp-level IR."""
    bucket: bool = True
    """Coalesce gradient collectives into buckets (sbp-bucket-collectives,
    priced with the `device` cluster)."""
    bucket_bytes: int = 0
    """sbp-bucket-collectives' fixed bucket size; 0: the cost model chooses."""
    fuse: bool = True
    """Fuse what the layout allows: layernorm's gradient into row kernels
    (sbp-fuse-norms) and elementwise chains in the plan
    (plan-fuse-elementwise)."""
    in_place: bool = True
    """Let the memory plan write an update over its parameter and an
    elementwise result over an input that dies there (plan-allocate-memory);
    false gives every register its own bytes, and the runtime copies each
    update over its parameter after the step."""
    verify_each: bool = os.environ.get("SBPC_VERIFY_EACH") == "1"
    """Verify the module after every sbp-level pass, not once after the last
    (the test suite's default: the Makefile sets SBPC_VERIFY_EACH=1)."""
    representatives: bool = False
    """Lower one device per equivalence class, for the step-time simulator
    (sbp-to-plan{representatives=true}); such a plan is not verified by
    plan-verify, which needs every device, and cannot run."""

    def passes(self) -> list[ModulePass]:
        return [SbpInferPass(**self.infer_options()),
                *lowering_passes(device=self.device, bucket=self.bucket, bucket_bytes=self.bucket_bytes,
                                 to_plan=self.to_plan, fuse=self.fuse, in_place=self.in_place,
                                 representatives=self.representatives)]

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        passes = self.passes()
        with collector_paused():
            for i, p in enumerate(passes):
                p.apply(ctx, op)
                if not skips_verify(p, passes[i + 1:], self.verify_each):
                    op.verify()


def lowering_passes(*, device: str = DEFAULT_DEVICE, bucket: bool = True, bucket_bytes: int = 0,
                    to_plan: bool = True, fuse: bool = True, in_place: bool = True,
                    representatives: bool = False) -> list[ModulePass]:
    """The lowering after sbp-infer, defined here once: `compile` runs it,
    and so do the planner on each layout it predicts and the layer search's
    profiler on each layer (both with `representatives`: one device per
    equivalence class is all the simulator replays, and lowering every
    device took most of the planning time; such a plan is not verified by
    plan-verify, which needs every device). The options are compile's."""
    passes: list[ModulePass] = [SbpInsertBoxingPass(), SbpSimplifyPass()]
    if fuse:
        passes.append(SbpFuseNormsPass())
    if bucket:
        passes.append(SbpBucketCollectivesPass(device=device, bucket_bytes=bucket_bytes))
    if to_plan:
        passes.append(SbpToPlanPass(representatives=representatives, device=device))
        if fuse:
            passes.append(PlanFuseElementwisePass())
        passes.append(PlanAllocateMemoryPass(in_place=in_place))
        if not representatives:
            passes.append(PlanVerifyPass())
    return passes


PLAN_PASSES = (SbpToPlanPass, PlanFuseElementwisePass, PlanAllocateMemoryPass)
"""Passes that produce or annotate the plan and never reject it: what they
write is verified by a later plan-verify before anything runs it."""


def skips_verify(done: ModulePass, following: Sequence[ModulePass], each: bool = False) -> bool:
    """Whether verifying the module after `done` is redundant: after
    plan-verify (it verified the module first itself, then only read it),
    after a plan pass that only plan passes and then plan-verify follow (the
    plan is verified there, once), and, unless `each`, after an sbp-level
    pass that another sbp-level pass follows (the last of them is verified).
    Verifying a 10k-op graph's plan (~40k registers and actors) took 1.8 s
    each time; sbp-to-plan's output used to be verified twice."""
    if isinstance(done, PlanVerifyPass):
        return True
    if not isinstance(done, PLAN_PASSES):
        return not each and bool(following) and not isinstance(following[0], (*PLAN_PASSES, PlanVerifyPass))
    for p in following:
        if isinstance(p, PlanVerifyPass):
            return True
        if not isinstance(p, PLAN_PASSES):
            return False
    return False
