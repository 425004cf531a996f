"""The boxing planner: the cheapest sequence of single collective steps that
turns one nd-SBP into another on one mesh (Dijkstra over nd-SBP states, as
DTensor's min-cost redistribute planner).

A step acts on one mesh axis of p devices:

    P -> B        all_reduce        2(p-1)/p of the piece
    P -> S<i>     reduce_scatter    (p-1)/p
    S<i> -> B     all_gather        (p-1)/p of the result piece
    S<i> -> S<j>  all_to_all        (p-1)/p^2 of the group's tensor
    B -> S<i>     slice             local
    B, S<i> -> P  make_partial      local

and, for rows grouped by expert (G: a split of the rows whose boundaries
the group ends give at run time) and rows gathered by an index (I: each
row owned by the holder of the table row it was gathered from), G or I ->
B (all_gather), P -> G (reduce_scatter) and S<0> or I <-> G (all_to_all)
move what their even counterparts move when the load is even; B -> G or I
and G or I -> P are local. A plan passes through G or I only where its
source or destination is one: elsewhere no ends or index say whose rows
are whose.

(P<max> reduces by max the same way.) Pieces nest outer mesh axis first, so
a step may add or remove a split of tensor axis k only while no inner mesh
axis splits k: (S0, S0) -> (B, B) gathers the inner axis first. Among plans
of equal communication the planner takes the one with the smallest peak
piece (shrink before growing, as Shardy's reshard lowering does).
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from sbpc.dialects.pieces import coords, piece, staged_elements
from sbpc.dialects.sbp import COLLECTIVES, PlainNd, Sbp, hierarchy_violation, step_collective
from sbpc.perf.cluster import Rates

from .cost_model import axis_volume, local_fraction


def step_kind(src: Sbp, dst: Sbp) -> str | None:
    """The collective that changes one mesh axis from `src` to `dst`, if one does."""
    collective = step_collective(src, dst)
    return None if collective is None else collective.kind


@dataclass(frozen=True)
class Step:
    kind: str
    mesh_axis: int
    src: PlainNd
    dst: PlainNd


def _targets(current: Sbp, rank: int, owned: tuple[Sbp, ...]) -> list[Sbp]:
    options = [Sbp.B, Sbp.P, Sbp.PMAX, *(Sbp.S(i) for i in range(rank))]
    if rank:
        options += owned
    return [t for t in options if t != current and step_kind(current, t) is not None]


def _owned(s: Sbp) -> bool:
    return s.is_grouped or s.is_indexed


def grouping_ok(nd: PlainNd) -> bool:
    """Rows grouped by expert (G) or gathered by an index (I) lie on at most
    one mesh axis, and no other mesh axis splits the rows (NdSbpAttr's rule)."""
    owned = sum(_owned(s) for s in nd)
    return not owned or (owned == 1 and Sbp.S(0) not in nd)


class _Steps:
    """The steps out of each nd-SBP state on one mesh, for tensors of one
    rank, each with its volume and the peak piece it reaches, made the first
    time a search reaches the state and kept: they depend on the state
    alone, not on where a search started, and making them (which collective,
    the nesting rule, the volume) was nine tenths of a search. sbp-infer on
    the random graphs of 2x2x2 meshes searched from 381 sources, 32 of the
    39 s it took."""

    __slots__ = ("mesh", "rank", "owned", "out")

    def __init__(self, mesh: tuple[int, ...], rank: int, owned: tuple[Sbp, ...]):
        self.mesh, self.rank, self.owned = mesh, rank, owned
        self.out: dict[PlainNd, list[tuple[PlainNd, Step, float, float]]] = {}

    def of(self, state: PlainNd) -> list[tuple[PlainNd, Step, float, float]]:
        steps = self.out.get(state)
        if steps is None:
            steps = self.out[state] = []
            mesh, owned = self.mesh, self.owned
            for a, current in enumerate(state):
                for target in _targets(current, self.rank, owned):
                    nxt = (*state[:a], target, *state[a + 1 :])
                    if (Sbp.P in nxt and Sbp.PMAX in nxt) or hierarchy_violation(state, nxt, [a]) is not None:
                        continue
                    if owned and not grouping_ok(nxt):
                        continue
                    kind = step_kind(current, target)
                    assert kind is not None  # _targets yields only targets one collective reaches
                    step = Step(kind, a, state, nxt)
                    steps.append((nxt, step, step_units(step, mesh), local_fraction(nxt, mesh)))
        return steps


@lru_cache(maxsize=64)
def _steps(mesh: tuple[int, ...], rank: int, owned: tuple[Sbp, ...]) -> _Steps:
    return _Steps(mesh, rank, owned)


@lru_cache(maxsize=4096)
def _search(src: PlainNd, mesh: tuple[int, ...], rank: int, owned: tuple[Sbp, ...] = ()):
    """Dijkstra from `src` over every reachable state: the best (volume,
    peak) label of each state and the step that reaches it. One search
    serves every destination (sbp-infer asks for many). `owned`: the
    distributions of rows owned at run time (G, I<n>) reachable too."""
    steps_of = _steps(mesh, rank, owned).of
    start = (0.0, local_fraction(src, mesh), 0)
    best: dict[PlainNd, tuple[float, float, int]] = {src: start}
    previous: dict[PlainNd, tuple[PlainNd, Step]] = {}
    queue: list[tuple[float, float, int, PlainNd]] = [(*start, src)]
    counter = 0
    while queue:
        volume, peak, _, state = heapq.heappop(queue)
        if (volume, peak) > best[state][:2]:
            continue
        for nxt, step, units, nxt_peak in steps_of(state):
            label = (volume + units, max(peak, nxt_peak))
            known = best.get(nxt)
            if known is None or label < known[:2]:
                counter += 1
                best[nxt] = (*label, counter)
                previous[nxt] = (state, step)
                heapq.heappush(queue, (*label, counter, nxt))
    return best, previous


@lru_cache(maxsize=65536)
def plan(src: PlainNd, dst: PlainNd, mesh: tuple[int, ...], rank: int) -> tuple[tuple[Step, ...], float]:
    """The cheapest steps from `src` to `dst` (volume in units of the global
    tensor), or raises ValueError if `dst` cannot be reached."""
    if src == dst:
        return (), 0.0
    best, previous = _search(src, mesh, rank, tuple(sorted({s for s in (*src, *dst) if _owned(s)})))
    if dst not in best:
        raise ValueError(f"no boxing from {src} to {dst} on mesh {list(mesh)}")
    steps = []
    state = dst
    while state != src:
        state, step = previous[state]
        steps.append(step)
    return tuple(reversed(steps)), best[dst][0]


def step_units(step: Step, mesh: Sequence[int]) -> float:
    """The share of the global tensor one device sends in `step`: its mesh
    axis's volume, over the other mesh axes that split the tensor (the
    same before and after the step, which changes only its axis)."""
    a = step.mesh_axis
    units, _ = axis_volume(step.src[a], step.dst[a], mesh[a])
    return units / math.prod(mesh[b] for b in range(len(mesh)) if b != a and step.src[b].is_split)


def joins_a_bucket(step: Step, mesh: Sequence[int]) -> bool:
    """Whether sbp-bucket-collectives can join `step`, done on a gradient,
    into a bucket: an all_reduce, or a reduce_scatter to rows (S(0)), over a
    mesh axis of more than one device that no other axis splits (its piece
    is the flat whole). The bucket also needs the rows to divide evenly,
    which the cost model, knowing only the tensor's bytes, does not check."""
    a = step.mesh_axis
    if mesh[a] == 1 or any(step.src[b] != Sbp.B or step.dst[b] != Sbp.B for b in range(len(mesh)) if b != a):
        return False
    return step.kind == "all_reduce" or (step.kind == "reduce_scatter" and step.dst[a] == Sbp.S(0))


@lru_cache(maxsize=4096)
def staged_shares(step: Step, mesh: tuple[int, ...], rank: int) -> tuple[float, float]:
    """The shares of the global tensor one device copies around a collective
    besides what MPI moves: packed before the call, unpacked after it, by
    the runtime's own rule (pieces.staged_elements, which the simulator
    charges too) on a tensor of `rank` axes that every mesh axis splits
    evenly. (Such a tensor's leading axes have several elements: where a
    real one's have one, a split of a later axis lies in order and copies
    nothing, which the shape-free cost model does not know.) Rows grouped
    or gathered by an index (G, I) have no pieces before run time: nothing
    is charged for them, as before."""
    if any(s.is_grouped or s.is_indexed for s in (*step.src, *step.dst)):
        return 0.0, 0.0
    shape = (2 * math.prod(mesh),) * rank
    points = coords(mesh)
    src = {i: piece(shape, step.src, mesh, c) for i, c in enumerate(points)}
    dst = {i: piece(shape, step.dst, mesh, c) for i, c in enumerate(points)}
    a = step.mesh_axis
    group = [i for i, c in enumerate(points) if all(x == 0 for b, x in enumerate(c) if b != a)]
    packed, unpacked = staged_elements(step.kind, src, dst, group, 0)
    whole = math.prod(shape)
    return packed / whole, unpacked / whole


@lru_cache(maxsize=65536)
def _priced_steps(src: PlainNd, dst: PlainNd, mesh: tuple[int, ...], rank: int) -> tuple[tuple, ...]:
    """The best plan's steps with what their price reads that does not
    depend on the tensor's bytes: (kind, mesh axis, communicates, share
    sent, share of the result piece, share of the source piece, shares
    packed and unpacked, joins a bucket). sbp-infer prices each pair of
    distributions at many sizes."""
    steps, _ = plan(src, dst, mesh, rank)
    out = []
    for s in steps:
        communicates = COLLECTIVES[s.kind].communicates
        packed, unpacked = staged_shares(s, mesh, rank) if communicates else (0.0, 0.0)
        out.append((s.kind, s.mesh_axis, communicates, step_units(s, mesh), local_fraction(s.dst, mesh),
                    local_fraction(s.src, mesh), packed, unpacked, communicates and joins_a_bucket(s, mesh)))
    return tuple(out)


def boxing_cost(src: PlainNd, dst: PlainNd, mesh: Sequence[int], rank: int, nbytes: float, device: Rates,
                groups: Sequence[Sequence[int]], members: int = 1) -> float:
    """Seconds the best plan takes under the cost model (what sbp-infer
    charges), each step priced as the step-time simulator prices the actor
    it becomes: the executor's overhead, and a collective of its kind over
    the ranks of its mesh axis (`groups[axis]`) moving its share of the
    `nbytes` tensor into its piece (`Rates.collective_time`), or for a
    local step (a slice, a partial's zeros) the copy of the piece it writes.
    `members` > 1: the tensor is a gradient, and a reduction that can join
    a bucket is priced as one of that many members of one
    (`Rates.bucket_member_time`)."""
    total = 0.0
    for kind, axis, communicates, units, dst_share, src_share, packed, unpacked, joins in _priced_steps(
            tuple(src), tuple(dst), tuple(mesh), rank):
        piece = dst_share * nbytes
        if communicates:
            alone = device.collective_time(kind, groups[axis], units * nbytes, piece) + device.actor_overhead
            alone += ((device.copy_time(packed * nbytes) if packed else 0.0)
                      + (device.copy_time(unpacked * nbytes) if unpacked else 0.0))
            if members > 1 and joins:
                # sbp-bucket-collectives joins a reduction into a bucket where
                # that pays, and leaves it alone where the bucket's copies
                # cost more than the call it saves (a 4 MiB gradient: 827
                # us as a member, 477 alone)
                alone = min(alone, device.bucket_member_time(
                    kind, groups[axis], units * nbytes, src_share * nbytes, piece, members))
            total += alone
        else:
            total += device.copy_time(piece) + device.actor_overhead
    return total
