"""Communication actors on MPI: each plan.comm becomes a non-blocking
collective (or point-to-point transfer) over its rank group.

Pieces of a tensor are the same ones the interpreters use (sbpc.dialects.pieces.piece);
where MPI needs contiguous per-member blocks (all_gather along an inner
axis, reduce_scatter, all_to_all, transfers) the actor packs into or
unpacks from buffers it takes from the rank's Staging at issue and gives
back once the collective completes, so the steady state allocates nothing.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import cast

import numpy as np
from mpi4py import MPI
from mpi4py.util.dtlib import from_numpy_dtype

from sbpc.dialects import plan
from sbpc.dialects.dtypes import is_half
from sbpc.dialects.pieces import (
    grouped_rows,
    indexed_rows,
    intersect,
    lies_in_order,
    mesh_coord,
    partial_kind,
    region_shape,
    region_size,
    regions_of,
    relative,
    transfer_routes,
)
from sbpc.dialects.sbp import Sbp, nd_to_plain


@dataclass
class Pending:
    """An issued communication: its requests, what to do once they complete,
    and the byte ranges of the arena it still reads or writes."""

    actor: plan.CommOp
    requests: list[MPI.Request]
    finish: Callable[[], None] | None = None
    ranges: list[tuple[int, int, int, bool]] = field(default_factory=list)  # (buffer id, lo, hi, writes)
    start: float = 0.0
    moved: int | None = None
    """Bytes this rank received, where only the issue knew it (grouped rows)."""
    phase: tuple[int, int] | None = None
    """(actor index, slot phase) when issued from the schedule: its ranges
    are then those of every issue at that phase, so the hazards between it
    and each actor phase are worked out once (Executor._wait_ranges)."""
    staged: list[np.ndarray] = field(default_factory=list)
    """The Staging buffers it packs into or receives in, given back once it
    has completed and been unpacked (Executor._retire)."""


class Staging:
    """The packing buffers of a rank's communication actors, shared among
    them. An actor takes what it packs into or receives in when it issues
    and gives it back once its collective has completed and been unpacked,
    so a rank holds what the collectives in flight at once need, not a
    buffer per collective: GPT-2 small's plan on 2 ranks has 41 all_to_alls,
    each of which held a send and a receive buffer of its own for the whole
    run, outside the planned arena. A take is the smallest free buffer that
    holds it, so once a step has run, the next finds what it needs and the
    steady state allocates nothing."""

    def __init__(self) -> None:
        self._free: list[np.ndarray] = []  # byte buffers, by size
        self._sizes: list[int] = []

    def take(self, shape: tuple[int, ...], dtype: np.dtype, into: list[np.ndarray]) -> np.ndarray:
        """A buffer of `shape` and `dtype`; its bytes are added to `into`
        (a Pending's staged buffers) to be given back."""
        count = math.prod(shape)
        need = max(count * dtype.itemsize, 1)
        at = bisect.bisect_left(self._sizes, need)
        if at < len(self._free):
            del self._sizes[at]
            whole = self._free.pop(at)
        else:
            whole = np.empty(need, np.uint8)
        into.append(whole)
        return whole[: count * dtype.itemsize].view(dtype).reshape(shape)

    def give_back(self, buffers: list[np.ndarray]) -> None:
        for whole in buffers:
            at = bisect.bisect_left(self._sizes, whole.nbytes)
            self._sizes.insert(at, whole.nbytes)
            self._free.insert(at, whole)
        buffers.clear()

    @property
    def bytes_held(self) -> int:
        """What the free buffers hold (all of it between steps)."""
        return sum(self._sizes)


class CommActor:
    """One plan.comm on this rank, ready to issue each step."""

    def __init__(self, actor: plan.CommOp, rank: int, meshes, views, comm: MPI.Comm | None, staging: Staging):
        self.actor = actor
        self.staging = staging  # the rank's, shared by its actors
        self.kind = actor.kind.data
        self.rank = rank
        self.comm = comm  # the group communicator (None for local kinds and transfers)
        self.group = list(actor.group.get_values())
        src_t, dst_t = actor.source, actor.dest
        self.src_mesh, self.dst_mesh = meshes(src_t), meshes(dst_t)
        self.src_regions = regions_of(src_t, self.src_mesh)
        self.dst_regions = regions_of(dst_t, self.dst_mesh)
        self.in_name = actor.ins.data[0].string_value() if actor.ins.data else None
        # into or out of rows grouped by expert (G) or gathered by an index
        # (I): the group ends and the index, read at each issue
        extra = [r.string_value() for r in actor.ins.data[1:]]
        self.ends_name = extra.pop(0) if actor.reads_group_ends() else None
        self.index_name = extra.pop(0) if actor.reads_index() else None
        self.out_name = actor.outs.data[0].string_value() if actor.outs.data else None
        self.views = views
        kind = partial_kind(nd_to_plain(src_t.nd_sbp))
        self.op = MPI.MAX if kind == Sbp.PMAX else MPI.SUM
        self.fill = -np.inf if partial_kind(nd_to_plain(dst_t.nd_sbp)) == Sbp.PMAX else 0
        sample = views(self.in_name or self.out_name, 0)
        # 16-bit floats (f16, bf16) travel as their bytes (uint16: MPI has no
        # bfloat16) and are summed in float32, each result rounded once
        self.half = is_half(sample.dtype)
        self.dtype = sample.dtype
        if self.half:
            self.dtype = np.dtype(np.float32) if self.kind in REDUCING else np.dtype(np.uint16)
        self.mpi_type = from_numpy_dtype(self.dtype)
        self._wide: dict[str, np.ndarray] = {}
        self._prepare()

    # -- load-time plans for packing ------------------------------------------

    def _prepare(self) -> None:
        k = self.kind
        me = self.rank
        if self.ends_name is not None or self.index_name is not None:
            self._prepare_owned()
        elif k == "all_gather":
            self.counts = [region_size(self.src_regions[r]) for r in self.group]
            self.displs = list(np.cumsum([0, *self.counts[:-1]]))
            # Pieces that lie back to back in the result (a split along the
            # outermost axis) are received straight into it.
            self.direct = lies_in_order([self.src_regions[r] for r in self.group], self.dst_regions[me])
        elif k == "reduce_scatter":
            self.counts = [region_size(self.dst_regions[r]) for r in self.group]
            self.direct = lies_in_order([self.dst_regions[r] for r in self.group], self.src_regions[me])
        elif k == "all_to_all":
            # This member's own part goes straight from its piece to its
            # result, once, at issue; MPI moves only the others' (through
            # MPI it was packed, copied to itself and unpacked: [16, 64, 128]
            # S(0) -> S(2) on 2 ranks took 64-70 us, the copies included).
            own = [intersect(self.src_regions[me], self.dst_regions[me])] if me in self.group else []
            self.own_part = own[0] if own and own[0] is not None else None
            self.send_parts = [intersect(self.src_regions[me], self.dst_regions[r]) if r != me else None
                               for r in self.group]
            self.recv_parts = [intersect(self.src_regions[r], self.dst_regions[me]) if r != me else None
                               for r in self.group]
            self.scounts = [region_size(p) if p is not None else 0 for p in self.send_parts]
            self.rcounts = [region_size(p) if p is not None else 0 for p in self.recv_parts]
            self.sdispl = list(np.cumsum([0, *self.scounts[:-1]]))
            self.rdispl = list(np.cumsum([0, *self.rcounts[:-1]]))
        elif k == "transfer":
            self._prepare_transfer()

    def _prepare_owned(self) -> None:
        """Rows owned at run time (grouped by expert, G, or gathered by an
        index, I): the mesh axis, how many rows and how many elements a row
        holds here, and where the even pieces' rows lie (an all_to_all's
        other side). Who owns which rows is read from the group ends and the
        index at each issue. Grouped rows are contiguous and move in place;
        gathered ones travel in buffers of the bound (every row), made here,
        so a step allocates no rows."""
        src_nd = nd_to_plain(self.actor.source.nd_sbp)
        dst_nd = nd_to_plain(self.actor.dest.nd_sbp)
        axes = list(self.actor.mesh_axes.get_values())
        if len(axes) != 1:
            raise ValueError(f"a {self.kind} into or out of rows owned at run time acts on one mesh axis, got {axes}")
        self.src_sbp, self.dst_sbp = src_nd[axes[0]], dst_nd[axes[0]]
        self.grouped_source = self.src_sbp == Sbp.G
        owned_source = self.src_sbp.is_grouped or self.src_sbp.is_indexed
        whole = self.src_regions[self.rank] if owned_source else self.dst_regions[self.rank]
        self.rows = whole[0].stop - whole[0].start
        self.row = region_size(whole[1:])
        even = self.dst_regions if owned_source else self.src_regions
        self.even_rows = [(even[r][0].start, even[r][0].stop) for r in self.group]
        if self.index_name is not None:
            self.packed_out = np.empty(self.rows * self.row, self.dtype)
            self.packed_in = np.empty(self.rows * self.row, self.dtype)
            self.row_ids = np.arange(self.rows)

    def _rows_of(self, sbp: Sbp, member: int, ends, index):
        """The rows member `member` (its place in the group) owns under `sbp`
        on the collective's axis: a slice, or a mask for gathered rows."""
        p = len(self.group)
        if sbp.is_grouped:
            return slice(*grouped_rows(ends, self.rows, p, member))
        if sbp.is_indexed:
            assert sbp.rows is not None  # every I names its table's rows
            return indexed_rows(index, p, member, sbp.rows)
        if sbp.is_split:
            return slice(*self.even_rows[member])
        return slice(0, self.rows)

    def _prepare_transfer(self) -> None:
        """Who sends which piece to whom (layout.transfer_routes); each piece
        travels in a Staging buffer."""
        self.sends, self.recvs, self.local = transfer_routes(self.src_regions, self.dst_regions, self.rank)

    # -- issuing -----------------------------------------------------------------

    def issue(self, slot_in: int, slot_out: int) -> Pending:
        k = self.kind
        # Typed as present, as they are in every branch that uses them: each kind but
        # transfer reads one register and writes one (plan.comm's verifier), the kinds
        # that exchange data have a group communicator (the executor makes one), and a
        # transfer reads `src` only on a sending rank (in the source mesh, so it holds
        # the input) and writes `dst` only on a receiving one (in the destination mesh).
        src = cast(np.ndarray, self.views(self.in_name, slot_in) if self.in_name else None)
        dst = cast(np.ndarray, self.views(self.out_name, slot_out) if self.out_name else None)
        comm = cast(MPI.Comm, self.comm)
        pending = Pending(self.actor, [])
        me = self.rank
        # An empty piece (a split over more devices than elements) may sit at
        # the address of the other buffer, which MPI refuses as aliasing.
        if src is not None and src.size == 0:
            src = np.empty(src.shape, src.dtype)
        if dst is not None and dst.size == 0:
            dst = np.empty(dst.shape, dst.dtype)
        narrow = None
        if self.half and k in REDUCING:
            wide = self._widened("src", src)
            np.copyto(wide, src)
            narrow, src, dst = dst, wide, self._widened("dst", dst)
        elif self.half and k in MOVING:
            src = src.view(np.uint16) if src is not None else src
            dst = dst.view(np.uint16) if dst is not None else dst
        if self.index_name is not None:
            ends = self.views(self.ends_name, slot_in) if self.ends_name is not None else None
            pending = self._issue_indexed(k, src, dst, comm, pending, ends,
                                          self.views(self.index_name, slot_in).reshape(-1))
        elif self.ends_name is not None:
            ends = self.views(self.ends_name, slot_in)
            pending = self._issue_grouped(k, src, dst, comm, pending, ends)
        else:
            pending = self._issue(k, src, dst, comm, pending, me)
        if narrow is not None:
            inner = pending.finish

            def rounded():
                if inner is not None:
                    inner()
                np.copyto(narrow, dst)

            pending.finish = rounded
        return pending

    def _widened(self, which: str, like: np.ndarray) -> np.ndarray:
        """A float32 buffer shaped like `like`, made on first use."""
        buf = self._wide.get(which)
        if buf is None or buf.shape != like.shape:
            buf = self._wide[which] = np.empty(like.shape, np.float32)
        return buf

    def _issue_grouped(self, k: str, src, dst, comm, pending: Pending, ends: np.ndarray) -> Pending:
        """A collective into or out of rows grouped by expert: each member's
        rows (pieces.grouped_rows of this step's ends) move in place, with
        MPI's v-collectives counted at this issue. A grouped destination
        keeps zeros in the rows it stores but does not own."""
        p, i, row = len(self.group), self.group.index(self.rank), self.row
        owned = [grouped_rows(ends, self.rows, p, j) for j in range(p)]
        lo, hi = owned[i]
        pending.moved = 0
        # (B -> G, a local slice that keeps the whole, reads no ends: _issue copies it)
        if k == "make_partial":  # G -> P: its own rows in the reduction's identity
            kept = src[lo:hi].copy() if np.shares_memory(src, dst) else src[lo:hi]
            dst.fill(self.fill)
            dst[lo:hi] = kept
        elif k == "all_gather":  # G -> B
            counts = [(b - a) * row for a, b in owned]
            displs = [a * row for a, _ in owned]
            mine = src[lo:hi] if hi > lo else np.empty(0, src.dtype)
            pending.requests.append(comm.Iallgatherv(mine, [dst.reshape(-1), counts, displs, self.mpi_type]))
            pending.moved = (sum(counts) - counts[i]) * self.dtype.itemsize
        elif k == "reduce_scatter":  # P -> G: rows are in member order, so each block is a member's
            dst[:lo] = 0
            dst[hi:] = 0
            mine = dst[lo:hi].reshape(-1) if hi > lo else np.empty(0, dst.dtype)
            counts = [(b - a) * row for a, b in owned]
            pending.requests.append(comm.Ireduce_scatter(src.reshape(-1), mine, counts, self.op))
            pending.moved = (p - 1) * counts[i] * self.dtype.itemsize
        elif k == "all_to_all":
            def meet(x: tuple[int, int], y: tuple[int, int]) -> tuple[int, int]:
                start = max(x[0], y[0])
                return start, max(start, min(x[1], y[1]))

            even = self.even_rows
            if self.grouped_source:  # G -> S(0): own grouped rows to their even owners
                sends = [meet(owned[i], even[j]) for j in range(p)]
                recvs = [meet(owned[j], even[i]) for j in range(p)]
                sdispl = [a * row for a, _ in sends]
                rdispl = [(a - even[i][0]) * row for a, _ in recvs]
            else:  # S(0) -> G: even rows to their grouped owners
                sends = [meet(even[i], owned[j]) for j in range(p)]
                recvs = [meet(even[j], owned[i]) for j in range(p)]
                sdispl = [(a - even[i][0]) * row for a, _ in sends]
                rdispl = [a * row for a, _ in recvs]
                dst[:lo] = 0
                dst[hi:] = 0
            scounts = [(b - a) * row for a, b in sends]
            rcounts = [(b - a) * row for a, b in recvs]
            pending.requests.append(comm.Ialltoallv([src.reshape(-1), scounts, sdispl, self.mpi_type],
                                                    [dst.reshape(-1), rcounts, rdispl, self.mpi_type]))
            pending.moved = (sum(rcounts) - rcounts[i]) * self.dtype.itemsize
        else:
            raise ValueError(f"no {k} into or out of grouped rows")
        return pending

    def _issue_indexed(self, k: str, src, dst, comm, pending: Pending, ends, index: np.ndarray) -> Pending:
        """A collective into or out of rows gathered by an index (I): each
        member's rows are those whose table row it holds, scattered among
        the rows, so they travel packed in the buffers of the bound and land
        at their places once received. A destination owned by rows keeps
        zeros in the rows it stores but does not own."""
        p, i, row = len(self.group), self.group.index(self.rank), self.row
        dst_sbp = self.dst_sbp
        own = self._rows_of(self.src_sbp, i, ends, index)
        pending.moved = 0
        # (B -> I, a local slice that keeps the whole, reads no index: _issue copies it)
        flat_src, flat_dst = src.reshape(len(src), -1), dst.reshape(len(dst), -1)
        if k == "make_partial":  # I -> P: its own rows in the reduction's identity
            if np.shares_memory(src, dst):
                flat_dst[~own] = self.fill
            else:
                dst.fill(self.fill)
                np.copyto(flat_dst, flat_src, where=own[:, None])
            return pending
        rows = self.row_ids

        def pack(ids: np.ndarray, at: int) -> None:
            """Rows `ids` of the source into the send buffer from `at`, with no copy between."""
            np.take(flat_src, ids, axis=0, mode="clip",  # (unbuffered: "raise" copies through a temporary)
                    out=self.packed_out[at : at + len(ids) * row].reshape(len(ids), row))

        if k == "all_gather":  # I -> B: every member's gathered rows, packed in member order
            senders = [rows[self._rows_of(self.src_sbp, j, ends, index)] for j in range(p)]
            counts = [len(r) * row for r in senders]
            displs = list(np.cumsum([0, *counts[:-1]]))
            pack(senders[i], 0)
            pending.requests.append(comm.Iallgatherv(self.packed_out[: counts[i]],
                                                     [self.packed_in, counts, displs, self.mpi_type]))
            receivers = [(r, displ, count) for r, displ, count in zip(senders, displs, counts)]
            pending.moved = (sum(counts) - counts[i]) * self.dtype.itemsize
        elif k == "all_to_all":  # I <-> G: each row from the member that owns it to the one that will
            sends = [rows[own][self._take(self.dst_sbp, j, ends, index, rows[own])] for j in range(p)]
            mine_after = self._rows_of(dst_sbp, i, ends, index)
            recvs = [rows[mine_after][self._take(self.src_sbp, j, ends, index, rows[mine_after])] for j in range(p)]
            scounts, rcounts = [len(r) * row for r in sends], [len(r) * row for r in recvs]
            sdispl, rdispl = list(np.cumsum([0, *scounts[:-1]])), list(np.cumsum([0, *rcounts[:-1]]))
            for r, at in zip(sends, sdispl):
                pack(r, at)
            if dst_sbp.is_grouped or dst_sbp.is_indexed:
                dst.fill(0)
            pending.requests.append(comm.Ialltoallv([self.packed_out, scounts, sdispl, self.mpi_type],
                                                    [self.packed_in, rcounts, rdispl, self.mpi_type]))
            receivers = list(zip(recvs, rdispl, rcounts))
            pending.moved = (sum(rcounts) - rcounts[i]) * self.dtype.itemsize
        else:
            raise ValueError(f"no {k} into or out of rows gathered by an index")

        def finish():
            for r, displ, count in receivers:
                if count:
                    flat_dst[r] = self.packed_in[displ : displ + count].reshape(len(r), -1)

        pending.finish = finish
        return pending

    def _take(self, sbp: Sbp, member: int, ends, index, rows: np.ndarray):
        """Which of `rows` member `member` owns under `sbp` (a mask over them)."""
        owned = self._rows_of(sbp, member, ends, index)
        if isinstance(owned, slice):
            return (rows >= owned.start) & (rows < owned.stop)
        return owned[rows]

    def _issue(self, k: str, src, dst, comm, pending: Pending, me: int) -> Pending:
        if k == "all_reduce":
            pending.requests.append(comm.Iallreduce(src, dst, self.op))
        elif k == "all_gather" and self.direct:
            pending.requests.append(
                comm.Iallgatherv(src, [dst.reshape(-1), self.counts, self.displs, self.mpi_type])
            )
        elif k == "all_gather":
            recv = self.staging.take((sum(self.counts),), self.dtype, pending.staged)
            pending.requests.append(comm.Iallgatherv(src, [recv, self.counts, self.displs, self.mpi_type]))

            def finish():
                for r, count, displ in zip(self.group, self.counts, self.displs):
                    region = relative(self.src_regions[r], self.dst_regions[me])
                    dst[region] = recv[displ : displ + count].reshape(region_shape(self.src_regions[r]))

            pending.finish = finish
        elif k == "reduce_scatter" and self.direct:
            pending.requests.append(comm.Ireduce_scatter(src.reshape(-1), dst.reshape(-1), self.counts, self.op))
        elif k == "reduce_scatter":
            send = self.staging.take((sum(self.counts),), self.dtype, pending.staged)
            at = 0
            for r, count in zip(self.group, self.counts):
                block = src[relative(self.dst_regions[r], self.src_regions[me])]
                send[at : at + count].reshape(block.shape)[...] = block  # (block.reshape(-1) would copy it first)
                at += count
            pending.requests.append(comm.Ireduce_scatter(send, dst.reshape(-1), self.counts, self.op))
        elif k == "all_to_all":
            send = self.staging.take((max(sum(self.scounts), 1),), self.dtype, pending.staged)
            recv = self.staging.take((max(sum(self.rcounts), 1),), self.dtype, pending.staged)
            at = 0
            for part, count in zip(self.send_parts, self.scounts):
                if count:
                    assert part is not None  # a count is 0 where the pieces do not meet
                    block = src[relative(part, self.src_regions[me])]
                    send[at : at + count].reshape(block.shape)[...] = block  # (block.reshape(-1) would copy it first)
                    at += count
            if self.own_part is not None:  # (after packing: src may share dst's bytes)
                dst[relative(self.own_part, self.dst_regions[me])] = src[relative(self.own_part, self.src_regions[me])]
            pending.requests.append(
                comm.Ialltoallv(
                    [send, self.scounts, self.sdispl, self.mpi_type],
                    [recv, self.rcounts, self.rdispl, self.mpi_type],
                )
            )

            def finish():
                for part, count, displ in zip(self.recv_parts, self.rcounts, self.rdispl):
                    if count:
                        received = recv[displ : displ + count].reshape(region_shape(part))
                        dst[relative(part, self.dst_regions[me])] = received

            pending.finish = finish
        elif k == "slice":
            dst[...] = src[relative(self.dst_regions[me], self.src_regions[me])]
        elif k == "make_partial":
            kept = src.copy() if np.shares_memory(src, dst) else src
            dst.fill(self.fill)
            here = mesh_coord(self.src_mesh, me)
            axes = list(self.actor.mesh_axes.get_values())
            src_nd = nd_to_plain(self.actor.source.nd_sbp)
            if not any(here[a] for a in axes if src_nd[a] == Sbp.B):
                dst[relative(self.src_regions[me], self.dst_regions[me])] = kept
        elif k == "transfer":
            world = MPI.COMM_WORLD
            tag = self.actor.comm_id.value.data
            for to, region in self.sends:
                buf = self.staging.take(region_shape(region), self.dtype, pending.staged)
                buf[...] = src[region]
                pending.requests.append(world.Isend(buf, dest=to, tag=tag))
            recv_bufs = [self.staging.take(region_shape(region), self.dtype, pending.staged)
                         for _, region in self.recvs]
            for buf, (frm, _) in zip(recv_bufs, self.recvs):
                pending.requests.append(world.Irecv(buf, source=frm, tag=tag))
            for src_rel, dst_rel in self.local:
                dst[dst_rel] = src[src_rel]

            def finish():
                for buf, (_, region) in zip(recv_bufs, self.recvs):
                    dst[region] = buf

            pending.finish = finish
        else:
            raise ValueError(f"unknown collective '{k}'")
        return pending


REDUCING = ("all_reduce", "reduce_scatter")
MOVING = ("all_gather", "all_to_all", "transfer")


