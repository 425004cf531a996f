"""sbpc: a compiler from single-device training graphs to distributed SBP
plans (OneFlow's split/broadcast/partial), built on xDSL.

Build a graph with the frontend (`sbpc.Graph`, ops as functions and
operators, `S`/`B`/`P` hints), `sbpc.compile` it, and `run` it on MPI ranks.
"""

from xdsl.context import Context
from xdsl.dialects.builtin import Builtin, ModuleOp
from xdsl.parser import Parser

from sbpc.dialects.lg import LG
from sbpc.dialects.plan import PLAN
from sbpc.dialects.sbp import SBP

__all__ = [
    "make_context", "parse_module", "compile", "Executable", "Graph", "Tensor", "Placement", "placement",
    "S", "B", "P", "zeros", "ones", "fill", "normal", "uniform",
    "neg", "relu", "gelu", "tanh", "exp", "sqrt", "rsqrt", "add", "sub", "mul", "div", "matmul", "softmax",
    "log_softmax", "layernorm", "reduce_sum", "reduce_mean", "reduce_max", "reshape", "transpose", "broadcast_to",
    "concat", "slice", "embedding", "cross_entropy", "mse_loss",
]


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


from sbpc.api import Executable, compile  # noqa: E402
from sbpc.frontend import (  # noqa: E402
    B, P, Graph, Placement, S, Tensor, add, broadcast_to, concat, cross_entropy, div, embedding, exp, fill, gelu,
    layernorm, log_softmax, matmul, mse_loss, mul, neg, normal, ones, placement, reduce_max, reduce_mean, reduce_sum,
    relu, reshape, rsqrt, slice, softmax, sqrt, sub, tanh, transpose, uniform, zeros,
)
