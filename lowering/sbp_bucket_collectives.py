"""`sbp-bucket-collectives{device=cpu bucket_bytes=0}`: gradient bucketing as a
compiler decision.

A data-parallel step ends with one collective per gradient: an all_reduce
(P -> B) per weight, or a reduce_scatter (P -> S(0)) under ZeRO and FSDP.
Each pays a fixed latency, and on the MPI runtime a fixed cost to issue and
progress, so many small ones cost more than a few large ones; but one
collective for every gradient would wait for the last gradient before it
could start, and nothing would overlap the backward pass. PyTorch DDP
buckets gradients in a fixed 25 MB; this pass chooses the buckets from the
cost model instead.

Candidates: all_reduce and reduce_scatter ops whose result reaches no other
reduction (a gradient's, read by its update, the gather of the updated
parameter under ZeRO, and the outputs; never one on the critical path, as
tensor parallelism's), over the other mesh axes replicated (B). They are grouped
by kind, placement, mesh axes, nd-SBPs and element type, and each group is
ordered by the moment its input is ready in the schedule sbp-to-plan will
follow (a list schedule priced with the cluster's compute rates). A dynamic
program over that order then cuts the group into contiguous buckets
minimizing when the last collective ends: a bucket is issued when its last
gradient is ready and packed, and when the previous collective is done, and
takes the cluster's alpha-beta time (`Cluster.collective_time`). A bucket of
one stays as it was (no copies). `bucket_bytes` fixes the size instead, as
DDP's bucket_cap_mb does. The timing and the dynamic program are
planning/bucketing.py's; this pass groups the candidates and rewrites.

A bucket is plain sbp IR, so every later pass, the interpreters, the simulator and the
runtime need nothing new:

    all_reduce:      g_i (P) --reshape--> [n_i] --concat axis 0--> [N] (P)
                     --sbp.all_reduce--> [N] (B) --slice, reshape--> g_i's shape (B)
    reduce_scatter:  g_i (P) --reshape--> [p, n_i/p] --concat axis 1--> [p, N/p] (P)
                     --sbp.reduce_scatter--> S(0) --slice axis 1, reshape--> g_i's shape, S(0)

Folding a gradient into p rows keeps its S(0) piece one row (so the
gradient's first axis must divide by p; others stay unbucketed). The
concatenation is the fused register the collective reads and writes in the
plan (`bucket.<k>` in the value names); `sbp-comm-summary` counts one
collective per bucket. Each bucket records `sbp.bucket = [members]`.
"""

from __future__ import annotations

import functools
import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TypeVar

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, ModuleOp, StringAttr
from xdsl.ir import Block, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg, sbp
from sbpc.dialects.sbp import (
    SIGNATURE_ATTR,
    DTensorType,
    Mesh,
    PlainNd,
    Sbp,
    dtensor_of,
    lookup_placement,
    nd_to_plain,
    signature_of,
)
from sbpc.planning.bucketing import (
    Member,
    Timing,
    choose_buckets,
    distributed_type,
    fixed_buckets,
    is_bucket_reduction,
    local_bytes,
    pricing_cluster,
    ready_times,
    received_bytes,
)
from sbpc.planning.cost_model import DEFAULT_DEVICE, device_for

BUCKET_ATTR = "sbp.bucket"


# --------------------------------------------------------------------------
# Candidates and groups
# --------------------------------------------------------------------------


def _reaches_reduction(ops: list[Operation]) -> set[Operation]:
    """Ops whose result flows (through any ops) into an all_reduce or a
    reduce_scatter: a reduction that waits for another is on the step's
    critical path (tensor parallelism's forward and backward), unlike a
    gradient's, which only its update, a parameter gather (ZeRO) and the
    outputs wait for."""
    reaches: set[int] = set()  # by id: ops hash in Python, ints in C
    for op in reversed(ops):
        for result in op.results:
            users: list[Operation] = [use.operation for use in result.uses]
            if any(id(user) in reaches or is_bucket_reduction(type(user)) for user in users):
                reaches.add(id(op))
                break
    return {op for op in ops if id(op) in reaches}


def _group_key(op: sbp.CollectiveOp, mesh: Mesh) -> tuple | None:
    """The bucket group of a candidate collective, or None where it cannot
    join a bucket."""
    src, dst = distributed_type(op.input), distributed_type(op.result)
    src_nd, dst_nd = nd_to_plain(src.nd_sbp), nd_to_plain(dst.nd_sbp)
    axes = list(op.mesh_axes.get_values())
    shape = src.get_shape()
    if any(src_nd[a] != Sbp.B or dst_nd[a] != Sbp.B for a in range(len(mesh.shape)) if a not in axes):
        return None  # another mesh axis splits it: its local piece is not the flat whole
    if not shape or not math.prod(shape):
        return None
    if math.prod(mesh.shape[a] for a in axes) == 1:
        return None  # a group of one device: nothing moves, a bucket would only copy
    if isinstance(op, sbp.ReduceScatterOp) and (
            len(axes) != 1 or dst_nd[axes[0]] != Sbp.S(0) or shape[0] % mesh.shape[axes[0]]):
        return None  # its S(0) piece is not one row of p
    return (op.name, src.placement_name, tuple(axes), src_nd, dst_nd, str(src.element_type))


# --------------------------------------------------------------------------
# The rewrite
# --------------------------------------------------------------------------


_Op = TypeVar("_Op", bound=lg.LgOp)


def _typed(op: _Op, ins: Sequence[PlainNd], out_shape: Sequence[int], out_nd: PlainNd, like: DTensorType) -> _Op:
    Rewriter.replace_value_with_new_type(
        op.results[0], dtensor_of(tuple(out_shape), like.element_type, like.placement_name, out_nd))
    op.attributes[SIGNATURE_ATTR] = signature_of(ins, [out_nd])
    return op


def rewrite_bucket(members: Sequence[sbp.CollectiveOp], mesh: Mesh, index: int) -> list[Operation]:
    """The ops of one bucket (see the module docstring), in order, not yet
    in the block; the members' results are replaced by its slices (the
    caller inserts the ops and erases the members)."""
    first = members[0]
    src, dst = distributed_type(first.input), distributed_type(first.result)
    src_nd, dst_nd = nd_to_plain(src.nd_sbp), nd_to_plain(dst.nd_sbp)
    axes = list(first.mesh_axes.get_values())
    scatter = isinstance(first, sbp.ReduceScatterOp)
    rows = mesh.shape[axes[0]] if scatter else 1
    new: list[Operation] = []

    def folded(n: int) -> tuple[int, ...]:
        return (rows, n // rows) if scatter else (n,)

    flats: list[SSAValue] = []
    sizes: list[int] = []
    for m in members:
        t = distributed_type(m.input)
        n = math.prod(t.get_shape())
        sizes.append(n)
        value: SSAValue = m.input
        if tuple(t.get_shape()) != folded(n):
            reshape = _typed(lg.ReshapeOp(value, folded(n)), [src_nd], folded(n), src_nd, src)
            new.append(reshape)
            value = reshape.result
            if m.input.name_hint:
                value.name_hint = f"{m.input.name_hint}.flat"
        flats.append(value)
    total = sum(sizes)
    concat = _typed(lg.ConcatOp(flats, 1 if scatter else 0), [src_nd] * len(flats), folded(total), src_nd, src)
    concat.result.name_hint = f"bucket.{index}.in"
    new.append(concat)
    volume = [m.bytes.value.data for m in members if m.bytes is not None]
    nbytes = sum(volume) if len(volume) == len(members) else None
    bucket_type = dtensor_of(folded(total), dst.element_type, dst.placement_name, dst_nd)
    collective = type(first)(concat.result, axes, bucket_type, bytes=nbytes)
    collective.attributes[BUCKET_ATTR] = ArrayAttr(
        [StringAttr(m.input.name_hint or f"#{i}") for i, m in enumerate(members)])
    collective.result.name_hint = f"bucket.{index}"
    new.append(collective)
    at = 0
    for i, (m, n) in enumerate(zip(members, sizes)):
        part = n // rows
        piece = folded(n)
        starts, limits = ([0, at], [rows, at + part]) if scatter else ([at], [at + n])
        at += part
        sliced = _typed(lg.SliceOp(collective.result, starts, limits), [dst_nd], piece, dst_nd, dst)
        new.append(sliced)
        value = sliced.result
        shape = distributed_type(m.result).get_shape()
        if tuple(shape) != piece:
            value.name_hint = f"bucket.{index}.{i}"
            back = _typed(lg.ReshapeOp(value, shape), [dst_nd], shape, dst_nd, dst)
            new.append(back)
            value = back.result
        value.name_hint = m.result.name_hint
        m.result.replace_all_uses_with(value)
    return new


def topological_order(block: Block) -> None:
    """Reorders `block` so every op follows its operands' producers, keeping
    the program order wherever it already does (the terminator stays last)."""
    ops: list[Operation] = list(iter(block.ops))  # (list(block.ops) would walk the block once more for its length)
    # by index, and ops by id: ops hash in Python, ints in C
    index: dict[int, int] = {id(op): i for i, op in enumerate(ops)}  # an owner may be a block: not here
    users: list[list[int]] = [[] for _ in ops]
    waiting = [0] * len(ops)
    for i, op in enumerate(ops):
        for producer in {index[id(o.owner)] for o in op.operands if id(o.owner) in index}:
            users[producer].append(i)
            waiting[i] += 1
    ready = [i for i in range(len(ops)) if not waiting[i]]
    heapq.heapify(ready)
    positions = []
    while ready:
        i = heapq.heappop(ready)
        positions.append(i)
        for user in users[i]:
            waiting[user] -= 1
            if not waiting[user]:
                heapq.heappush(ready, user)
    # Move only the ops out of place, not every op of the block: the ops
    # before `cursor` are the first of the order, and the next one is at
    # or after it.
    cursor = block.first_op
    for i in positions:
        op = ops[i]
        if op is cursor:
            cursor = op.next_op
        else:
            assert cursor is not None  # `op` comes after it
            block.detach_op(op)
            block.insert_op_before(op, cursor)


@dataclass(frozen=True)
class SbpBucketCollectivesPass(ModulePass):
    """Coalesces gradient collectives into buckets; see the module docstring."""

    name = "sbp-bucket-collectives"

    device: str = DEFAULT_DEVICE
    """The cluster whose figures price the buckets (as sbp-infer's `device`;
    left at `cpu`, a graph sbp-autoplan planned is priced for the cluster it
    was planned for)."""
    bucket_bytes: int = 0
    """0: the cost model chooses the buckets. Else a fixed size, as PyTorch
    DDP's bucket_cap_mb: in ready order, a bucket closes once it holds this
    many bytes (the collective's per-device volume)."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for graph in [o for o in op.walk() if isinstance(o, lg.GraphOp)]:
            self.bucket_graph(graph)

    def bucket_graph(self, graph: lg.GraphOp) -> None:
        block = graph.body.block
        ops: list[Operation] = list(iter(block.ops))  # (list(block.ops) would walk the block once more for its length)
        reaches = _reaches_reduction(ops)
        candidates = [o for o in ops if is_bucket_reduction(type(o)) and o not in reaches]
        if len(candidates) < 2:
            return
        meshes: dict[str, Mesh] = {}
        for o in ops:
            for r in o.results:
                if isinstance(r.type, DTensorType) and r.type.placement_name not in meshes:
                    meshes[r.type.placement_name] = lookup_placement(o, r.type.placement).mesh()
        devices = 1 + max((r for m in meshes.values() for r in m.ranks), default=0)
        try:
            cluster = pricing_cluster(device_for(graph, self.device), devices)
        except ValueError as e:
            raise PassFailedException(f"sbp-bucket-collectives: {e}") from None
        timing = Timing(cluster, meshes)
        groups: dict[tuple, list[sbp.CollectiveOp]] = {}
        for c in candidates:
            assert isinstance(c, sbp.CollectiveOp)
            key = _group_key(c, timing.mesh(c, distributed_type(c.input)))
            if key is not None:
                groups.setdefault(key, []).append(c)
        groups = {k: g for k, g in groups.items() if len(g) > 1}
        if not groups:
            return
        ready = ready_times(ops, timing)
        position = {o: i for i, o in enumerate(ops)}
        count = 0
        for group in groups.values():
            members = sorted((Member(c, ready.get(id(c.input.owner), 0.0),
                                     received_bytes(c, timing)) for c in group),
                             key=lambda m: (m.ready, position[m.op]))
            for i, j in self.cut(members, timing):
                if j - i < 2:
                    continue
                chosen = [m.op for m in members[i:j]]
                new = rewrite_bucket(chosen, timing.mesh(chosen[0], distributed_type(chosen[0].input)), count)
                block.insert_ops_after(new, max(chosen, key=lambda c: position[c]))
                for c in chosen:
                    block.erase_op(c)
                count += 1
        if count:
            topological_order(block)

    def cut(self, members: Sequence[Member], timing: Timing) -> list[tuple[int, int]]:
        """The buckets of one group, in ready order: a fixed size, or the
        cost model's choice (choose_buckets)."""
        if self.bucket_bytes:
            return fixed_buckets(members, self.bucket_bytes)
        first = members[0].op
        mesh = timing.mesh(first, distributed_type(first.input))
        axes = list(first.mesh_axes.get_values())
        kind = first.name.removeprefix("sbp.")
        cluster = timing.cluster
        held = [0.0]  # bytes each device holds of the first k members
        for m in members:
            held.append(held[-1] + local_bytes(distributed_type(m.op.input), mesh))

        # alpha-beta: linear in the bytes (Cluster.collective_time)
        alpha = timing.collective_time(kind, mesh, axes, 0.0)
        beta = (timing.collective_time(kind, mesh, axes, 1e9) - alpha) / 1e9

        def comm_time(nbytes: float) -> float:
            return alpha + beta * nbytes

        # The dynamic program prices every bucket of up to WINDOW members;
        # gradients of repeated layers have equal sizes, so most buckets'
        # byte counts recur (exact: whole bytes): each is priced once.
        packed = functools.cache(cluster.bucket_pack_time)
        unpacked = functools.cache(cluster.bucket_unpack_time)

        def pack_time(i: int, j: int) -> float:  # one concat reads and writes the bucket
            return 0.0 if j - i == 1 else packed(held[j] - held[i])

        def unpack_time(i: int, j: int) -> float:  # one slice per member
            return 0.0 if j - i == 1 else unpacked(j - i, held[j] - held[i])

        return choose_buckets(members, comm_time, pack_time, unpack_time,
                              host_share=1.0 - cluster.device.comm_overlap)


