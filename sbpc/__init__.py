"""sbpc: a compiler from single-device training graphs to distributed SBP
plans (OneFlow's split/broadcast/partial), built on xDSL.

The public API grows with the compiler; today it parses, builds, verifies
and evaluates `lg` and `sbp` IR.
"""

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.parser import Parser

from sbpc.dialects.lg import LG
from sbpc.dialects.plan import PLAN
from sbpc.dialects.sbp import SBP

__all__ = ["make_context", "parse_module"]


def make_context() -> Context:
    """A context with the builtin, `lg`, `sbp` and `plan` dialects loaded."""
    ctx = Context()
    for dialect in (Builtin, LG, SBP, PLAN):
        ctx.load_dialect(dialect)
    return ctx


def parse_module(text: str, name: str = "<string>", verify: bool = True) -> ModuleOp:
    """Parses (and by default verifies) textual IR into a module."""
    module = Parser(make_context(), text, name).parse_module()
    if verify:
        module.verify()
    return module
