"""Shape ops: views and reshapes, transpose and permute, expand, the
identities (contiguous, clone), slicing, split and chunk, cat and pad."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from sbpc import frontend as fe
from sbpc.frontend import Tensor
from sbpc.torch_import.aten.index import _take, gather_positions
from sbpc.torch_import.aten.registry import _axis, _dims, rule
from sbpc.torch_import.values import _DTYPES

if TYPE_CHECKING:
    # for the annotations only: the importer loads the rules (through their
    # registry) before it defines _Importer
    from sbpc.torch_import.importer import _Importer


@rule("aten.view", "aten.reshape", "aten._unsafe_view")
def _reshape(im: _Importer, x, shape):
    return fe.reshape(im.lift(x), [int(d) for d in shape])


@rule("aten.flatten.using_ints")
def _flatten(im: _Importer, x, start_dim=0, end_dim=-1):
    x = im.lift(x)
    s, e = _axis(start_dim, len(x.shape)), _axis(end_dim, len(x.shape))
    return fe.reshape(x, [*x.shape[:s], math.prod(x.shape[s:e + 1]), *x.shape[e + 1:]])


@rule("aten.unsqueeze")
def _unsqueeze(im: _Importer, x, dim):
    x = im.lift(x)
    d = _axis(dim, len(x.shape) + 1)
    return fe.reshape(x, [*x.shape[:d], 1, *x.shape[d:]])


@rule("aten.squeeze.dim", "aten.squeeze.dims", "aten.squeeze")
def _squeeze(im: _Importer, x, dim=None):
    x = im.lift(x)
    drop = set(_dims(dim, len(x.shape)))
    return fe.reshape(x, [d for i, d in enumerate(x.shape) if not (i in drop and d == 1)])


@rule("aten.transpose.int")
def _transpose(im: _Importer, x, d0, d1):
    x = im.lift(x)
    perm = list(range(len(x.shape)))
    a, b = _axis(d0, len(perm)), _axis(d1, len(perm))
    perm[a], perm[b] = perm[b], perm[a]
    return x if a == b else fe.transpose(x, perm)


@rule("aten.t")
def _t(im: _Importer, x):
    return _transpose(im, x, 0, -1)


@rule("aten.permute")
def _permute(im: _Importer, x, dims):
    x = im.lift(x)
    return fe.transpose(x, [_axis(d, len(x.shape)) for d in dims])


@rule("aten.expand")
def _expand(im: _Importer, x, size, implicit=False):
    x = im.lift(x)
    lead = len(size) - len(x.shape)
    shape = [x.shape[i - lead] if d == -1 else int(d) for i, d in enumerate(size)]
    return x if tuple(shape) == x.shape else fe.broadcast_to(x, shape)


@rule("aten.broadcast_tensors")
def _broadcast_tensors(im: _Importer, tensors):
    values = [im.lift(t) for t in tensors]
    shape = np.broadcast_shapes(*(v.shape for v in values))
    return [v if v.shape == shape else fe.broadcast_to(v, shape) for v in values]


@rule("aten.contiguous", "aten.clone", "aten.alias", "aten.lift_fresh_copy")
def _identity(im: _Importer, x, memory_format=None):
    return x


@rule("aten.chunk")
def _chunk(im: _Importer, x, chunks, dim=0):
    x = im.lift(x)
    return _split(im, x, math.ceil(x.shape[_axis(dim, len(x.shape))] / chunks), dim)


@rule("aten.split.Tensor", "aten.split_with_sizes")
def _split(im: _Importer, x, sizes, dim=0):
    x = im.lift(x)
    d = _axis(dim, len(x.shape))
    n = x.shape[d]
    bounds = list(range(0, n, sizes)) + [n] if isinstance(sizes, int) else list(np.cumsum([0, *sizes]))
    return [_slice_axis(x, d, int(a), int(b)) for a, b in zip(bounds, bounds[1:])]


def _slice_axis(x: Tensor, d: int, start: int, end: int, step: int = 1) -> Tensor:
    if (start, end, step) == (0, x.shape[d], 1):
        return x
    starts = [0] * len(x.shape)
    limits = list(x.shape)
    strides = [1] * len(x.shape)
    starts[d], limits[d], strides[d] = start, end, step
    return fe.slice(x, starts, limits, strides)


@rule("aten.slice.Tensor")
def _slice(im: _Importer, x, dim=0, start=None, end=None, step=1):
    x = im.lift(x)
    d = _axis(dim, len(x.shape))
    begin, stop, _ = slice(start, end).indices(x.shape[d])
    return _slice_axis(x, d, begin, max(begin, stop), step)


@rule("aten.narrow")
def _narrow(im: _Importer, x, dim, start, length):
    x = im.lift(x)
    d = _axis(dim, len(x.shape))
    begin = start + x.shape[d] if start < 0 else start
    return _slice_axis(x, d, begin, begin + length)


@rule("aten.select.int")
def _select(im: _Importer, x, dim, index):
    x = im.lift(x)
    d = _axis(dim, len(x.shape))
    i = index + x.shape[d] if index < 0 else index
    return fe.reshape(_slice_axis(x, d, i, i + 1), [s for k, s in enumerate(x.shape) if k != d])


@rule("aten.cat")
def _cat(im: _Importer, tensors, dim=0):
    """`torch.cat`, which skips a legacy empty operand (1-D of size 0) beside
    tensors of more dimensions, as PyTorch does: a `DynamicCache` layer
    starts as one, and every decoder built with `use_cache` (its config's
    default) concatenates its keys and values onto it."""
    values = [im.lift(t) for t in tensors]
    kept = [v for v in values if list(v.shape) != [0]] or values[:1]
    if len(kept) == 1:
        return kept[0]
    return fe.concat(kept, _axis(dim, len(kept[0].shape)))


@rule("aten.constant_pad_nd")
def _constant_pad_nd(im: _Importer, x, pad, value=0):
    """`aten.constant_pad_nd(x, pad, value)`: its third argument is the
    value (`aten.pad`'s is the mode)."""
    return _pad(im, x, pad, "constant", value)


@rule("aten.pad")
def _pad(im: _Importer, x, pad, mode="constant", value=None):
    """Constant padding (F.pad's list names the last axis first: (left,
    right, top, bottom, ...)); a negative width crops, a slice."""
    if mode != "constant":
        raise ValueError(f"pad with mode '{mode}' (only 'constant' is supported)")
    x = im.lift(x)
    rank = len(x.shape)
    if len(pad) % 2 or len(pad) // 2 > rank:
        raise ValueError(f"pad of {len(pad)} widths for a {rank}-D tensor")
    low, high = [0] * rank, [0] * rank
    for i in range(len(pad) // 2):
        low[rank - 1 - i], high[rank - 1 - i] = pad[2 * i], pad[2 * i + 1]
    if any(w < 0 for w in (*low, *high)):
        x = fe.slice(x, [max(-w, 0) for w in low], [d - max(-w, 0) for d, w in zip(x.shape, high)])
    return fe.pad(x, [max(w, 0) for w in low], [max(w, 0) for w in high], 0 if value is None else value)


@rule("aten.repeat")
def _repeat(im: _Importer, x, repeats):
    """Tiles: each axis i of the (left-padded) shape repeated repeats[i] times."""
    x = im.lift(x)
    repeats = [int(r) for r in repeats]
    if len(repeats) < len(x.shape):
        raise ValueError(f"{len(repeats)} repeats for a {len(x.shape)}-D tensor")
    shape = [1] * (len(repeats) - len(x.shape)) + list(x.shape)
    interleaved = [d for s in shape for d in (1, s)]
    tiled = [d for r, s in zip(repeats, shape) for d in (r, s)]
    return fe.reshape(fe.broadcast_to(fe.reshape(x, interleaved), tiled), [r * s for r, s in zip(repeats, shape)])


@rule("aten.flip")
def _flip(im: _Importer, x, dims):
    """The listed axes reversed: each a gather of the reversed positions."""
    x = im.lift(x)
    for axis in _dims(dims, len(x.shape)):
        positions = im.g.constant(np.arange(x.shape[axis] - 1, -1, -1, dtype=np.int64))
        x = _take(x, axis, positions)
    return x


@rule("aten.slice_scatter")
def _slice_scatter(im: _Importer, x, src, dim=0, start=None, end=None, step=1):
    """`x` with positions start..end of `dim` replaced by `src` (step 1)."""
    x, src = im.lift(x), im.lift(src)
    axis = _axis(dim, len(x.shape))
    size = x.shape[axis]
    begin = 0 if start is None else min(max(start + size if start < 0 else start, 0), size)
    stop = size if end is None else min(max(end + size if end < 0 else end, begin), size)
    if step != 1:
        raise ValueError(f"slice_scatter with step {step} (supported: 1)")
    low, high = [0] * len(x.shape), [0] * len(x.shape)
    low[axis], high[axis] = begin, size - stop
    inside = np.zeros([size if i == axis else 1 for i in range(len(x.shape))], dtype=bool)
    inside.reshape(-1)[begin:stop] = True
    return fe.where(im.g.constant(inside), fe.pad(src, low, high, 0), x)


@rule("aten.select_scatter")
def _select_scatter(im: _Importer, x, src, dim, index):
    """`x` with position `index` of `dim` replaced by `src`."""
    x, src = im.lift(x), im.lift(src)
    axis = _axis(dim, len(x.shape))
    index = index + x.shape[axis] if index < 0 else index
    src = fe.reshape(src, [*x.shape[:axis], 1, *x.shape[axis + 1:]])
    return _slice_scatter(im, x, src, axis, index, index + 1)


@rule("aten.copy")
def _copy(im: _Importer, x, src, non_blocking=False):
    """`src` in `x`'s shape and dtype (the functional form of `x.copy_(src)`)."""
    x, src = im.lift(x), im.lift(src)
    src = src if str(src.dtype) == str(x.dtype) else fe.cast(src, str(x.dtype))
    return src if tuple(src.shape) == tuple(x.shape) else fe.broadcast_to(src, x.shape)


@rule("aten.fill.Scalar", "aten.full_like")
def _full_like(im: _Importer, x, value, dtype=None, **_):
    """A tensor of `x`'s shape holding `value` (in `dtype`, else `x`'s): a constant."""
    x = im.lift(x)
    lg_dtype = _DTYPES.get(str(dtype)) if dtype is not None else str(x.dtype)
    if lg_dtype is None:
        raise ValueError(f"dtype {dtype}")
    return im.g.constant(np.full(x.shape, value, dtype=fe._numpy_of(fe.element(lg_dtype))))


@rule("aten.fill.Tensor")
def _fill_tensor(im: _Importer, x, value):
    """`x`'s shape and dtype, every element the 0-d `value`."""
    x = im.lift(x)
    known = im.known(value)
    if known is not None:
        return _full_like(im, x, known.item())
    value = im.lift(value)
    value = value if str(value.dtype) == str(x.dtype) else fe.cast(value, str(x.dtype))
    return fe.broadcast_to(fe.reshape(value, [1] * len(x.shape)), list(x.shape))


def _pad_positions(size: int, low: int, high: int, mode: str) -> np.ndarray:
    """The source position of each padded position along one axis."""
    positions = np.arange(-low, size + high)
    if mode == "replicate":
        return np.clip(positions, 0, size - 1)
    period = 2 * (size - 1)  # reflect: ... 2 1 [0 1 2 ... n-1] n-2 ...
    folded = np.abs(positions) % period if period else np.zeros_like(positions)
    return np.where(folded >= size, period - folded, folded)


@rule("aten.reflection_pad1d", "aten.reflection_pad2d", "aten.reflection_pad3d", "aten.replication_pad1d",
      "aten.replication_pad2d", "aten.replication_pad3d")
def _reflect_or_replicate(im: _Importer, x, padding):
    """Padding by mirroring (without the edge) or repeating the edge along
    the last len(padding) / 2 axes (listed last axis first, as F.pad's):
    a gather of known positions per axis."""
    x = im.lift(x)
    mode = "reflect" if "reflection" in im.node.target.name() else "replicate"
    for i in range(len(padding) // 2):
        axis = len(x.shape) - 1 - i
        low, high, size = int(padding[2 * i]), int(padding[2 * i + 1]), x.shape[axis]
        if mode == "reflect" and (low >= size or high >= size):
            raise ValueError(f"reflection padding of {max(low, high)} on an axis of {size}")
        if low or high:
            x = _take(x, axis, im.g.constant(_pad_positions(size, low, high, mode).astype(np.int64)))
    return x


def _positions(x: Tensor, pick) -> np.ndarray:
    """Which element of `x` (row-major) each element of a view built by `pick`
    from an index array of `x`'s shape reads."""
    return np.asarray(pick(np.arange(math.prod(x.shape)).reshape(x.shape)))


@rule("aten.diagonal")
def _diagonal(im: _Importer, x, offset=0, dim1=0, dim2=1):
    x = im.lift(x)
    return gather_positions(im, x, _positions(x, lambda a: np.diagonal(a, offset, dim1, dim2)))


@rule("aten.as_strided")
def _as_strided(im: _Importer, x, size, stride, storage_offset=None):
    """A strided view of a dense tensor: the elements it reads, gathered
    (where they overlap, the gradient adds up, as PyTorch's)."""
    x = im.lift(x)
    start = int(storage_offset or 0)
    size, stride = [int(d) for d in size], [int(s) for s in stride]
    where = start + sum(np.arange(n).reshape([n if a == i else 1 for a in range(len(size))]) * s
                        for i, (n, s) in enumerate(zip(size, stride))) if size else np.asarray(start)
    where = np.broadcast_to(where, size)
    if where.size and (where.min() < 0 or where.max() >= math.prod(x.shape)):
        raise ValueError(f"as_strided of size {size}, stride {stride} outside a tensor of {math.prod(x.shape)}")
    return gather_positions(im, x, where)


@rule("aten.resize_")
def _resize(im: _Importer, x, size, memory_format=None):
    """The tensor's first elements in row-major order, in the new shape:
    shrinking keeps them, as PyTorch does; growing would add elements whose
    values PyTorch leaves undefined, and is refused."""
    x = im.lift(x)
    size = [int(d) for d in size]
    have, want = math.prod(x.shape), math.prod(size)
    if want > have:
        raise ValueError(f"resize_ from {list(x.shape)} to {size}: the {want - have} new elements are undefined")
    return fe.reshape(fe.slice(fe.reshape(x, [have]), [0], [want]), size)
