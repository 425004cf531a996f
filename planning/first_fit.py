"""Placing buffers of known size and lifetime in one arena: first fit (each
buffer at the lowest offset free for its whole lifetime) in the best of a
few orders, largest first among them, and the live-set lower bound any
placement needs. plan-allocate-memory turns registers into these buffers
and writes the offsets back."""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field

ALIGNMENT = 64
"""Every buffer starts at a multiple of this many bytes (cache lines, and
more than any element type needs)."""

RANDOM_ORDERS = 64
"""Seeded random orders tried after the fixed ones on devices with at most
RANDOM_ORDER_LIMIT buffers, until one meets the lower bound (first fit is
quadratic, so large devices keep the fixed orders)."""
RANDOM_ORDER_LIMIT = 200

NEAR_BOUND = 1 / 1024
"""An arena within this fraction of the lower bound is kept as it is: other
orders could gain at most that much, and on a large training step (18k
buffers per device) each costs up to eight times the first (they leave more
gaps for first fit to pass over)."""


def aligned(n: int) -> int:
    return -(-n // ALIGNMENT) * ALIGNMENT


@dataclass
class Buffer:
    size: int
    start: int
    end: int
    """Lifetime [start, end] in schedule positions, inclusive."""
    registers: list[str] = field(default_factory=list)
    offset: int = -1


ORDERS = (
    lambda b: (-b.size, -(b.end - b.start), b.start),  # largest first
    lambda b: (-b.size * (b.end - b.start + 1), b.start),  # largest area first
    lambda b: (-(b.end - b.start), -b.size, b.start),  # longest-lived first
    lambda b: (b.start, -b.size),  # in schedule order
)
"""Placement orders tried; the smallest arena wins. Largest-first is the
classic heuristic; the others win on schedules where long-lived small
buffers or the order of births matter."""


SCAN_UP_TO = 256
"""Devices with at most this many buffers are placed by the pairwise scan,
the rest through the segment tree. Below it the scan is the faster: on the
buffers of the test suite's models (devices of 21-709 buffers, every order
place() tries), 0.05 against 0.28 ms an order at 21 buffers, 1.6 against
5.3 at 145, 5.9 against 12.0 at 287 (one core of a 2-core Intel Xeon,
2026-12-02); on random lifetimes with a third of the buffers living to the
end of the step the tree draws level near 700 and wins above."""


def _first_fit(buffers: list[Buffer], order, beat: int | None = None) -> tuple[int, dict[int, int] | None]:
    """Each buffer, in `order`, at the lowest offset free over its whole
    lifetime; returns the arena size and the offsets by buffer index. With
    `beat`, an order whose arena reaches that size is given up as soon as it
    does, returning (its arena so far, None): place() keeps only a smaller
    arena, and most random orders lose early."""
    if len(buffers) <= SCAN_UP_TO:
        return _first_fit_pairwise(buffers, order, beat)
    return _first_fit_segments(buffers, order, beat)


def _first_fit_pairwise(buffers: list[Buffer], order, beat: int | None = None) -> tuple[int, dict[int, int] | None]:
    """First fit by scanning every placed buffer for each new one: quadratic,
    and the reference that _first_fit_segments must agree with exactly
    (tests compare them)."""
    placed: list[tuple[int, int, int, int]] = []  # start, end, offset, offset + size
    offsets = {}
    arena = 0
    for i, buf in sorted(enumerate(buffers), key=lambda ib: order(ib[1])):
        first, last, size = buf.start, buf.end, buf.size
        if size == 0:
            offsets[i] = 0  # fits below every busy range; at 0 it blocks nothing
            continue
        busy = sorted([(lo, hi) for start, end, lo, hi in placed if start <= last and first <= end])
        offset = 0
        for lo, hi in busy:
            if offset + size <= lo:
                break
            if hi > offset:
                offset = hi
        offsets[i] = offset
        if offset + size > arena:
            arena = offset + size
            if beat is not None and arena >= beat:
                return arena, None
        placed.append((first, last, offset, offset + size))
    return arena, offsets


class _ByteRanges:
    """A union of byte ranges [lo, hi), kept as sorted, disjoint, non-touching
    ranges (touching ones merge: first fit only asks whether a range is
    free, so merging stacks of adjacent buffers keeps the lists short).
    _Occupancy.add adds to them."""

    __slots__ = ("los", "his")

    def __init__(self) -> None:
        self.los: list[int] = []
        self.his: list[int] = []


class _Occupancy:
    """The bytes placed buffers take over the schedule, for first fit without
    looking at every placed buffer: a segment tree over schedule positions.
    A buffer is stored at the O(log T) nodes that exactly cover its lifetime
    (`covering`), and its bytes are merged into the union of every node at or
    above those (`within`: all bytes taken anywhere inside the node's span).
    The bytes taken at some position of [start, end] are then the union of
    `within` of the nodes that exactly cover [start, end] and `covering` of
    the nodes above them (the ancestors of the two end positions' leaves)."""

    def __init__(self, first: int, last: int) -> None:
        self.first = first
        self.leaves = 1
        while self.leaves < last - first + 1:
            self.leaves *= 2
        self.covering: dict[int, _ByteRanges] = {}
        self.within: dict[int, _ByteRanges] = {}

    def _cover(self, start: int, end: int) -> list[int]:
        """The nodes whose spans exactly tile [start, end]."""
        lo, hi = start - self.first + self.leaves, end - self.first + self.leaves + 1
        nodes = []
        while lo < hi:
            if lo & 1:
                nodes.append(lo)
                lo += 1
            if hi & 1:
                hi -= 1
                nodes.append(hi)
            lo >>= 1
            hi >>= 1
        return nodes

    def _above(self, start: int, end: int) -> set[int]:
        """The strict ancestors of the leaves of start and end: every node
        that spans past [start, end] yet meets it is one of them."""
        nodes = set()
        for leaf in (start - self.first + self.leaves, end - self.first + self.leaves):
            leaf >>= 1
            while leaf and leaf not in nodes:
                nodes.add(leaf)
                leaf >>= 1
        return nodes

    def add(self, start: int, end: int, lo: int, hi: int) -> None:
        """Bytes [lo, hi) are taken at every position of [start, end]."""
        covering, within = self.covering, self.within
        # The unions to add to: `covering` of each node that exactly covers
        # [start, end], and `within` of those nodes and their ancestors, each
        # once (a walk up stops at a node an earlier walk reached).
        targets = []
        done: set[int] = set()
        for node in self._cover(start, end):
            ranges = covering.get(node)
            if ranges is None:  # (setdefault would build a _ByteRanges per call)
                ranges = covering[node] = _ByteRanges()
            targets.append(ranges)
            while node and node not in done:
                done.add(node)
                ranges = within.get(node)
                if ranges is None:
                    ranges = within[node] = _ByteRanges()
                targets.append(ranges)
                node >>= 1
        # [lo, hi) into each union, in one loop (a training step's first fit
        # makes ~30 of these per buffer)
        bisect_left, bisect_right = bisect.bisect_left, bisect.bisect_right
        for ranges in targets:
            los, his = ranges.los, ranges.his
            i = bisect_left(his, lo)  # the first range ending at or after lo: it touches or follows
            j = bisect_right(los, hi, i)  # ranges i..j-1 start at or before hi: they merge with [lo, hi)
            if i == j:
                los.insert(i, lo)
                his.insert(i, hi)
            else:
                first, last = los[i], his[j - 1]
                los[i:j] = [lo if lo < first else first]
                his[i:j] = [hi if hi > last else last]

    def lowest_free(self, start: int, end: int, size: int) -> int:
        """The lowest offset where `size` bytes are free at every position of
        [start, end]: what first fit over the sorted busy ranges finds."""
        cover = self._cover(start, end)
        ranges = [self.within[n] for n in cover if n in self.within]
        ranges += [self.covering[n] for n in self._above(start, end).difference(cover) if n in self.covering]
        offset, i, calm, count = 0, 0, 0, len(ranges)
        bisect_right = bisect.bisect_right
        # Raise the offset past every range in the way, set by set, until a
        # whole round of the sets leaves it where it is.
        while calm < count:
            los, his = ranges[i].los, ranges[i].his
            j = bisect_right(his, offset)  # the first range ending above the offset
            calm += 1
            while j < len(his) and los[j] < offset + size:
                offset = his[j]
                j += 1
                calm = 1
            i = i + 1 if i + 1 < count else 0
        return offset


def _first_fit_segments(buffers: list[Buffer], order, beat: int | None = None) -> tuple[int, dict[int, int] | None]:
    """_first_fit through _Occupancy: the same offsets as
    _first_fit_pairwise, in O(n log^2 n)-ish time rather than quadratic (a
    training step keeps the forward pass's activations live together, so
    most pairs of buffers overlap in time)."""
    if not buffers:
        return 0, {}
    occupancy = _Occupancy(min(b.start for b in buffers), max(b.end for b in buffers))
    offsets = {}
    arena = 0
    for i, buf in sorted(enumerate(buffers), key=lambda ib: order(ib[1])):
        if buf.size == 0:
            offsets[i] = 0  # fits anywhere; the pairwise scan puts it at 0, and at 0 it blocks nothing
            continue
        offset = occupancy.lowest_free(buf.start, buf.end, buf.size)
        offsets[i] = offset
        if offset + buf.size > arena:
            arena = offset + buf.size
            if beat is not None and arena >= beat:
                return arena, None
        occupancy.add(buf.start, buf.end, offset, offset + buf.size)
    return arena, offsets


def place(buffers: list[Buffer], memo: dict | None = None) -> int:
    """Each buffer at the lowest offset free over its whole lifetime, in the
    best of several orders; returns the arena size. The placement depends
    only on the buffers' sizes and lifetimes in order, so devices alike (the
    ranks of a data-parallel mesh) share one through `memo`."""
    key = tuple((b.size, b.start, b.end) for b in buffers) if memo is not None else None
    if memo is not None and key in memo:
        arena, offsets = memo[key]
        for i, buf in enumerate(buffers):
            buf.offset = offsets[i]
        return arena
    arena = _place(buffers)
    if memo is not None:
        memo[key] = (arena, [b.offset for b in buffers])
    return arena


def _place(buffers: list[Buffer]) -> int:
    bound = live_bound(buffers)
    good_enough = bound + int(bound * NEAR_BOUND)
    arena, first_offsets = _first_fit(buffers, ORDERS[0])
    assert first_offsets is not None  # (nothing to beat)
    offsets = first_offsets
    # The other orders only where the first misses the bound by more than
    # NEAR_BOUND (on a tie the first order wins anyway).
    for order in ORDERS[1:] if arena > good_enough else ():
        tried, tried_offsets = _first_fit(buffers, order, beat=arena)
        if tried_offsets is not None:
            arena, offsets = tried, tried_offsets
    if arena > bound and len(buffers) <= RANDOM_ORDER_LIMIT:
        rng = random.Random(len(buffers))
        for _ in range(RANDOM_ORDERS):
            keys = [rng.random() for _ in buffers]
            position = {id(b): k for b, k in zip(buffers, keys)}
            tried, tried_offsets = _first_fit(buffers, lambda b: position[id(b)], beat=arena)  # noqa: B023 (used only during the call)
            if tried_offsets is not None:
                arena, offsets = tried, tried_offsets
            if arena == bound:
                break
    for i, buf in enumerate(buffers):
        buf.offset = offsets[i]
    return arena


def live_bound(buffers: list[Buffer]) -> int:
    """The most bytes live at any one position: no placement can do better."""
    # by position, and at one position the ends (negative) before the starts
    events = sorted([(b.start, b.size) for b in buffers] + [(b.end + 1, -b.size) for b in buffers])
    live = best = 0
    for _, delta in events:
        live += delta
        best = max(best, live)
    return best
