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
DDP's bucket_cap_mb does.

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
from dataclasses import dataclass, field
from typing import TypeVar, cast

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
    element_bytes,
    lookup_placement,
    nd_to_plain,
    signature_of,
)
from sbpc.perf.cluster import Cluster, ClusterError, load_cluster
from sbpc.planning.cost_model import ALIASES, DEFAULT_DEVICE, device_for, local_fraction

from .sbp_to_plan import rank_group, schedule

BUCKET_KINDS = (sbp.AllReduceOp, sbp.ReduceScatterOp)
BUCKET_ATTR = "sbp.bucket"
WINDOW = 128
"""The most gradients one bucket may join: bounds the dynamic program's
work (n * WINDOW * frontier) on graphs with thousands of gradients."""
FRONTIER = (8, 64)
"""The fewest and the most cuts the dynamic program keeps per prefix
(see choose_buckets): as many as FRONTIER_WORK allows between the two."""
FRONTIER_WORK = 2**18
"""Cuts the dynamic program may weigh in all (n * min(n, WINDOW) * frontier),
about a quarter of a second: a group of tens of gradients (a GPT's data-parallel
all-reduces) keeps 64 per prefix, one of hundreds the fewest. On 700
random instances of 20-80 gradients, 64 lost at most 5.4% (once) and
0.02% on average against the exact frontier; 8 lost up to 9.9% and 0.17%
on average."""


def pricing_cluster(spec: str, devices: int) -> Cluster:
    """The cluster whose figures price the buckets: a preset or cluster
    file as sbp-infer's `device` names it (`cuda`: the H100 preset)."""
    try:
        return load_cluster(ALIASES.get(spec, spec), max(devices, 1))
    except ClusterError as e:
        raise ValueError(str(e)) from None


# --------------------------------------------------------------------------
# When each value is ready: a list schedule priced with the cluster
# --------------------------------------------------------------------------


def _dtensor(value: SSAValue) -> DTensorType:
    t = value.type
    if not isinstance(t, DTensorType):
        raise PassFailedException(
            f"sbp-bucket-collectives: '{value.owner.name if isinstance(value.owner, Operation) else 'argument'}' "
            "has an undistributed value; run sbp-infer and sbp-insert-boxing first"
        )
    return t


def _local_bytes(t: DTensorType, mesh: Mesh) -> float:
    return math.prod(t.get_shape()) * element_bytes(t.element_type) * local_fraction(
        nd_to_plain(t.nd_sbp), mesh.shape, t.get_shape())


@dataclass
class Timing:
    """Estimated seconds at which each op's result is ready on one device
    of its placement, under the order sbp-to-plan will schedule."""

    cluster: Cluster
    meshes: dict[str, Mesh]
    groups: dict[tuple[str, tuple[int, ...]], list[int]] = field(default_factory=dict)
    """The rank group of each (placement, mesh axes) priced so far."""
    lg_times: dict[tuple, tuple[float, DTensorType, tuple[DTensorType, ...]]] = field(default_factory=dict)
    """(op class, id of its result type, ids of its operand types, its
    properties) -> (its time, the types)."""

    def mesh(self, op: Operation, t: DTensorType) -> Mesh:
        name = t.placement_name
        if name not in self.meshes:
            self.meshes[name] = lookup_placement(op, t.placement).mesh()
        return self.meshes[name]

    def collective_time(self, kind: str, mesh: Mesh, axes: Sequence[int], nbytes: float) -> float:
        key = (mesh.name, tuple(axes))
        if key not in self.groups:
            self.groups[key] = rank_group(mesh, mesh.ranks[0], list(axes))
        return self.cluster.collective_time(kind, self.groups[key], nbytes) + self.cluster.device.actor_overhead

    def op_time(self, op: Operation) -> float:
        if not op.results or not isinstance(op.results[0].type, DTensorType):
            return 0.0
        out = _dtensor(op.results[0])
        mesh = self.mesh(op, out)
        kind = _kind(type(op))
        if kind in (COMMUNICATES, COPIES):
            assert isinstance(op, sbp.CollectiveOp | sbp.TransferOp)
            if kind == COPIES:  # a local slice or make_partial: a copy
                return self.cluster.work_time("", 0.0, _local_bytes(out, mesh))
            volume = op.bytes.value.data if op.bytes is not None else _local_bytes(out, mesh)
            axes = list(op.mesh_axes.get_values()) if isinstance(op, sbp.CollectiveOp) else list(range(len(mesh.shape)))
            return self.collective_time(op.name.removeprefix("sbp."), mesh, axes, volume)
        if kind != COMPUTES:
            return 0.0
        op = cast(lg.LgOp, op)  # (what _kind decided)
        # An lg op's time reads its class, properties and types alone: ops
        # alike (repeated layers) are priced once. The entry holds the types
        # it was keyed by (their ids), so no id is reused while it lives.
        params = op.params()
        operand_types = tuple(_dtensor(o) for o in op.operands)
        try:
            key = (type(op), id(out), tuple(map(id, operand_types)), tuple(sorted(params.items())))
            alike = self.lg_times.get(key)
        except TypeError:  # a property without a hash
            key, alike = None, None
        if alike is not None:
            return alike[0]
        shapes = [tuple(t.get_shape()) for t in operand_types]
        flops = type(op).flops(shapes, tuple(out.get_shape()), **params)
        fraction = local_fraction(nd_to_plain(out.nd_sbp), mesh.shape, out.get_shape())
        nbytes = _local_bytes(out, mesh) + sum(_local_bytes(t, mesh) for t in operand_types)
        time = self.cluster.work_time(op.name, flops * fraction, nbytes)
        if key is not None:
            self.lg_times[key] = (time, out, operand_types)
        return time


def ready_times(ops: list[Operation], timing: Timing) -> dict[int, float]:
    """When each op's result is ready, by the op's id (ops hash in Python,
    ints in C): compute runs one op at a time in sbp-to-plan's order;
    communication runs one collective at a time beside it, from when its
    input is ready."""
    ready: dict[int, float] = {}
    compute = comm = 0.0
    for op in schedule(ops):
        # an operand made outside `ops` (a block argument) is ready at 0
        inputs = max([ready.get(id(o.owner), 0.0) for o in op.operands], default=0.0)
        t = timing.op_time(op)
        if _kind(type(op)) == COMMUNICATES:
            comm = max(comm, inputs) + t
            ready[id(op)] = comm
        else:
            compute = max(compute, inputs) + t
            ready[id(op)] = compute
    return ready


COMMUNICATES, COPIES, COMPUTES, OTHER = range(4)


@functools.cache
def _kind(op_class: type[Operation]) -> int:
    """How ready_times prices an op of this class, decided once per class
    (op classes are ABCs: isinstance against them was slow per op): a
    collective that communicates or a transfer, a collective that only
    copies locally (a slice, make_partial), an lg op, or nothing."""
    if sbp.is_collective(op_class):
        return COMMUNICATES if sbp.communicates(op_class) else COPIES
    if issubclass(op_class, lg.LgOp):
        return COMPUTES
    return OTHER


@functools.cache
def _is_reduction(op_class: type[Operation]) -> bool:
    """One of BUCKET_KINDS, once per class (ABCs: isinstance was slow per op)."""
    return issubclass(op_class, BUCKET_KINDS)


# --------------------------------------------------------------------------
# Candidates and groups
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class Member:
    op: sbp.CollectiveOp
    ready: float
    volume: float
    """Bytes a device receives in the collective (its `bytes`, else estimated)."""


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
            if any(id(user) in reaches or _is_reduction(type(user)) for user in users):
                reaches.add(id(op))
                break
    return {op for op in ops if id(op) in reaches}


def _group_key(op: sbp.CollectiveOp, mesh: Mesh) -> tuple | None:
    """The bucket group of a candidate collective, or None where it cannot
    join a bucket."""
    src, dst = _dtensor(op.input), _dtensor(op.result)
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
# The buckets: a dynamic program over the ready order
# --------------------------------------------------------------------------


def fixed_buckets(members: Sequence[Member], size: float) -> list[tuple[int, int]]:
    """Buckets of `size` bytes in ready order (PyTorch DDP's rule): each
    closes once it holds at least `size`."""
    buckets, start, held = [], 0, 0.0
    for j, m in enumerate(members):
        held += m.volume
        if held >= size:
            buckets.append((start, j + 1))
            start, held = j + 1, 0.0
    if start < len(members):
        buckets.append((start, len(members)))
    return buckets


def bucket_finish(buckets: Sequence[tuple[int, int]], members: Sequence[Member], comm_time, pack_time, unpack_time,
                  host_share: float = 0.0) -> float:
    """When the last collective of `buckets` ends and is unpacked (the
    model choose_buckets minimizes; see there)."""
    end = delay = 0.0
    for i, j in buckets:
        comm = comm_time(sum(m.volume for m in members[i:j]))
        packed = delay + pack_time(i, j)
        end = max(end, members[j - 1].ready + packed) + comm
        delay = packed + host_share * comm + unpack_time(i, j)
    return end + (unpack_time(*buckets[-1]) if buckets else 0.0)


def choose_buckets(members: Sequence[Member], comm_time, pack_time, unpack_time, host_share: float = 0.0,
                   frontier_size: int | None = None) -> list[tuple[int, int]]:
    """Cuts `members` (in ready order) into contiguous buckets [i, j)
    minimizing when the last bucket's collective has ended and its results
    are unpacked. A bucket is issued when the collective before it is done
    and its last member is ready and packed; `comm_time(bytes)`,
    `pack_time(i, j)` and `unpack_time(i, j)` price it (a bucket of one
    packs nothing). Packing, unpacking and the `host_share` of each
    collective that the device's own cores spend on it (MPI on shared
    memory: 1 - comm_overlap) run on the compute stream, so they delay the
    gradients still to come.

    A dynamic program over prefixes: what a later bucket needs of a prefix
    is when its last collective ends and how much it delayed the compute
    stream, and it only gains from less of either; each prefix keeps the
    cuts that no other beats on both (up to `frontier_size` of them; by
    default as many as FRONTIER_WORK allows within FRONTIER), which is
    exact while no frontier is cut short."""
    n = len(members)
    if frontier_size is None:
        fewest, most = FRONTIER
        frontier_size = max(fewest, min(most, FRONTIER_WORK // max(1, n * min(n, WINDOW))))
    volume = [0.0]
    for m in members:
        volume.append(volume[-1] + m.volume)
    # per prefix: (end, delay, previous prefix, index of its state there)
    states: list[list[tuple[float, float, int, int]]] = [[(0.0, 0.0, -1, -1)]]
    for j in range(1, n + 1):
        # The next bucket goes out no sooner than its members are ready and
        # packed after this prefix's delay: an end before that is as good
        # as that moment (exact, and it lets more cuts dominate others).
        soonest = members[j].ready if j < n else -math.inf
        ready = members[j - 1].ready
        options: list[tuple[float, float, float, int, int]] = []
        append = options.append
        # the same arithmetic, in the same order, as written out in
        # bucket_finish; `b if b > a else a` is max(a, b), without the call
        for i in range(max(0, j - WINDOW), j):
            comm = comm_time(volume[j] - volume[i])
            pack, unpack = pack_time(i, j), unpack_time(i, j)
            last_unpack = unpack if j == n else 0.0
            host_comm = host_share * comm
            for k, (end, delay, _, _) in enumerate(states[i]):
                packed = delay + pack
                start = ready + packed
                finish = (start if start > end else end) + comm + last_unpack
                after = packed + host_comm + unpack
                due = soonest + after
                append((due if due > finish else finish, after, finish, i, k))
        options.sort()  # among equals, the earliest actual end (results sooner)
        frontier: list[tuple[float, float, int, int]] = []
        least = math.inf
        for _, after, finish, i, k in options:
            if after < least:
                least = after
                frontier.append((finish, after, i, k))
        if len(frontier) > frontier_size:
            # both ends (the earliest end, the least delay) and evenly
            # between: keeping only the earliest ends lost up to 6% on
            # instances of 5-8 gradients (the cuts that delay the compute
            # stream least were dropped)
            last = len(frontier) - 1
            frontier = [frontier[round(k * last / (frontier_size - 1))] for k in range(frontier_size)]
        states.append(frontier)
    buckets = []
    j, k = n, 0
    while j:
        _, _, i, k = states[j][k]
        buckets.append((i, j))
        j = i
    return buckets[::-1]


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
    src, dst = _dtensor(first.input), _dtensor(first.result)
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
        t = _dtensor(m.input)
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
        shape = _dtensor(m.result).get_shape()
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
        candidates = [o for o in ops if _is_reduction(type(o)) and o not in reaches]
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
            key = _group_key(c, timing.mesh(c, _dtensor(c.input)))
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
                                     _volume(c, timing)) for c in group),
                             key=lambda m: (m.ready, position[m.op]))
            for i, j in self.cut(members, timing):
                if j - i < 2:
                    continue
                chosen = [m.op for m in members[i:j]]
                new = rewrite_bucket(chosen, timing.mesh(chosen[0], _dtensor(chosen[0].input)), count)
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
        mesh = timing.mesh(first, _dtensor(first.input))
        axes = list(first.mesh_axes.get_values())
        kind = first.name.removeprefix("sbp.")
        cluster = timing.cluster
        held = [0.0]  # bytes each device holds of the first k members
        for m in members:
            held.append(held[-1] + _local_bytes(_dtensor(m.op.input), mesh))

        # alpha-beta: linear in the bytes (Cluster.collective_time)
        alpha = timing.collective_time(kind, mesh, axes, 0.0)
        beta = (timing.collective_time(kind, mesh, axes, 1e9) - alpha) / 1e9
        per_slice = cluster.work_time("lg.slice", 0.0, 0.0)

        def comm_time(nbytes: float) -> float:
            return alpha + beta * nbytes

        # The dynamic program prices every bucket of up to WINDOW members;
        # gradients of repeated layers have equal sizes, so most buckets'
        # byte counts recur (exact: whole bytes): each is priced once.
        concat_time = functools.cache(lambda nbytes: cluster.work_time("lg.concat", 0.0, nbytes))
        slice_time = functools.cache(lambda nbytes: cluster.core_time("lg.slice", 0.0, nbytes))

        def pack_time(i: int, j: int) -> float:  # one concat reads and writes the bucket
            return 0.0 if j - i == 1 else concat_time(2 * (held[j] - held[i]))

        def unpack_time(i: int, j: int) -> float:  # one slice per member
            if j - i == 1:
                return 0.0
            return (j - i) * per_slice + slice_time(2 * (held[j] - held[i]))

        return choose_buckets(members, comm_time, pack_time, unpack_time,
                              host_share=1.0 - cluster.device.comm_overlap)


def _volume(c: sbp.CollectiveOp, timing: Timing) -> float:
    """The bytes a device receives in collective `c` (recorded by boxing, else estimated)."""
    if c.bytes is not None:
        return c.bytes.value.data
    t = _dtensor(c.input)
    return _local_bytes(t, timing.mesh(c, t))
