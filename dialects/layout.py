"""How a dtensor lies on its mesh: the geometry the `sbp` dialect defines.

Every level that places bytes (the plan's local register shapes, boxing's
per-device volumes, the simulators, the runtime's collectives) asks the same
two questions: where does a rank sit in its mesh, and which part of a global
tensor does it hold? They are answered here, once.

Pieces: a tensor axis split over mesh axes is cut hierarchically, outer mesh
axis first, into balanced pieces (the first `n % parts` pieces get one more
element; a split over more devices than elements leaves some pieces empty).
Devices are laid out row-major: `mesh.ranks[i]` sits at the coordinate whose
row-major linear index is `i`.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Sequence

import ml_dtypes
import numpy as np
from xdsl.dialects.builtin import BFloat16Type, Float16Type, Float32Type, Float64Type, IntegerType
from xdsl.ir import Attribute

from .sbp import DTensorType, Mesh, PlainNd, Sbp, nd_to_plain

Coord = tuple[int, ...]
Region = tuple[slice, ...]


def balanced(n: int, parts: int, index: int) -> tuple[int, int]:
    """The [start, stop) of piece `index` of `n` elements cut in `parts`."""
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def piece(shape: Sequence[int], nd: PlainNd, mesh_shape: Sequence[int], coord: Coord) -> Region:
    """The global index ranges of the piece held at mesh coordinate `coord`."""
    ranges = [(0, d) for d in shape]
    for mesh_axis, sbp in enumerate(nd):
        axis = Sbp.of(sbp).axis
        if axis is None:
            continue
        lo, hi = ranges[axis]
        start, stop = balanced(hi - lo, mesh_shape[mesh_axis], coord[mesh_axis])
        ranges[axis] = (lo + start, lo + stop)
    return tuple(slice(lo, hi) for lo, hi in ranges)


def region_shape(region: Region) -> tuple[int, ...]:
    return tuple(s.stop - s.start for s in region)


def coords(mesh_shape: Sequence[int]) -> list[Coord]:
    """Every coordinate of a mesh, row-major."""
    return list(itertools.product(*(range(p) for p in mesh_shape)))


def unravel(index: int, mesh_shape: Sequence[int]) -> Coord:
    """The row-major coordinate of linear index `index`."""
    out = []
    for d in reversed(mesh_shape):
        out.append(index % d)
        index //= d
    return tuple(reversed(out))


def mesh_coord(mesh: Mesh, rank: int) -> Coord:
    """Where `rank` sits in `mesh`."""
    return unravel(mesh.ranks.index(rank), mesh.shape)


def piece_of(t: DTensorType, mesh: Mesh, rank: int) -> Region:
    """The part of dtensor `t` (placed on `mesh`) that `rank` holds."""
    return _piece_of(t.get_shape(), nd_to_plain(t.nd_sbp), mesh.shape, mesh.ranks, rank)


def local_shape(t: DTensorType, mesh: Mesh, rank: int) -> tuple[int, ...]:
    """The shape of the piece of `t` that `rank` holds."""
    return region_shape(piece_of(t, mesh, rank))


@functools.lru_cache(maxsize=1 << 14)
def _piece_of(shape: tuple[int, ...], nd: PlainNd, mesh_shape: tuple[int, ...], ranks: tuple[int, ...],
              rank: int) -> Region:
    # A plan has thousands of registers but few distinct (shape, SBP, rank)
    # cases, and every module verification checks every register.
    return piece(shape, nd, mesh_shape, unravel(ranks.index(rank), mesh_shape))


def partial_kind(nd: PlainNd) -> Sbp | None:
    """Sbp.P or Sbp.PMAX if some mesh axis of `nd` holds partial values, else None."""
    kinds = {s for s in nd if s.is_partial}
    assert len(kinds) <= 1, f"nd-SBP {nd} mixes partial kinds"
    return kinds.pop() if kinds else None


HALF_DTYPES = (np.dtype(np.float16), np.dtype(ml_dtypes.bfloat16))
"""The 16-bit float storage types. An op on them computes in float32 and
rounds its result once (what PyTorch's CPU kernels do for half and
bfloat16: elementwise ops, GEMMs accumulating in float32, reductions
with a float32 accumulator)."""


def is_half(dtype) -> bool:
    return np.dtype(dtype) in HALF_DTYPES


def is_float_dtype(dtype) -> bool:
    """Floating point, the 16-bit storage types included (numpy does not
    count ml_dtypes' bfloat16 as floating)."""
    dtype = np.dtype(dtype)
    return dtype.kind == "f" or dtype in HALF_DTYPES


def compute_dtype(dtype) -> np.dtype:
    """The dtype an op on `dtype` values computes in: float32 for the half types."""
    return np.dtype(np.float32) if is_half(dtype) else np.dtype(dtype)


def numpy_dtype(elem: Attribute) -> np.dtype:
    """The numpy dtype of an IR element type (bf16: ml_dtypes' bfloat16)."""
    if isinstance(elem, Float16Type):
        return np.dtype(np.float16)
    if isinstance(elem, BFloat16Type):
        return np.dtype(ml_dtypes.bfloat16)
    if isinstance(elem, Float32Type):
        return np.dtype(np.float32)
    if isinstance(elem, Float64Type):
        return np.dtype(np.float64)
    if isinstance(elem, IntegerType):
        return np.dtype(np.bool_) if elem.width.data == 1 else np.dtype(f"int{elem.width.data}")
    raise ValueError(f"no numpy dtype for element type {elem}")
