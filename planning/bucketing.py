"""Gradient buckets, as sbp-bucket-collectives chooses them: when each
value of a graph is ready (its ops priced with the cluster's figures, in the
list schedule's order), and the dynamic program that cuts the ready
gradients of a group into buckets so the last one's collective ends
soonest. The pass only rewrites what this chooses."""

from __future__ import annotations

import functools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import cast

from xdsl.ir import Operation, SSAValue
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg, sbp
from sbpc.dialects.pieces import rank_group
from sbpc.dialects.sbp import (
    DTensorType,
    Mesh,
    element_bytes,
    lookup_placement,
    nd_to_plain,
)
from sbpc.perf.cluster import Cluster, ClusterError, load_cluster
from sbpc.planning.cost_model import ALIASES, local_fraction

from .list_schedule import schedule

BUCKET_KINDS = (sbp.AllReduceOp, sbp.ReduceScatterOp)
"""The collectives that join buckets: gradient reductions."""

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


def distributed_type(value: SSAValue) -> DTensorType:
    t = value.type
    if not isinstance(t, DTensorType):
        raise PassFailedException(
            f"sbp-bucket-collectives: '{value.owner.name if isinstance(value.owner, Operation) else 'argument'}' "
            "has an undistributed value; run sbp-infer and sbp-insert-boxing first"
        )
    return t


def local_bytes(t: DTensorType, mesh: Mesh) -> float:
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
        out = distributed_type(op.results[0])
        mesh = self.mesh(op, out)
        kind = pricing_kind(type(op))
        if kind in (COMMUNICATES, COPIES):
            assert isinstance(op, sbp.CollectiveOp | sbp.TransferOp)
            if kind == COPIES:  # a local slice or make_partial: a copy
                return self.cluster.work_time("", 0.0, local_bytes(out, mesh))
            volume = op.bytes.value.data if op.bytes is not None else local_bytes(out, mesh)
            axes = list(op.mesh_axes.get_values()) if isinstance(op, sbp.CollectiveOp) else list(range(len(mesh.shape)))
            return self.collective_time(op.name.removeprefix("sbp."), mesh, axes, volume)
        if kind != COMPUTES:
            return 0.0
        op = cast(lg.LgOp, op)  # (what pricing_kind decided)
        # An lg op's time reads its class, properties and types alone: ops
        # alike (repeated layers) are priced once. The entry holds the types
        # it was keyed by (their ids), so no id is reused while it lives.
        params = op.params()
        operand_types = tuple(distributed_type(o) for o in op.operands)
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
        nbytes = local_bytes(out, mesh) + sum(local_bytes(t, mesh) for t in operand_types)
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
    for op in schedule(ops, stream_per_group=timing.cluster.device.stream_per_group):
        # an operand made outside `ops` (a block argument) is ready at 0
        inputs = max([ready.get(id(o.owner), 0.0) for o in op.operands], default=0.0)
        t = timing.op_time(op)
        if pricing_kind(type(op)) == COMMUNICATES:
            comm = max(comm, inputs) + t
            ready[id(op)] = comm
        else:
            compute = max(compute, inputs) + t
            ready[id(op)] = compute
    return ready


COMMUNICATES, COPIES, COMPUTES, OTHER = range(4)


@functools.cache
def pricing_kind(op_class: type[Operation]) -> int:
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
def is_bucket_reduction(op_class: type[Operation]) -> bool:
    """One of BUCKET_KINDS, once per class (ABCs: isinstance was slow per op)."""
    return issubclass(op_class, BUCKET_KINDS)


@dataclass(frozen=True)
class Member:
    op: sbp.CollectiveOp
    ready: float
    volume: float
    """Bytes a device receives in the collective (its `bytes`, else estimated)."""


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


def received_bytes(c: sbp.CollectiveOp, timing: Timing) -> float:
    """The bytes a device receives in collective `c` (recorded by boxing, else estimated)."""
    if c.bytes is not None:
        return c.bytes.value.data
    t = distributed_type(c.input)
    return local_bytes(t, timing.mesh(c, t))
