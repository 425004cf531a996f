"""sbpc's passes, one file each. `PASSES` maps a pass name to a factory that
imports its module only when the pass is asked for, so start-up stays cheap."""

from collections.abc import Callable

from xdsl.passes import ModulePass


def _sbp_erase() -> type[ModulePass]:
    from .sbp_erase import SbpErasePass

    return SbpErasePass


def _sbp_infer() -> type[ModulePass]:
    from .sbp_infer import SbpInferPass

    return SbpInferPass


def _sbp_insert_boxing() -> type[ModulePass]:
    from .sbp_insert_boxing import SbpInsertBoxingPass

    return SbpInsertBoxingPass


def _sbp_simplify() -> type[ModulePass]:
    from .sbp_simplify import SbpSimplifyPass

    return SbpSimplifyPass


def _sbp_fuse_norms() -> type[ModulePass]:
    from .sbp_fuse_norms import SbpFuseNormsPass

    return SbpFuseNormsPass


def _sbp_bucket_collectives() -> type[ModulePass]:
    from .sbp_bucket_collectives import SbpBucketCollectivesPass

    return SbpBucketCollectivesPass


def _sbp_comm_summary() -> type[ModulePass]:
    from .sbp_comm_summary import SbpCommSummaryPass

    return SbpCommSummaryPass


def _compile() -> type[ModulePass]:
    from .compile import CompilePass

    return CompilePass


def _sbp_to_plan() -> type[ModulePass]:
    from .sbp_to_plan import SbpToPlanPass

    return SbpToPlanPass


def _plan_allocate_memory() -> type[ModulePass]:
    from .plan_allocate_memory import PlanAllocateMemoryPass

    return PlanAllocateMemoryPass


def _plan_verify() -> type[ModulePass]:
    from .plan_verify import PlanVerifyPass

    return PlanVerifyPass


def _plan_fuse_elementwise() -> type[ModulePass]:
    from .plan_fuse_elementwise import PlanFuseElementwisePass

    return PlanFuseElementwisePass


def _plan_codegen() -> type[ModulePass]:
    from .plan_codegen import PlanCodegenPass

    return PlanCodegenPass


def _lg_autodiff() -> type[ModulePass]:
    from .lg_autodiff import LgAutodiffPass

    return LgAutodiffPass


def _lg_optimizer() -> type[ModulePass]:
    from .lg_optimizer import LgOptimizerPass

    return LgOptimizerPass


def _sbp_autoplan() -> type[ModulePass]:
    from .sbp_autoplan import SbpAutoplanPass

    return SbpAutoplanPass


def _lg_recompute() -> type[ModulePass]:
    from .lg_recompute import LgRecomputePass

    return LgRecomputePass


def _lg_micro_batch() -> type[ModulePass]:
    from .lg_micro_batch import LgMicroBatchPass

    return LgMicroBatchPass


PASSES: dict[str, Callable[[], type[ModulePass]]] = {
    "lg-micro-batch": _lg_micro_batch,
    "lg-autodiff": _lg_autodiff,
    "lg-optimizer": _lg_optimizer,
    "lg-recompute": _lg_recompute,
    "sbp-erase": _sbp_erase,
    "sbp-autoplan": _sbp_autoplan,
    "sbp-infer": _sbp_infer,
    "sbp-insert-boxing": _sbp_insert_boxing,
    "sbp-simplify": _sbp_simplify,
    "sbp-fuse-norms": _sbp_fuse_norms,
    "sbp-bucket-collectives": _sbp_bucket_collectives,
    "sbp-comm-summary": _sbp_comm_summary,
    "sbp-to-plan": _sbp_to_plan,
    "plan-allocate-memory": _plan_allocate_memory,
    "plan-verify": _plan_verify,
    "plan-fuse-elementwise": _plan_fuse_elementwise,
    "plan-codegen": _plan_codegen,
    "compile": _compile,
}
