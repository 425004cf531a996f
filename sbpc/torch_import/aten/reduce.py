"""Reductions over axes (sum, mean, amax), argmax and cumsum."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from sbpc import frontend as fe
from sbpc.dialects import lg
from sbpc.frontend import Tensor
from sbpc.torch_import.aten.elementwise import _result_dtype
from sbpc.torch_import.aten.registry import RULES, _axis, _dims, rule
from sbpc.torch_import.values import _DTYPES

if TYPE_CHECKING:
    # for the annotations only: the importer loads the rules (through their
    # registry) before it defines _Importer
    from sbpc.torch_import.importer import _Importer


def _reduction(fn: Callable[..., Tensor]):
    def lower(im: _Importer, x, dim=None, keepdim=False, dtype=None):
        x = im.lift(x)
        wanted = _result_dtype(im)  # a sum of booleans counts in int64; `dtype=` converts first
        return fn(x if str(x.dtype) == wanted else fe.cast(x, wanted), _dims(dim, len(x.shape)), keepdim)

    return lower


RULES["aten.mean.dim"] = RULES["aten.mean"] = _reduction(fe.reduce_mean)
RULES["aten.sum.dim_IntList"] = RULES["aten.sum"] = _reduction(fe.reduce_sum)
RULES["aten.amax"] = _reduction(fe.reduce_max)


@rule("aten.argmax")
def _argmax(im: _Importer, x, dim=None, keepdim=False):
    """lg.argmax along `dim`; over every element (dim None) of the flattened
    tensor; `keepdim` keeps the axis as 1."""
    x = im.lift(x)
    if dim is None:
        x, dim = fe.reshape(x, [-1]), 0
    axis = _axis(dim, len(x.shape))
    picked = fe.argmax(x, axis)
    if keepdim:
        picked = fe.reshape(picked, [*x.shape[:axis], 1, *x.shape[axis + 1:]])
    return picked


@rule("aten.cumsum")
def _cumsum(im: _Importer, x, dim, dtype=None):
    """Running sums; PyTorch sums integers and booleans as int64 unless told a dtype."""
    x = im.lift(x)
    wanted = _DTYPES.get(str(dtype)) if dtype is not None else str(x.dtype) if lg.is_float(x.dtype) else "i64"
    if wanted is None or wanted == "i1":
        raise ValueError(f"cumsum to dtype {dtype}")
    return fe.cumsum(x if str(x.dtype) == wanted else fe.cast(x, wanted), _axis(dim, len(x.shape)))
