"""`plan-allocate-memory`: places every register of a device in its arena.

A register is live from its producer's firing to its last consumer's (a feed
from before the first actor, a fetched output to after the last; what a
collective reads, until a kernel first reads its result or the result of a
collective that reads it, as it is in flight),
taking `bytes x slots`. Registers whose lifetimes overlap never share bytes; dead
ones are reused. An elementwise compute actor writes in place into an input
that dies there when type and slots match (the two registers become one
buffer), and so does a reshape (same bytes, same order). Parameters and
constants go to the device's persistent region.
An updated parameter or optimizer state (lg-optimizer's `new.<key>`) with
the parameter's own type takes the parameter's persistent bytes when every
read of the old value comes before the update is written (or is the
elementwise update itself): the step then updates in place, with no copy
back and no extra buffer (`alias`).

Placement is first fit (each buffer at the lowest offset free for its whole
lifetime) in the best of a few orders, largest buffer first among them. Each device records its arena
size, the live-set lower bound (most bytes live at any point of the
schedule) and the total without any reuse.
"""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass, field

from xdsl.context import Context
from xdsl.dialects.builtin import I64, IntegerAttr, ModuleOp, UnitAttr, i64
from xdsl.passes import ModulePass

from sbpc.dialects import plan
from sbpc.dialects.builders import flat_symbol_ref, i64_attr
from sbpc.dialects.plan_analysis import lifetimes, register_names

ALIGNMENT = 64
"""Every buffer starts at a multiple of this many bytes (cache lines, and
more than any element type needs)."""

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


def _first_fit_pairwise(buffers: list[Buffer], order) -> tuple[int, dict[int, int]]:
    """First fit by scanning every placed buffer for each new one: quadratic.
    The reference that _first_fit must agree with exactly (tests compare them)."""
    placed: list[tuple[int, int, int, int]] = []  # start, end, offset, size
    offsets = {}
    for i, buf in sorted(enumerate(buffers), key=lambda ib: order(ib[1])):
        busy = sorted((off, off + size) for start, end, off, size in placed if start <= buf.end and buf.start <= end)
        offset = 0
        for lo, hi in busy:
            if offset + buf.size <= lo:
                break
            offset = max(offset, hi)
        offsets[i] = offset
        placed.append((buf.start, buf.end, offset, buf.size))
    return max((offsets[i] + b.size for i, b in enumerate(buffers)), default=0), offsets


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


def _first_fit(buffers: list[Buffer], order) -> tuple[int, dict[int, int]]:
    """Each buffer, in `order`, at the lowest offset free over its whole
    lifetime; returns the arena size and the offsets by buffer index. Same
    offsets as _first_fit_pairwise, in O(n log^2 n)-ish time rather than
    quadratic (a training step keeps the forward pass's activations live
    together, so most pairs of buffers overlap in time)."""
    if not buffers:
        return 0, {}
    occupancy = _Occupancy(min(b.start for b in buffers), max(b.end for b in buffers))
    offsets = {}
    for i, buf in sorted(enumerate(buffers), key=lambda ib: order(ib[1])):
        if buf.size == 0:
            offsets[i] = 0  # fits anywhere; the pairwise scan puts it at 0, and at 0 it blocks nothing
            continue
        offset = occupancy.lowest_free(buf.start, buf.end, buf.size)
        offsets[i] = offset
        occupancy.add(buf.start, buf.end, offset, offset + buf.size)
    return max((offsets[i] + b.size for i, b in enumerate(buffers)), default=0), offsets


RANDOM_ORDERS = 64
"""Seeded random orders tried after the fixed ones on devices with at most
RANDOM_ORDER_LIMIT buffers, until one meets the lower bound (first fit is
quadratic, so large devices keep the fixed orders)."""
RANDOM_ORDER_LIMIT = 200


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


NEAR_BOUND = 1 / 1024
"""An arena within this fraction of the lower bound is kept as it is: other
orders could gain at most that much, and on a large training step (18k
buffers per device) each costs up to eight times the first (they leave more
gaps for first fit to pass over)."""


def _place(buffers: list[Buffer]) -> int:
    bound = live_bound(buffers)
    good_enough = bound + int(bound * NEAR_BOUND)
    arena, offsets = _first_fit(buffers, ORDERS[0])
    # The other orders only where the first misses the bound by more than
    # NEAR_BOUND (on a tie the first order wins anyway).
    for order in ORDERS[1:] if arena > good_enough else ():
        tried, tried_offsets = _first_fit(buffers, order)
        if tried < arena:
            arena, offsets = tried, tried_offsets
    if arena > bound and len(buffers) <= RANDOM_ORDER_LIMIT:
        rng = random.Random(len(buffers))
        for _ in range(RANDOM_ORDERS):
            keys = [rng.random() for _ in buffers]
            position = {id(b): k for b, k in zip(buffers, keys)}
            tried, tried_offsets = _first_fit(buffers, lambda b: position[id(b)])  # noqa: B023 (used only during the call)
            if tried < arena:
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


def in_place_pairs(device: plan.DeviceOp, life: dict[str, tuple[int, int]],
                   registers: dict[str, plan.RegisterOp] | None = None,
                   actors: list[plan.ComputeOp | plan.CommOp] | None = None) -> dict[str, str]:
    """output register -> input register it may overwrite (`registers` by
    name and `actors`: the device's, where the caller has them)."""
    pairs = {}
    overwritten = set()  # the values of `pairs`, as a set: each input is overwritten at most once
    if registers is None:
        registers = {r.sym_name.data: r for r in device.registers()}
    for pos, actor in enumerate(device.actors() if actors is None else actors):
        if (
            not isinstance(actor, plan.ComputeOp)
            or actor.kernel.data not in plan.OVERWRITING_KERNELS
        ):
            continue
        out = registers[actor.outs.data[0].string_value()]
        reinterprets = actor.kernel.data in plan.REINTERPRETING_KERNELS
        for ref in actor.ins.data:
            name = ref.string_value()
            src = registers[name]
            if (
                life[name][1] == pos  # it dies here (the most selective test first)
                and name not in overwritten
                and (src.type is out.type or src.type == out.type
                     or (reinterprets and src.bytes == out.bytes and src.type.element_type == out.type.element_type))
                and src.slots == out.slots
                and src.is_persistent is None
                and src.fetch is None
                and src.feed is None
            ):
                pairs[out.sym_name.data] = name
                overwritten.add(name)
                break
    return pairs


def update_aliases(device: plan.DeviceOp, life: dict[str, tuple[int, int]],
                   registers: dict[str, plan.RegisterOp] | None = None,
                   actors: list[plan.ComputeOp | plan.CommOp] | None = None,
                   writes: list[list[str]] | None = None) -> tuple[dict[str, str], set[str]]:
    """`new.<key>` register -> parameter register <key> whose bytes it may
    take, and the actors that then write in place over the parameter
    (`writes`: what each actor writes, as register_names gives it).

    Safe when the old value has no reader left once the update is written:
    its last read (a collective's, until that completes) comes before the
    update's first write, or is the in-place elementwise kernel writing it."""
    if registers is None:
        registers = {r.sym_name.data: r for r in device.registers()}
    if actors is None:
        actors = device.actors()
    params: dict[str, plan.RegisterOp] = {}
    updates: list[tuple[str, plan.RegisterOp, str]] = []  # (name, register, <key>) of each `new.<key>`
    for name, reg in registers.items():
        if reg.param is not None:
            params[reg.param.data] = reg
        if reg.fetch is not None and reg.fetch.data.startswith("new."):
            updates.append((name, reg, reg.fetch.data.removeprefix("new.")))
    # the writes of the updates, by schedule position
    writers: dict[str, list] = {name: [] for name, _, _ in updates}
    if updates:
        for pos, outs in enumerate(register_names(actors)[0] if writes is None else writes):
            for out in outs:
                written = writers.get(out)
                if written is not None:
                    written.append((pos, actors[pos]))
    aliases, in_place_actors = {}, set()
    for name, reg, key in updates:
        if len(writers[name]) != 1:
            continue
        param = params.get(key)
        if (param is None or param.value != reg.value or param.type != reg.type
                or param.slots.value.data != 1 or reg.slots.value.data != 1):
            continue
        (pos, writer), = writers[name]
        last_read = life[param.sym_name.data][1]
        if last_read < pos:
            aliases[name] = param.sym_name.data
        elif (last_read == pos and isinstance(writer, plan.ComputeOp) and writer.kernel.data in plan.IN_PLACE_KERNELS
              and param.sym_name.data in [r.string_value() for r in writer.ins.data]):
            aliases[name] = param.sym_name.data
            in_place_actors.add(writer.sym_name.data)
    return aliases, in_place_actors


def allocate_device(device: plan.DeviceOp, in_place: bool = True, memo: dict | None = None,
                    ints: dict[int, IntegerAttr[I64]] | None = None) -> None:
    """Allocates one device's registers (`memo`: placements already made
    for devices with the same buffers, see place; `ints`: offset attributes
    already made, shared by the devices of a program)."""
    register_list, actors = device.contents()
    names = register_names(actors)
    life = lifetimes(device, (register_list, actors), names)
    registers = {r.sym_name.data: r for r in register_list}
    aliases, alias_writers = update_aliases(device, life, registers, actors, names[0]) if in_place else ({}, set())
    pairs = {out: src for out, src in (in_place_pairs(device, life, registers, actors) if in_place else {}).items()
             if out not in aliases}
    # registers written in place join the buffer of the input they overwrite
    root = {}
    for name in registers:
        r = name
        while r in pairs:
            r = pairs[r]
        root[name] = r
    buffers: dict[str, Buffer] = {}
    # one (immutable) attribute per distinct offset, shared by its registers
    offset_attrs: dict[int, IntegerAttr[I64]] = {} if ints is None else ints

    def int_attr(n: int) -> IntegerAttr[I64]:
        attr = offset_attrs.get(n)
        if attr is None:
            attr = offset_attrs[n] = i64_attr(n)
        return attr

    persistent_offset = 0
    for name, reg in registers.items():
        if name in aliases:
            continue
        if reg.is_persistent is not None:
            reg.offset = int_attr(persistent_offset)
            persistent_offset += aligned(reg.size)
            continue
        start, end = life[name]
        buf = buffers.get(root[name])
        if buf is None:
            buf = buffers[root[name]] = Buffer(aligned(reg.size), start, end)
        else:
            buf.start, buf.end = min(buf.start, start), max(buf.end, end)
        buf.registers.append(name)
    arena = place(list(buffers.values()), memo)
    for buf in buffers.values():
        for name in buf.registers:
            registers[name].offset = int_attr(buf.offset)
    for name, param in aliases.items():
        registers[name].is_persistent = UnitAttr()
        registers[name].offset = registers[param].offset
        registers[name].alias = flat_symbol_ref(registers[param].sym_name)
    for actor in actors:
        if isinstance(actor, plan.ComputeOp) and (
            actor.outs.data[0].string_value() in pairs or actor.sym_name.data in alias_writers
        ):
            actor.in_place = UnitAttr()
    device.arena = IntegerAttr(arena, i64)
    device.persistent = IntegerAttr(persistent_offset, i64)
    device.live_bound = IntegerAttr(live_bound(list(buffers.values())), i64)
    device.no_reuse = IntegerAttr(
        sum(aligned(r.size) for r in registers.values() if r.is_persistent is None), i64
    )


@dataclass(frozen=True)
class PlanAllocateMemoryPass(ModulePass):
    name = "plan-allocate-memory"

    in_place: bool = True
    """Let elementwise actors overwrite an input that dies there."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for program in plan.programs(op):
            memo: dict = {}
            ints: dict[int, IntegerAttr[I64]] = {}
            for device in program.devices():
                if device.like is None:
                    allocate_device(device, self.in_place, memo, ints)
            for device in program.devices():  # a device like another has its regions
                if device.like is not None:
                    source = device.source()
                    for region in plan.DeviceOp.REGIONS:
                        setattr(device, region, getattr(source, region))
