"""sbpc: a compiler from single-device training graphs to distributed SBP
plans (OneFlow's split/broadcast/partial), built on xDSL.

Build a graph with the frontend (`sbpc.Graph`, ops as functions and
operators, `S`/`B`/`P` hints), `sbpc.compile` it, and `run` it on MPI ranks.

This package is the top layer (the API). Its names are loaded on first use
(PEP 562), so importing a lower layer (`sbpc.dialects.lg`, which Python
reaches through this package) does not load the API, the runtime or MPI.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

_FRONTEND = [
    "Graph", "Tensor", "Placement", "placement", "S", "B", "P", "zeros", "ones", "fill", "normal", "uniform",
    "neg", "relu", "gelu", "tanh", "erf", "exp", "sqrt", "rsqrt", "log", "sin", "cos", "atan", "floor", "ceil",
    "round", "trunc", "stop_gradient", "add", "sub", "mul", "div", "floordiv", "matmul", "grouped_matmul", "conv2d",
    "max_pool2d", "softmax",
    "log_softmax", "layernorm", "reduce_sum", "reduce_mean", "reduce_max", "argmax", "topk", "reshape", "transpose",
    "broadcast_to",
    "concat", "slice", "pad", "cumsum", "dropout", "gather", "scatter", "scatter_add", "embedding", "cross_entropy",
    "token_cross_entropy",
    "mse_loss", "cast", "logical", "compare", "where",
]
_WHERE = {
    "make_context": "sbpc.dialects",
    "parse_module": "sbpc.dialects",
    "compile": "sbpc.api",
    "from_torch": "sbpc.torch_frontend",
    "TorchImportError": "sbpc.torch_frontend",
    "Executable": "sbpc.api",
    "FeedConversionWarning": "sbpc.runtime.program",
    "RuntimeFailure": "sbpc.runtime.program",
    "Hosts": "sbpc.runtime.hosts",
    **dict.fromkeys(_FRONTEND, "sbpc.frontend"),
}

_SUBMODULES = ("optim",)

__all__ = [*_WHERE, *_SUBMODULES]


def __getattr__(name: str) -> Any:
    if name in _SUBMODULES:
        return importlib.import_module(f"sbpc.{name}")
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'sbpc' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


if TYPE_CHECKING:
    from sbpc import optim
    from sbpc.api import Executable, compile
    from sbpc.dialects import make_context, parse_module
    from sbpc.frontend import (
        B,
        Graph,
        P,
        Placement,
        S,
        Tensor,
        add,
        argmax,
        atan,
        broadcast_to,
        cast,
        ceil,
        compare,
        concat,
        conv2d,
        cos,
        cross_entropy,
        cumsum,
        div,
        dropout,
        embedding,
        erf,
        exp,
        fill,
        floor,
        floordiv,
        gather,
        gelu,
        grouped_matmul,
        layernorm,
        log,
        log_softmax,
        logical,
        matmul,
        max_pool2d,
        mse_loss,
        mul,
        neg,
        normal,
        ones,
        pad,
        placement,
        reduce_max,
        reduce_mean,
        reduce_sum,
        relu,
        reshape,
        round,
        rsqrt,
        scatter,
        scatter_add,
        sin,
        slice,
        softmax,
        sqrt,
        sub,
        tanh,
        token_cross_entropy,
        topk,
        transpose,
        trunc,
        uniform,
        where,
        zeros,
    )
    from sbpc.runtime.hosts import Hosts
    from sbpc.torch_frontend import TorchImportError, from_torch
