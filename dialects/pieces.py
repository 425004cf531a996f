"""How a dtensor lies on its mesh: the geometry the `sbp` dialect defines.

Every level that places bytes (the plan's local register shapes, boxing's
per-device volumes, the interpreters, the runtime's collectives) asks the same
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
import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from .sbp import DTensorType, Mesh, PlainNd, Sbp, nd_to_plain

if TYPE_CHECKING:  # sbp-opt reads IR without numpy
    import numpy as np

Coord = tuple[int, ...]
Region = tuple[slice, ...]


def balanced(n: int, parts: int, index: int) -> tuple[int, int]:
    """The [start, stop) of piece `index` of `n` elements cut in `parts`."""
    base, extra = divmod(n, parts)
    start = index * base + min(index, extra)
    return start, start + base + (1 if index < extra else 0)


def grouped_rows(ends: Sequence[int] | np.ndarray, rows: int, parts: int, index: int) -> tuple[int, int]:
    """The [start, stop) of the rows that device `index` of `parts` owns
    where rows are grouped by expert (G): the rows of its experts (the
    experts cut as `balanced` cuts them), from the end of the group before
    them; the first device's start at row 0 and the last one's run to the
    last row (rows past the last end are in no group: the last device owns
    them). The ends are read at run time, so they are clamped into range."""
    def end(expert: int) -> int:
        return 0 if expert == 0 else min(max(int(ends[expert - 1]), 0), rows)

    first, last = balanced(len(ends), parts, index)
    start = end(first)
    stop = rows if index == parts - 1 else end(last)
    return start, max(start, stop)


def indexed_rows(index: np.ndarray, parts: int, part: int, table_rows: int) -> np.ndarray:
    """Which rows device `part` of `parts` owns where rows were gathered by
    `index` from a table of `table_rows` rows split evenly (I): those whose
    table row it holds (a boolean mask over the rows)."""
    lo, hi = balanced(table_rows, parts, part)
    return (index >= lo) & (index < hi)


def owned_rows(nd: PlainNd, mesh_shape: Sequence[int], coord: Coord, rows: int, ends=None, index=None):
    """The rows the device at `coord` owns of a tensor stored whole but owned
    by rows (G or I on one mesh axis): a slice for grouped rows, a mask for
    gathered ones; None where no mesh axis owns rows so."""
    for a, s in enumerate(nd):
        if s.is_grouped:
            if ends is None:
                raise ValueError("rows grouped by expert (G) need the group ends")
            return slice(*grouped_rows(ends, rows, mesh_shape[a], coord[a]))
        if s.is_indexed:
            if index is None:
                raise ValueError("rows gathered by an index (I) need the index")
            assert s.rows is not None  # every I names its table's rows
            return indexed_rows(index, mesh_shape[a], coord[a], s.rows)
    return None


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


def region_size(region: Region) -> int:
    return math.prod(s.stop - s.start for s in region)


def relative(region: Region, within: Region) -> Region:
    """`region` in the index space of `within`, a region that holds it."""
    return tuple(slice(r.start - w.start, r.stop - w.start) for r, w in zip(region, within))


def intersect(a: Region, b: Region) -> Region | None:
    """The region two regions share; None if they share no element."""
    out = tuple(slice(max(x.start, y.start), min(x.stop, y.stop)) for x, y in zip(a, b))
    return out if all(s.start < s.stop for s in out) else (None if out else ())


def flat_range(region: Region, full: tuple[int, ...]) -> tuple[int, int] | None:
    """(start, stop) of `region` in the C-order flat layout of an array of
    shape `full` when the region is one contiguous run there (every axis
    after its last partial one whole, every axis before it one index wide);
    else None."""
    partial = [a for a, (r, n) in enumerate(zip(region, full)) if (r.start, r.stop) != (0, n)]
    if partial and any(region[a].stop - region[a].start != 1 for a in range(partial[-1])):
        return None
    start = 0
    for r, n in zip(region, full):
        start = start * n + r.start
    return start, start + region_size(region)


def in_order(regions: list[Region], full: tuple[int, ...]) -> bool:
    """Whether `regions` are contiguous runs that tile an array of shape
    `full` back to back in this order (so MPI can read or write them in
    place, with no packing)."""
    at = 0
    for region in regions:
        run = flat_range(region, full)
        if run is None or run[0] != at:
            return False
        at = run[1]
    return at == math.prod(full)


def lies_in_order(pieces: Sequence[Region], whole: Region) -> bool:
    """Whether `pieces` (global regions) tile `whole` back to back in this
    order: an all_gather receives them straight into `whole`, a
    reduce_scatter sends them straight from it."""
    return in_order([relative(p, whole) for p in pieces], region_shape(whole))


def regions_of(t: DTensorType, mesh: Mesh) -> dict[int, Region]:
    """Every rank's piece of `t`."""
    nd = nd_to_plain(t.nd_sbp)
    return {mesh.ranks[i]: piece(t.get_shape(), nd, mesh.shape, c) for i, c in enumerate(coords(mesh.shape))}


def transfer_routes(src: dict[int, Region], dst: dict[int, Region], me: int
                    ) -> tuple[list[tuple[int, Region]], list[tuple[int, Region]], list[tuple[Region, Region]]]:
    """What rank `me` does in a transfer from pieces `src` to pieces `dst`
    (rank -> global region): the pieces it sends (to rank, region of its
    source piece), receives (from rank, region of its destination piece)
    and copies itself (source-relative, destination-relative). Every
    destination piece is cut from the source pieces it meets; where several
    ranks hold the same piece (B axes), the receiver sends to itself if it
    holds one, else the one chosen by the receiver's position, so the load
    spreads."""
    sends: list[tuple[int, Region]] = []
    recvs: list[tuple[int, Region]] = []
    local: list[tuple[Region, Region]] = []
    holders: dict[tuple, list[int]] = {}
    for r, region in src.items():
        holders.setdefault(tuple((s.start, s.stop) for s in region), []).append(r)
    for i, (dst_rank, dst_region) in enumerate(sorted(dst.items())):
        for key, ranks in holders.items():
            src_region = tuple(slice(a, b) for a, b in key)
            part = intersect(src_region, dst_region)
            if part is None:
                continue
            sender = dst_rank if dst_rank in ranks else ranks[i % len(ranks)]
            if sender == me and dst_rank == me:
                local.append((relative(part, src_region), relative(part, dst_region)))
            elif sender == me:
                sends.append((dst_rank, relative(part, src_region)))
            elif dst_rank == me:
                recvs.append((sender, relative(part, dst_region)))
    return sends, recvs, local


def staged_elements(kind: str, src: dict[int, Region], dst: dict[int, Region], group: Sequence[int],
                    me: int) -> tuple[int, int]:
    """Elements rank `me` copies for one communication besides what MPI
    moves: into its send buffers before the call (packing, and a transfer's
    piece it keeps) and out of its receive buffers after it (unpacking).
    MPI needs each member's block contiguous: an all_gather along an inner
    axis unpacks, a reduce_scatter along one packs, all_to_all and transfers
    always stage both ways (runtime/collectives.py): the others' parts
    through its buffers, its own part straight from its piece to its result
    at the call."""
    if kind == "all_gather":
        gathered = sum(region_size(src[r]) for r in group)
        return 0, 0 if lies_in_order([src[r] for r in group], dst[me]) else gathered
    if kind == "reduce_scatter":
        return (0 if lies_in_order([dst[r] for r in group], src[me]) else region_size(src[me])), 0
    if kind == "all_to_all":
        sent = sum(region_size(p) for r in group if (p := intersect(src[me], dst[r])) is not None)
        received = sum(region_size(p) for r in group if r != me and (p := intersect(src[r], dst[me])) is not None)
        return sent, received
    if kind == "transfer":
        sends, recvs, local = transfer_routes(src, dst, me)
        return (sum(region_size(r) for _, r in sends) + sum(region_size(r) for r, _ in local),
                sum(region_size(r) for _, r in recvs))
    return 0, 0


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


def rank_group(mesh: Mesh, rank: int, axes: list[int]) -> list[int]:
    """The ranks that differ from `rank` only on `axes`, in mesh order."""
    here = mesh_coord(mesh, rank)
    members = [c for c in coords(mesh.shape) if all(c[a] == here[a] for a in range(len(here)) if a not in axes)]
    return [mesh.ranks[coords(mesh.shape).index(c)] for c in members]
