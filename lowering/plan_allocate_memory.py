"""`plan-allocate-memory`: places every register of a device in its arena.

A register is live from its producer's firing to its last consumer's (a feed
from before the first actor, a fetched output to after the last; what a
collective reads, until a kernel first reads its result or the result of a
collective that reads it, as it is in flight),
taking `bytes x slots`. Registers whose lifetimes overlap never share bytes; dead
ones are reused. An elementwise compute actor writes in place into an input
that dies there when type and slots match (the two registers become one
buffer). A reshape's result is its input's bytes (same bytes, same
order), and a slice's that keeps one run of its input's bytes is those
bytes, whether or not the input lives on; a concatenation's inputs that
are each one run of its output are those bytes, written there by their
producers (`view_groups`): the registers of such a group share one
buffer, live from the first one's write to the last read of any of them,
and an actor may write in place over one of them only where the whole
group dies. A gradient bucket's members are so views of the bucket, before
its collective and after, as DDP's gradients are views of its buckets
(the bucket's bytes are then taken from its first member's write on). Parameters and constants go to
the device's persistent region.
An updated parameter or optimizer state (lg-optimizer's `new.<key>`) with
the parameter's own type takes the parameter's persistent bytes when every
read of the old value comes before the update is written (or is the
elementwise update itself): the step then updates in place, with no copy
back and no extra buffer (`alias`).

Placement (planning/first_fit.py) is first fit (each buffer at the lowest offset free for its whole
lifetime) in the best of a few orders, largest buffer first among them. Each device records its arena
size, the live-set lower bound (most bytes live at any point of the
schedule) and the total without any reuse.
"""

from __future__ import annotations

import math
from collections.abc import Collection
from dataclasses import dataclass
from typing import cast

from xdsl.context import Context
from xdsl.dialects.builtin import I64, IntegerAttr, ModuleOp, UnitAttr, i64
from xdsl.passes import ModulePass

from sbpc.dialects import plan
from sbpc.dialects.builders import flat_symbol_ref, i64_attr
from sbpc.dialects.plan_analysis import group_lifetimes, is_view, lifetimes, register_names
from sbpc.planning.first_fit import ALIGNMENT, Buffer, aligned, live_bound, place


def _viewable(reg: plan.RegisterOp, apart: Collection[str]) -> bool:
    """In the arena and written by an actor of the step: neither persistent
    nor fed (a fetched output may be a view: its group lives to the end)."""
    return reg.is_persistent is None and reg.feed is None and reg.sym_name.data not in apart


def view_groups(registers: dict[str, plan.RegisterOp], actors: list[plan.ComputeOp | plan.CommOp],
                apart: Collection[str] = ()) -> tuple[dict[str, str], dict[str, int]]:
    """view -> the first register of its group, for the registers that
    are views of another's buffer, and where each view starts in that
    first register's bytes (a view at its start is not listed there):

    - a reshape's (any reinterpreting kernel's) result and its input, with
      the same bytes, element type and slots: at the input's start;
    - a slice's result that is one run of its input's bytes
      (plan.slice_view_start), of one slot each: at that run, where the
      run starts a multiple of ALIGNMENT bytes into the group (as every
      buffer does, so a kernel finds any register aligned alike). A
      gradient bucket's members after its collective (examples/models.py's
      GPT of 2 layers, width 128, data parallel on 2 ranks: 25 slices of
      1.6 MB in all, 0.17 ms of its step).

    Both registers are in the arena and written by the step (_viewable;
    `apart`: registers placed elsewhere, the updates that take their
    parameter's bytes); the view's kernel then has nothing to do. Registers
    are written once a step (by their producer), so the group's bytes are
    read-only from the first member's write until the last member's read,
    as long as no actor writes in place over a member before then
    (in_place_pairs, given the groups' lifetimes). A fetched member keeps
    its group live to the step's end: GPT-2's logits (an output) and their
    reshape for the loss were two buffers of 98 MiB a rank and a copy."""
    group: dict[str, str] = {}
    start: dict[str, int] = {}
    members: dict[str, list[str]] = {}  # each group's first register -> the others
    for actor in actors:
        if not isinstance(actor, plan.ComputeOp):
            continue
        kernel = actor.kernel.data
        if kernel == plan.CONCAT_KERNEL:
            _concat_views(actor, registers, apart, group, start, members)
            continue
        if kernel not in plan.REINTERPRETING_KERNELS and kernel != plan.SLICE_KERNEL:
            continue
        src = registers[actor.ins.data[0].string_value()]
        out = registers[actor.outs.data[0].string_value()]
        if (src.type.element_type != out.type.element_type or src.slots != out.slots
                or not _viewable(src, apart) or not _viewable(out, apart)):
            continue
        src_name = src.sym_name.data
        at = start.get(src_name, 0)
        if kernel == plan.SLICE_KERNEL:
            offset = plan.slice_view_offset(actor, src)
            if offset is None or (at + offset) % ALIGNMENT:
                continue
            at += offset
        elif src.bytes != out.bytes:
            continue
        name = out.sym_name.data
        root = group[name] = group.get(src_name, src_name)  # (a view's input precedes it)
        members.setdefault(root, []).append(name)
        if at:
            start[name] = at
    return group, start


def _concat_views(actor: plan.ComputeOp, registers: dict[str, plan.RegisterOp], apart: Collection[str],
                  group: dict[str, str], start: dict[str, int], members: dict[str, list[str]]) -> None:
    """A concatenation whose every input is one run of its output (joined
    along its first axis longer than one), at a multiple of ALIGNMENT bytes:
    the inputs' groups (each input and its reshapes, starting where the
    input does) become views of the output at their runs, so that their
    producers write the output in place and the concatenation has nothing
    to do. A gradient bucket before its all_reduce: each gradient is
    written into the bucket by the kernel that computes it (the GPT named
    in view_groups: one concatenation of 1.6 MB, 0.16 ms). All or nothing: an input
    that is no such run (another group's slice, a feed, an input twice)
    leaves every input a register of its own, and the copy."""
    out = registers[actor.outs.data[0].string_value()]
    out_name, shape = out.sym_name.data, out.type.get_shape()
    axis = cast(IntegerAttr, actor.props.data["axis"]).value.data
    if not _viewable(out, apart) or out.slots.value.data != 1 or math.prod(shape[:axis]) != 1:
        return
    roots: list[str] = []
    at = 0
    for ref in actor.ins.data:
        src = registers[ref.string_value()]
        root = group.get(src.sym_name.data, src.sym_name.data)
        if (at % ALIGNMENT or root in roots or root == out_name or src.slots != out.slots
                or src.type.element_type != out.type.element_type or not _viewable(registers[root], apart)
                or registers[root].bytes != src.bytes or any(m in start for m in members.get(root, ()))):
            return
        roots.append(root)
        at += src.bytes.value.data
    at = 0
    for root in roots:
        for name in (root, *members.pop(root, ())):
            group[name] = out_name
            members.setdefault(out_name, []).append(name)
            if at:
                start[name] = at
        at += registers[root].bytes.value.data


def _makes_views(actor: plan.ComputeOp) -> bool:
    """A reshape (any reinterpreting kernel) or a slice: where its output is
    a view, it has nothing to do (the producer of a concatenation's input
    writes into a view, and still computes)."""
    return actor.kernel.data in plan.REINTERPRETING_KERNELS or actor.kernel.data == plan.SLICE_KERNEL


def _concatenates_views(actor: plan.ComputeOp, group: dict[str, str]) -> bool:
    """A concatenation whose inputs are views of its output (_concat_views):
    it has nothing to do."""
    out = actor.outs.data[0].string_value()
    return actor.kernel.data == plan.CONCAT_KERNEL and all(group.get(r.string_value()) == out for r in actor.ins.data)


def in_place_pairs(device: plan.DeviceOp, life: dict[str, tuple[int, int]],
                   registers: dict[str, plan.RegisterOp] | None = None,
                   actors: list[plan.ComputeOp | plan.CommOp] | None = None,
                   group: dict[str, str] | None = None) -> dict[str, str]:
    """output register -> input register it may overwrite (`registers` by
    name and `actors`: the device's, where the caller has them; `life`
    with a view group's lifetime for each of its members, and `group`
    the view groups, whose members are not overwritten twice)."""
    pairs = {}
    overwritten = set()  # the values of `pairs` (their groups), as a set: each is overwritten at most once
    group = group or {}
    if registers is None:
        registers = {r.sym_name.data: r for r in device.registers()}
    for pos, actor in enumerate(device.actors() if actors is None else actors):
        if (
            not isinstance(actor, plan.ComputeOp)
            or actor.kernel.data not in plan.OVERWRITING_KERNELS
            or is_view(group, actor.outs.data[0].string_value())  # the group places it
        ):
            continue
        out = registers[actor.outs.data[0].string_value()]
        reinterprets = actor.kernel.data in plan.REINTERPRETING_KERNELS
        for ref in actor.ins.data:
            name = ref.string_value()
            src = registers[name]
            if (
                life[name][1] == pos  # it dies here (the most selective test first)
                and group.get(name, name) not in overwritten
                and (src.type is out.type or src.type == out.type
                     or (reinterprets and src.bytes == out.bytes and src.type.element_type == out.type.element_type))
                and src.slots == out.slots
                and src.is_persistent is None
                and src.fetch is None
                and src.feed is None
            ):
                pairs[out.sym_name.data] = name
                overwritten.add(group.get(name, name))
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
    group, view_start = view_groups(registers, actors, aliases) if in_place else ({}, {})
    life = group_lifetimes(life, group)
    pairs = {out: src for out, src in (in_place_pairs(device, life, registers, actors, group)
                                       if in_place else {}).items()
             if out not in aliases}
    # registers written in place join the buffer of the input they
    # overwrite (at its start), and the members of a view group its first
    # member's (at theirs)
    root, shift = {}, {}
    for name in registers:
        r, at = name, 0
        while r in pairs or is_view(group, r):
            if r in pairs:
                r = pairs[r]
            else:
                at += view_start.get(r, 0)
                r = group[r]
        root[name], shift[name] = r, at
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
        extent = aligned(shift[name] + reg.size)
        buf = buffers.get(root[name])
        if buf is None:
            buf = buffers[root[name]] = Buffer(extent, start, end)
        else:
            buf.start, buf.end = min(buf.start, start), max(buf.end, end)
            buf.size = max(buf.size, extent)
        buf.registers.append(name)
    arena = place(list(buffers.values()), memo)
    for buf in buffers.values():
        for name in buf.registers:
            registers[name].offset = int_attr(buf.offset + shift[name])
    for name, param in aliases.items():
        registers[name].is_persistent = UnitAttr()
        registers[name].offset = registers[param].offset
        registers[name].alias = flat_symbol_ref(registers[param].sym_name)
    for actor in actors:
        if isinstance(actor, plan.ComputeOp) and (
            actor.outs.data[0].string_value() in pairs or actor.sym_name.data in alias_writers
            or (_makes_views(actor) and is_view(group, actor.outs.data[0].string_value()))  # does nothing
            or _concatenates_views(actor, group)
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
