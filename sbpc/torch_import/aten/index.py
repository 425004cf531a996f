"""Indexing: advanced indexing (`x[idx]`, `x[arange(n), idx]`),
index_select, gather and embedding lookups."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from sbpc import frontend as fe
from sbpc.dialects import lg
from sbpc.frontend import Tensor
from sbpc.torch_import.aten.registry import _axis, rule

if TYPE_CHECKING:
    # for the annotations only: the importer loads the rules (through their
    # registry) before it defines _Importer
    from sbpc.torch_import.importer import _Importer


@rule("aten.index.Tensor")
def _index(im: _Importer, x, indices):
    """Advanced indexing. Index tensors known at import time that only
    insert and broadcast axes (transformers' masks index a padding mask with
    broadcast `arange`s): a reshape and a broadcast; that pick elements: a
    gather (`_gather_known`). One index tensor
    computed from the inputs, after whole axes (`x[:, idx]`): a selection
    along that axis. `x[torch.arange(n), idx]` over a whole first axis (a
    classification head's last token per row): a gather."""
    x = im.lift(x)
    known = [None if i is None else im.known(i) for i in indices]
    computed = [d for d, (i, k) in enumerate(zip(indices, known)) if i is not None and k is None]
    if computed:
        return _index_computed(im, x, indices, known, computed)
    where = np.arange(math.prod(x.shape)).reshape(x.shape)[
        tuple(slice(None) if k is None else k for k in known)]
    spread = [axis for axis in range(where.ndim)
              if np.all(where == where.take([0], axis=axis))]  # the same element all along: broadcast
    core = where[tuple(slice(0, 1) if axis in spread else slice(None) for axis in range(where.ndim))]
    if not np.array_equal(core.ravel(), np.arange(math.prod(x.shape))):
        return _gather_known(im, x, known, where)
    reshaped = fe.reshape(x, list(core.shape)) if tuple(core.shape) != tuple(x.shape) else x
    return fe.broadcast_to(reshaped, list(where.shape)) if core.shape != where.shape else reshaped


def _gather_known(im: _Importer, x: Tensor, known, where: np.ndarray) -> Tensor:
    """Indexing with indices known at import time that picks elements
    (Swin's relative position bias table, the gathers interpolation
    decomposes into): one integer index on one axis is a lookup along that
    axis (a row-split table stays split); anything else gathers the
    flattened tensor at the elements' positions."""
    used = [d for d, k in enumerate(known) if k is not None]
    if len(used) == 1 and known[used[0]].dtype.kind in "iu":
        axis = used[0]
        index = np.asarray(known[axis], dtype=np.int64) % x.shape[axis]
        return _take(x, axis, im.g.constant(index))
    return gather_positions(im, x, where)


def gather_positions(im: _Importer, x: Tensor, where: np.ndarray) -> Tensor:
    """The elements of `x` at the row-major positions `where` (any shape,
    known at import time): a gather of the flattened tensor, whose gradient
    adds up where positions repeat."""
    flat = fe.reshape(x, [math.prod(x.shape)])
    picked = _take(flat, 0, im.g.constant(where.astype(np.int64).ravel()))
    return fe.reshape(picked, list(where.shape))


def _index_computed(im: _Importer, x: Tensor, indices, known, computed: list[int]) -> Tensor:
    used = [d for d, i in enumerate(indices) if i is not None]
    if len(used) == 1 and used == computed:  # x[:, ..., idx]
        return _take(x, computed[0], im.lift(indices[computed[0]]))
    rows = known[0]
    if (used == [0, 1] and computed == [1] and rows is not None and rows.ndim == 1
            and np.array_equal(rows, np.arange(x.shape[0]))):  # x[arange(n), idx]
        picks = im.lift(indices[1])
        if tuple(picks.shape) != (x.shape[0],):
            raise ValueError(f"x[arange({x.shape[0]}), idx] with idx of shape {list(picks.shape)}")
        along = [x.shape[0], 1, *x.shape[2:]]
        spread = fe.broadcast_to(fe.reshape(picks, [x.shape[0], *[1] * (len(x.shape) - 1)]), along)
        return fe.reshape(fe.gather(x, spread, 1), [x.shape[0], *x.shape[2:]])
    raise ValueError("indexing with indices computed from the inputs other than x[..., idx] after whole axes "
                     "and x[torch.arange(n), idx]")


def _take(x: Tensor, axis: int, index: Tensor) -> Tensor:
    """`x` at `index` (any shape) along `axis`: the axis replaced by the
    index's axes. A 2-D table along its rows is an embedding lookup (which
    splits by rows); otherwise a gather with the index broadcast."""
    if not lg.is_index(index.dtype):
        raise ValueError(f"indices of dtype {index.dtype} (sbpc takes int32 and int64 indices)")
    if axis == 0 and len(x.shape) == 2 and lg.is_float(x.dtype):
        return fe.embedding(x, index)
    flat = fe.reshape(index, [math.prod(index.shape)]) if len(index.shape) != 1 else index
    count = flat.shape[0]
    lined = fe.reshape(flat, [count if d == axis else 1 for d in range(len(x.shape))])
    picked = fe.gather(x, fe.broadcast_to(lined, [count if d == axis else n for d, n in enumerate(x.shape)]), axis)
    shape = [*x.shape[:axis], *index.shape, *x.shape[axis + 1:]]
    return picked if list(picked.shape) == shape else fe.reshape(picked, shape)


@rule("aten.index_select")
def _index_select(im: _Importer, x, dim, index):
    x = im.lift(x)
    return _take(x, _axis(dim, len(x.shape)), im.lift(index))


@rule("aten.gather")
def _gather(im: _Importer, x, dim, index, sparse_grad=False):
    x, index = im.lift(x), im.lift(index)
    axis = _axis(dim, len(x.shape))
    if len(index.shape) != len(x.shape) or any(a != b for d, (a, b) in enumerate(zip(x.shape, index.shape))
                                                if d != axis):
        raise ValueError(f"gather with index shape {list(index.shape)} smaller than the input's {list(x.shape)} "
                         f"off axis {axis} (sbpc takes an index shaped as the input but on the gathered axis)")
    return fe.gather(x, index, axis)


@rule("aten.scatter_add")
def _scatter_add(im: _Importer, x, dim, index, src):
    """x plus the source elements added where the index points (the source
    cut to the index's shape, as PyTorch reads it); the gradient reaches x
    whole and the source where each element went."""
    x, index, src = im.lift(x), im.lift(index), im.lift(src)
    axis = _axis(dim, len(x.shape))
    if len(index.shape) != len(x.shape) or any(a != b for d, (a, b) in enumerate(zip(x.shape, index.shape))
                                                if d != axis):
        raise ValueError(f"scatter_add with index shape {list(index.shape)} smaller than the input's "
                         f"{list(x.shape)} off axis {axis} (sbpc takes an index shaped as the input but on the "
                         "scattered axis)")
    if list(src.shape) != list(index.shape):
        src = fe.slice(src, [0] * len(index.shape), list(index.shape))
    return x + fe.scatter_add(src, index, axis, x.shape[axis])


def _full_index(what: str, x: Tensor, index: Tensor, axis: int) -> None:
    if len(index.shape) != len(x.shape) or any(a != b for d, (a, b) in enumerate(zip(x.shape, index.shape))
                                                if d != axis):
        raise ValueError(f"{what} with index shape {list(index.shape)} smaller than the input's {list(x.shape)} "
                         f"off axis {axis} (sbpc takes an index shaped as the input but on the scattered axis)")


@rule("aten.scatter.src", "aten.scatter.value")
def _scatter(im: _Importer, x, dim, index, src):
    """x with the source elements (or one value) written where the index
    points along `dim`, the last aimed at an element winning (lg.scatter);
    the source cut to the index's shape, as PyTorch reads it."""
    x, index = im.lift(x), im.lift(index)
    axis = _axis(dim, len(x.shape))
    _full_index("scatter", x, index, axis)
    if isinstance(src, Tensor):
        if list(src.shape) != list(index.shape):
            src = fe.slice(src, [0] * len(index.shape), list(index.shape))
    else:
        src = fe.broadcast_to(im.lift(src, x), list(index.shape))
    return fe.scatter(x, index, src, axis)


@rule("aten.index_put")
def _index_put(im: _Importer, x, indices, values, accumulate=False):
    """x[..., idx] = values (or += with `accumulate`) for one index tensor
    after whole axes, negative indices counted from the end: lg.scatter
    (the last of repeated indices winning, as PyTorch's CPU loop) or
    lg.scatter_add, the values broadcast to the rows they write."""
    x = im.lift(x)
    used = [d for d, i in enumerate(indices) if i is not None]
    if len(used) != 1 or used[0] != len(indices) - 1:
        raise ValueError("index_put with other than one index tensor after whole axes (x[..., idx] = v)")
    axis = used[0]
    index = im.lift(indices[axis])
    if not lg.is_index(index.dtype):
        raise ValueError(f"index_put with indices of dtype {index.dtype} (boolean masks: torch.where)")
    if len(index.shape) != 1:
        raise ValueError(f"index_put with an index of shape {list(index.shape)} (supported: a vector)")
    size, count = x.shape[axis], index.shape[0]
    index = fe.where(fe.compare("lt", index, im.lift(0, index)), index + im.lift(size, index), index)
    shape = [count if d == axis else n for d, n in enumerate(x.shape)]
    lined = fe.broadcast_to(fe.reshape(index, [count if d == axis else 1 for d in range(len(x.shape))]), shape)
    values = im.lift(values, x)
    if str(values.dtype) != str(x.dtype):
        values = fe.cast(values, str(x.dtype))
    if list(values.shape) != shape:
        values = fe.broadcast_to(values, shape)
    if accumulate:
        if not lg.is_float(x.dtype):
            raise ValueError(f"index_put with accumulate=True of {x.dtype} values (supported: floats)")
        return x + fe.scatter_add(values, lined, axis, size)
    return fe.scatter(x, lined, values, axis)


@rule("aten.embedding_dense_backward")
def _embedding_dense_backward(im: _Importer, grad, indices, num_weights, padding_idx, scale_grad_by_freq):
    """The gradient of an embedding's table: each row the sum of the
    gradients of its lookups, the padding row's zero (lg.embedding_grad)."""
    if scale_grad_by_freq:
        raise ValueError("embedding_dense_backward with scale_grad_by_freq")
    grad, indices = im.lift(grad), im.lift(indices)
    rows = int(num_weights)
    padding = None if padding_idx in (-1, None) else _axis(padding_idx, rows)
    return grad.graph.add(lg.EmbeddingGradOp(grad.value, indices.value, rows, padding))


@rule("aten.embedding")
def _embedding(im: _Importer, weight, indices, padding_idx=-1, scale_grad_by_freq=False, sparse=False):
    if scale_grad_by_freq:
        raise ValueError("embedding with scale_grad_by_freq")
    weight = im.lift(weight)
    padding = None if padding_idx in (-1, None) else _axis(padding_idx, weight.shape[0])
    return fe.embedding(weight, im.lift(indices), padding_idx=padding)


@rule("aten._embedding_bag")
def _embedding_bag(im: _Importer, weight, indices, offsets, scale_grad_by_freq=False, mode=0, sparse=False,
                   per_sample_weights=None, include_last_offset=False, padding_idx=-1):
    """Each bag's rows summed (mode 0) or averaged (mode 1), a bag being the
    indices from its offset to the next: (the bags, each index's bag, each
    bag's size, the sizes again where PyTorch puts the maxima's indices of
    mode 2). An index's bag is how many offsets are at or before it, less
    one; its row, weighted where per-sample weights are given, is added
    into its bag (lg.scatter_add); the padding row counts in no bag. An
    empty bag is zero."""
    if scale_grad_by_freq:
        raise ValueError("_embedding_bag with scale_grad_by_freq")
    if int(mode) not in (0, 1):
        raise ValueError(f"_embedding_bag mode {mode} ('max': sum and mean are imported)")
    weight, indices, offsets = im.lift(weight), im.lift(indices), im.lift(offsets)
    if len(indices.shape) != 1 or len(offsets.shape) != 1:
        raise ValueError("_embedding_bag of indices or offsets that are not 1-D (PyTorch flattens 2-D bags first)")
    length, bags = indices.shape[0], offsets.shape[0] - (1 if include_last_offset else 0)
    positions = im.g.constant(np.arange(length, dtype=fe._numpy_of(offsets.dtype)).reshape(length, 1))
    started = fe.compare("le", fe.reshape(offsets, [1, offsets.shape[0]]), positions)  # (L, offsets)
    bag = fe.reduce_sum(fe.cast(started, "i64"), [1]) - im.g.constant(np.ones((), np.int64))
    rows = fe.embedding(weight, indices)
    if padding_idx in (-1, None):  # every index counts in its bag
        counted = im.g.constant(np.ones(length, fe._numpy_of(weight.dtype)))
    else:
        padding = im.g.constant(np.asarray(int(padding_idx), fe._numpy_of(indices.dtype)))
        counted = fe.cast(fe.compare("ne", indices, padding), str(weight.dtype))
    scale = counted if per_sample_weights is None else counted * im.lift(per_sample_weights, weight)
    dim = weight.shape[1]
    spread = fe.broadcast_to(fe.reshape(bag, [length, 1]), [length, dim])
    total = fe.scatter_add(rows * fe.reshape(scale, [length, 1]), spread, 0, bags)
    sizes = fe.scatter_add(counted, bag, 0, bags)
    if int(mode) == 1:
        one = im.g.constant(np.ones((), fe._numpy_of(weight.dtype)))
        total = total / fe.reshape(fe.where(fe.compare("gt", sizes, one * 0.5), sizes, one), [bags, 1])
    size_counts = fe.cast(sizes, "i64")
    return [total, bag, size_counts, size_counts]


@rule("aten.masked_scatter")
def _masked_scatter(im: _Importer, x, mask, source):
    """x with the source's leading elements, in order, written where the
    mask (broadcast to x) is true: the element at mask position i is the
    source's element number (true positions up to i) - 1, a running count
    of the mask; a gather of the flattened source, so the gradient reaches
    the source elements used and x where the mask is false."""
    x, mask = im.lift(x), im.lift(mask)
    n = math.prod(x.shape)
    if list(mask.shape) != list(x.shape):
        mask = fe.broadcast_to(mask, list(x.shape))
    chosen = fe.compare("ne", mask, im.lift(0, mask)) if str(mask.dtype) != "i1" else mask
    flat = fe.reshape(chosen, [n])
    ones = fe.cast(flat, "i64")
    count = fe.cumsum(ones, 0) - ones  # the true positions before each
    position = fe.where(flat, count, im.lift(0, count))  # false positions pick element 0, then discarded
    source = im.lift(source, x)
    picked = _take(fe.reshape(source, [math.prod(source.shape)]), 0, position)
    return fe.where(chosen, fe.reshape(picked, list(x.shape)), x)


@rule("aten.scatter_reduce.two")
def _scatter_reduce(im: _Importer, x, dim, index, src, reduce, include_self=True):
    """The source elements reduced into x where the index points along
    `dim`: "sum" adds them (to x, or to 0 where `include_self` is false),
    "mean" divides that sum by how many were added (x counting as one);
    an element of x no index points to keeps its value. "prod", "amax" and
    "amin" are refused by name."""
    if reduce not in ("sum", "mean"):
        raise ValueError(f"scatter_reduce with reduce='{reduce}' (supported: 'sum', 'mean')")
    x, index = im.lift(x), im.lift(index)
    if not lg.is_float(x.dtype):
        raise ValueError(f"scatter_reduce of {x.dtype} values (supported: floats)")
    axis = _axis(dim, len(x.shape))
    _full_index("scatter_reduce", x, index, axis)
    src = im.lift(src, x)
    if list(src.shape) != list(index.shape):
        src = fe.slice(src, [0] * len(index.shape), list(index.shape))
    total = fe.scatter_add(src, index, axis, x.shape[axis])
    hits = fe.scatter_add(fe.broadcast_to(im.lift(1.0, x), list(index.shape)), index, axis, x.shape[axis])
    zero = im.lift(0.0, x)
    reached = fe.compare("gt", hits, zero)
    if include_self:
        total = total + x
        hits = hits + 1.0
    if reduce == "mean":
        total = total / fe.where(reached, hits, im.lift(1.0, x))
    return fe.where(reached, total, x)
