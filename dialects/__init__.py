"""sbpc's IR, the bottom layer: one dialect per file (`lg` the logical
graph, `sbp` distributed tensors, placements and collectives, `plan` the
physical actor plan) and the layout geometry the `sbp` dialect defines
(`layout`: pieces, balanced splits, mesh coordinates). Nothing here imports
a pass, the runtime or the API."""

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.parser import Parser

from .lg import LG
from .plan import PLAN
from .sbp import SBP


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
