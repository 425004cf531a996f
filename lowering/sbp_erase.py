"""`sbp-erase`: forgets every distribution, giving back the logical graph.

dtensor types become builtin tensors of their global shape, `sbp.annotate`
and the collectives (globally the identity) disappear, and recorded SBP
signatures are dropped. Placements stay, so the graph can be distributed
again. The result computes exactly what the input computes, which makes it the
way to compare a distributed graph with its logical origin.
"""

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, TensorType
from xdsl.ir import Operation
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter

from sbpc.dialects.sbp import COLLECTIVE_OPS, SIGNATURE_ATTR, AnnotateOp, DTensorType

_IDENTITY_OPS: tuple[type[Operation], ...] = (AnnotateOp, *COLLECTIVE_OPS)


@dataclass(frozen=True)
class SbpErasePass(ModulePass):
    name = "sbp-erase"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for inner in list(op.walk()):
            if isinstance(inner, _IDENTITY_OPS):
                inner.results[0].replace_all_uses_with(inner.operands[0])
                Rewriter.erase_op(inner)
                continue
            inner.attributes.pop(SIGNATURE_ATTR, None)
            for result in list(inner.results):
                if isinstance(result.type, DTensorType):
                    Rewriter.replace_value_with_new_type(
                        result, TensorType(result.type.element_type, result.type.get_shape())
                    )
