"""Reductions over axes (sum, mean, amax), argmax, top-k and sort, cumsum and histograms."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from sbpc import frontend as fe
from sbpc.dialects import lg
from sbpc.dialects.dtypes import numpy_dtype
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


@rule("aten.histc")
def _histc(im: _Importer, x, bins=100, min=0, max=0):
    """Counts of the elements in `bins` equal bins over [min, max], an
    element at max in the last one and those outside in none, as PyTorch's
    histc computes each element's bin: (x - min) * bins / (max - min),
    truncated. Each element compared with every bin: a router's tokens
    counted per expert (bins = experts). With min == max PyTorch takes the
    bounds from the data, which sbpc does not: refused."""
    x = im.lift(x)
    if not lg.is_float(x.dtype):
        raise ValueError(f"histc of {x.dtype} values (PyTorch's takes floats)")
    if min == max:
        raise ValueError("histc with min == max (bounds taken from the data): give the bounds")
    if bins < 1 or not (math.isfinite(min) and math.isfinite(max)) or min > max:
        raise ValueError(f"histc with bins={bins}, min={min}, max={max}")
    count = math.prod(x.shape)
    flat = x.reshape(count, 1)
    low, high = im.lift(float(min), x), im.lift(float(max), x)
    position = fe.trunc((flat - low) * float(bins) / (high - low))
    position = fe.where(fe.compare("eq", flat, high), im.lift(float(bins - 1), x), position)
    inside = fe.logical("and", fe.compare("ge", flat, low), fe.compare("le", flat, high))
    edges = im.g.constant(np.arange(bins, dtype=numpy_dtype(x.dtype)).reshape(1, bins))
    hits = fe.logical("and", fe.compare("eq", position, edges), inside)
    return fe.cast(hits, str(x.dtype)).sum(axes=(0,))


@rule("aten.amin")
def _amin(im: _Importer, x, dim=(), keepdim=False):
    """-amax(-x): the gradient shared by ties, as PyTorch's amin."""
    x = im.lift(x)
    return -fe.reduce_max(-x, _dims(dim, len(x.shape)), keepdim)


@rule("aten.argmin")
def _argmin(im: _Importer, x, dim=None, keepdim=False):
    """argmax of -x: the first of equal smallest, as PyTorch's."""
    return _argmax(im, -im.lift(x), dim, keepdim)


@rule("aten.max.dim", "aten.min.dim")
def _max_dim(im: _Importer, x, dim, keepdim=False):
    """(values, indices) along `dim`: the values gathered at the indices,
    so the gradient goes to the element picked, as PyTorch's."""
    x = im.lift(x)
    axis = _axis(dim, len(x.shape))
    smallest = im.node.target.name().startswith("aten::min")
    picked = _argmax(im, -x if smallest else x, axis, True)
    values = fe.gather(x, picked, axis)
    if not keepdim:
        kept = [*x.shape[:axis], *x.shape[axis + 1:]]
        values, picked = fe.reshape(values, kept), fe.reshape(picked, kept)
    return [values, picked]


@rule("aten.topk")
def _topk(im: _Importer, x, k, dim=-1, largest=True, sorted=True):
    """lg.topk's indices and the values gathered at them. With sorted=False
    PyTorch leaves the order unspecified; this is the sorted one."""
    x = im.lift(x)
    values, indices = fe.topk(x, int(k), _axis(dim, len(x.shape)), largest=bool(largest))
    return [values, indices]


@rule("aten.sort", "aten.sort.stable")
def _sort(im: _Importer, x, dim=-1, descending=False, *, stable=None):
    """top-k over the whole axis: equal elements keep their order, as
    PyTorch's stable sort (its default sort may order them either way)."""
    x = im.lift(x)
    axis = _axis(dim, len(x.shape))
    return _topk(im, x, x.shape[axis], axis, bool(descending))


@rule("aten.var.correction", "aten.var.dim")
def _var(im: _Importer, x, dim=None, unbiased=None, keepdim=False, *, correction=None):
    """The mean squared distance from the mean over `dim`, divided by
    N - correction (`unbiased`: correction 1, PyTorch's default)."""
    x = im.lift(x)
    axes = _dims(dim, len(x.shape))
    count = 1
    for a in axes:
        count *= x.shape[a]
    if correction is None:
        correction = 0 if unbiased is False else 1
    centred = x - fe.reduce_mean(x, axes, True)
    return fe.reduce_sum(centred * centred, axes, keepdim) * (1.0 / max(count - correction, 0) if
                                                               count > correction else float("nan"))


@rule("aten.any", "aten.any.dim", "aten.any.dims")
def _any(im: _Importer, x, dim=None, keepdim=False):
    """Whether any element along `dim` is nonzero: a bool tensor."""
    x = im.lift(x)
    flags = fe.cast(x, "i1") if str(x.dtype) != "i1" else x
    counts = fe.reduce_max(fe.cast(flags, "i32"), _dims(dim, len(x.shape)), keepdim)
    return fe.cast(counts, "i1")


def _product_along(im: _Importer, x: Tensor, axis: int) -> Tensor:
    """The product along `axis` (kept, as 1): halves multiplied pairwise
    until one row is left, an odd count padded with a row of ones. Only
    multiplications, so a zero factor gives the gradient PyTorch's does
    (the product of the others), not the NaN of a division or a logarithm."""
    while x.shape[axis] > 1:
        n = x.shape[axis]
        if n % 2:
            shape = [1 if d == axis else s for d, s in enumerate(x.shape)]
            x = fe.concat([x, fe.broadcast_to(im.lift(1, x), shape)], axis)
            n += 1
        half = n // 2
        x = fe.slice(x, [0] * len(x.shape), [half if d == axis else s for d, s in enumerate(x.shape)]) * fe.slice(
            x, [half if d == axis else 0 for d in range(len(x.shape))], list(x.shape))
    return x


@rule("aten.prod", "aten.prod.dim_int")
def _prod(im: _Importer, x, dim=None, keepdim=False, dtype=None):
    """The product of every element, or along `dim` (a multiplication tree,
    `_product_along`); booleans and integers multiply as int64, as PyTorch's."""
    x = im.lift(x)
    wanted = _result_dtype(im)
    if str(x.dtype) != wanted:
        x = fe.cast(x, wanted)
    if isinstance(dim, int):
        axis = _axis(dim, len(x.shape))
        product = _product_along(im, x, axis)
        return product if keepdim else fe.reshape(product, [s for d, s in enumerate(x.shape) if d != axis])
    if not x.shape:
        return x
    return fe.reshape(_product_along(im, fe.reshape(x, [math.prod(x.shape)]), 0), [])
