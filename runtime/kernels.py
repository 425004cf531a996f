"""The numpy backend's kernels that write straight into their output
register (`out=`), so the steady state allocates nothing for them. Ops
without an entry here run sbpc.local_eval.local_kernel and copy its result
into the register."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
from xdsl.ir import Operation

from sbpc.dialects import lg


def _matmul(op: lg.MatmulOp, a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    if op.transpose_lhs is not None:
        a = np.swapaxes(a, -1, -2)
    if op.transpose_rhs is not None:
        b = np.swapaxes(b, -1, -2)
    np.matmul(a, b, out=out)


def _binary(ufunc) -> Callable:
    def kernel(op, a, b, out):
        ufunc(a, b, out=out)

    return kernel


def _unary(ufunc) -> Callable:
    def kernel(op, x, out):
        ufunc(x, out=out)

    return kernel


OUT_KERNELS: dict[type[Operation], Callable[..., None]] = {
    lg.MatmulOp: _matmul,
    lg.AddOp: _binary(np.add),
    lg.SubOp: _binary(np.subtract),
    lg.MulOp: _binary(np.multiply),
    lg.DivOp: _binary(np.divide),
    lg.NegOp: _unary(np.negative),
    lg.ExpOp: _unary(np.exp),
    lg.TanhOp: _unary(np.tanh),
    lg.SqrtOp: _unary(np.sqrt),
    lg.ReluOp: lambda op, x, out: np.maximum(x, 0, out=out),
}


def run_into(op: Operation, inputs: Sequence[np.ndarray], out: np.ndarray) -> bool:
    """Runs `op` into `out` if it has an out= kernel; False otherwise."""
    kernel = OUT_KERNELS.get(type(op))
    if kernel is None:
        return False
    if any(np.shares_memory(x, out) for x in inputs) and type(op) is lg.MatmulOp:
        return False  # matmul cannot write over its own operand
    kernel(op, *inputs, out)
    return True
