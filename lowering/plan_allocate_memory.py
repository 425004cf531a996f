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

Placement (planning/first_fit.py) is first fit (each buffer at the lowest offset free for its whole
lifetime) in the best of a few orders, largest buffer first among them. Each device records its arena
size, the live-set lower bound (most bytes live at any point of the
schedule) and the total without any reuse.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import I64, IntegerAttr, ModuleOp, UnitAttr, i64
from xdsl.passes import ModulePass

from sbpc.dialects import plan
from sbpc.dialects.builders import flat_symbol_ref, i64_attr
from sbpc.dialects.plan_analysis import lifetimes, register_names
from sbpc.planning.first_fit import Buffer, aligned, live_bound, place


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
