"""`compile`: the named pipeline, everything sbpc can lower today, in order,
verifying between passes: sbp-infer, sbp-insert-boxing, sbp-simplify.
Later levels (the physical plan, memory) append their passes here."""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass

from .sbp_infer import SbpInferPass
from .sbp_insert_boxing import SbpInsertBoxingPass
from .sbp_simplify import SbpSimplifyPass


@dataclass(frozen=True)
class CompilePass(ModulePass):
    name = "compile"

    strategy: str = "auto"
    device: str = "cpu"

    def passes(self) -> list[ModulePass]:
        return [SbpInferPass(strategy=self.strategy, device=self.device), SbpInsertBoxingPass(), SbpSimplifyPass()]

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for p in self.passes():
            p.apply(ctx, op)
            op.verify()
