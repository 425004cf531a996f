"""Runs a memory-planned `plan` program in one process, device by device,
on real arenas: every device gets one byte buffer of its arena size (and
one for its persistent region), every register is a numpy view at its
planned offset, and every actor reads and writes those views. A wrong
offset or a register reused while still live corrupts values, so agreeing
with the reference interpreter checks the memory plan as well as the
lowering.

Devices run their schedules in lockstep: each runs compute actors until it
reaches a communication actor; a collective runs once every member of its
placement has reached it. A point-to-point transfer is posted as the
runtime posts it: the sender goes on at once, the receiver once every
sender has posted (stages may post them in different orders). If nothing
can run, the plan would deadlock, and that is an error naming the ranks and
actors.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp

from sbpc.dialects import make_context, plan
from sbpc.dialects.dtypes import numpy_dtype
from sbpc.dialects.pieces import mesh_coord, piece_of
from sbpc.dialects.sbp import DTensorType, Mesh, lookup_placement, nd_to_plain
from sbpc.semantics.local_eval import Fused, LocalContext, combine, local_kernel
from sbpc.semantics.reference import EvaluationError, constant_value, initialize
from sbpc.semantics.sbp_interpreter import Distributed, run_collective, run_transfer


class DeviceState:
    def __init__(self, device: plan.DeviceOp):
        self.device = device
        self.rank = device.rank.value.data
        if device.arena is None:
            raise EvaluationError(f"'plan.device' @{device.sym_name.data}: not allocated; run plan-allocate-memory")
        # Fill with NaN bytes so reading a register nobody wrote shows.
        arena, persistent = device.region_bytes()
        self.arena = np.full(arena, 0xFF, np.uint8)
        self.persistent = np.full(persistent, 0xFF, np.uint8)
        self.views: dict[str, np.ndarray] = {}
        self.registers = {r.sym_name.data: r for r in device.registers()}
        for name, reg in self.registers.items():
            buffer = self.persistent if reg.is_persistent is not None else self.arena
            dtype = numpy_dtype(reg.type.element_type)
            count = int(np.prod(reg.type.get_shape()))
            self.views[name] = np.frombuffer(
                buffer, dtype, count, reg.byte_offset()
            ).reshape(tuple(reg.type.get_shape()))
        self.schedule = device.actors()
        self.position = 0

    def mesh(self, t: DTensorType) -> Mesh:
        return lookup_placement(self.device, t.placement).mesh()

    def coord(self, t: DTensorType) -> tuple[int, ...]:
        return mesh_coord(self.mesh(t), self.rank)

    def piece_of(self, t: DTensorType) -> tuple[slice, ...]:
        return piece_of(t, self.mesh(t), self.rank)


def run_plan(
    module: ModuleOp,
    feeds: Mapping[str, Any],
    params: Mapping[str, Any] | None = None,
    program: str | None = None,
) -> dict[str, np.ndarray]:
    """Runs one step of a planned program; returns the fetched outputs."""
    programs = plan.programs(module)
    if program is not None:
        programs = [p for p in programs if p.sym_name.data == program]
    if len(programs) != 1:
        raise EvaluationError("name the plan.program to run" if programs else "no plan.program to run")
    params = params or {}
    ctx = make_context()
    states = {d.rank.value.data: DeviceState(d) for d in programs[0].devices()}

    for state in states.values():
        for name, reg in state.registers.items():
            region = state.piece_of(reg.value)
            shape, dtype = reg.value.get_shape(), numpy_dtype(reg.value.element_type)
            if reg.feed is not None:
                if reg.feed.data not in feeds:
                    raise EvaluationError(f"rank {state.rank}: register @{name}: no feed \"{reg.feed.data}\"")
                state.views[name][...] = np.asarray(feeds[reg.feed.data], dtype)[region]
            elif reg.param is not None:
                key = reg.param.data
                value = params.get(key)
                if value is None:
                    if reg.init is None:
                        raise EvaluationError(f"parameter {key!r} has no initializer")
                    value = initialize(reg.init, reg.seed.value.data if reg.seed else 0, key, shape, dtype)
                state.views[name][...] = np.asarray(value, dtype)[region]
            elif reg.constant is not None:
                state.views[name][...] = constant_value(reg.constant)[region]

    transfers = _Transfers()
    while True:
        progressed = False
        for r, state in states.items():
            while state.position < len(state.schedule):
                here = state.schedule[state.position]
                if not isinstance(here, plan.ComputeOp):
                    break
                if not transfers.deliver(states, r, here):
                    break  # it reads a transfer still on its way
                _compute(ctx, state, here)
                state.position += 1
                progressed = True
        waiting: dict[int, plan.CommOp] = {}
        for r, s in states.items():
            if s.position < len(s.schedule):
                here = s.schedule[s.position]
                if isinstance(here, plan.CommOp):
                    waiting[r] = here
        if not waiting and not any(s.position < len(s.schedule) for s in states.values()):
            transfers.flush(states)  # receives no actor reads (fetched outputs)
            if transfers.undelivered():
                raise EvaluationError(f"the plan deadlocks: {transfers.undelivered()}")
            break
        moved = False
        for r, actor in list(waiting.items()):
            if actor.kind.data == "transfer":
                transfers.post(states, r, actor)
                states[r].position += 1
                del waiting[r]
                moved = True
        if moved:
            continue
        by_id: dict[int, list[int]] = {}
        for r, actor in waiting.items():
            if transfers.deliver(states, r, actor):
                by_id.setdefault(actor.comm_id.value.data, []).append(r)
        ran = False
        for _comm_id, ranks in sorted(by_id.items()):
            members = _members(states, waiting[ranks[0]])
            if set(members) <= set(ranks):
                _communicate(states, [waiting[r] for r in members], members)
                for r in members:
                    states[r].position += 1
                ran = True
                break
        if not ran and not progressed:
            stuck = [f"rank {r} at @{a.sym_name.data}" + (f" (id {a.comm_id.value.data})" if isinstance(a, plan.CommOp)
                                                           else " (waits for a transfer)")
                     for r, s in states.items() if s.position < len(s.schedule) for a in [s.schedule[s.position]]]
            raise EvaluationError(f"the plan deadlocks: {', '.join(stuck)}")

    outputs: dict[str, np.ndarray] = {}
    fetched: dict[str, dict] = {}
    for state in states.values():
        for name, reg in state.registers.items():
            if reg.fetch is not None:
                fetched.setdefault(reg.fetch.data, {"type": reg.value, "pieces": {}})["pieces"][
                    state.coord(reg.value)
                ] = state.views[name].copy()
    for key, item in fetched.items():
        t = item["type"]
        mesh = lookup_placement(programs[0], t.placement).mesh()
        outputs[key] = combine(
            item["pieces"], nd_to_plain(t.nd_sbp), mesh.shape, t.get_shape(), numpy_dtype(t.element_type)
        )
    return outputs


def actor_kernel(ctx, actor: plan.ComputeOp, registers: dict, piece_of) -> tuple:
    """The lg op a compute actor runs (rebuilt from its kernel name and
    properties, typed with the local result) and the LocalContext of its
    pieces on this device: what both this interpreter and the MPI runtime run."""
    ins = [registers[r.string_value()] for r in actor.ins.data]
    out = registers[actor.outs.data[0].string_value()]
    if actor.kernel.data == plan.FUSED:
        op = Fused(tuple((ctx.get_op(s.kernel).create(result_types=[s.type]), s.args) for s in plan.fused_steps(actor)))
    else:
        op = ctx.get_op(actor.kernel.data).create(properties=dict(actor.props.data), result_types=[out.type])
    local = LocalContext(
        tuple(r.value.get_shape() for r in ins),
        out.value.get_shape(),
        tuple(piece_of(r.value) for r in ins),
        piece_of(out.value),
        nd_to_plain(out.value.nd_sbp),
    )
    return op, local


def _compute(ctx, state: DeviceState, actor: plan.ComputeOp) -> None:
    ins = [state.registers[r.string_value()] for r in actor.ins.data]
    out = state.registers[actor.outs.data[0].string_value()]
    kernel_op, local = actor_kernel(ctx, actor, state.registers, state.piece_of)
    try:
        result = local_kernel(kernel_op, local, *(state.views[r.sym_name.data] for r in ins))
        state.views[out.sym_name.data][...] = result
    except (ValueError, EvaluationError) as e:
        raise EvaluationError(f"rank {state.rank}: actor @{actor.sym_name.data} ({actor.kernel.data}): {e}") from None


class _Transfers:
    """Point-to-point transfers as the runtime posts them: a sender's part
    is done once posted (its piece is copied: the allocator keeps a sent
    buffer until the step ends); a receiver posts its part and goes on, and
    waits only at the first actor that names the register (the data lands
    once every sender has posted). Stages may post them in different orders
    (1F1B)."""

    def __init__(self) -> None:
        self.posted: dict[int, set[int]] = {}
        self.copies: dict[int, dict[int, np.ndarray]] = {}
        self.arrived: dict[int, dict] = {}
        self.expected: dict[int, dict[str, plan.CommOp]] = {}
        """Per rank, its posted receives not yet delivered, by register."""

    def post(self, states, rank: int, actor: plan.CommOp) -> None:
        comm_id = actor.comm_id.value.data
        if actor.ins.data:
            name = actor.ins.data[0].string_value()
            self.posted.setdefault(comm_id, set()).add(rank)
            self.copies.setdefault(comm_id, {})[rank] = states[rank].views[name].copy()
            senders = [r for r in actor.group.get_values() if r in states[rank].mesh(actor.source).ranks]
            if set(senders) <= self.posted[comm_id]:
                value = _distributed_pieces(states, actor.source, self.copies.pop(comm_id))
                self.arrived[comm_id] = run_transfer(value, _distributed(states, actor.dest, {}))[0]
        if actor.outs.data:
            self.expected.setdefault(rank, {})[actor.outs.data[0].string_value()] = actor

    def deliver(self, states, rank: int, actor) -> bool:
        """Writes the arrived receives that `actor` names; False if one has not arrived."""
        expected = self.expected.get(rank)
        if not expected:
            return True
        for ref in [*actor.ins.data, *actor.outs.data]:
            recv = expected.get(ref.string_value())
            if recv is None:
                continue
            comm_id = recv.comm_id.value.data
            if comm_id not in self.arrived:
                return False
            states[rank].views[ref.string_value()][...] = self.arrived[comm_id][states[rank].coord(recv.dest)]
            del expected[ref.string_value()]
        return True

    def flush(self, states) -> None:
        for rank, regs in self.expected.items():
            for name, recv in list(regs.items()):
                comm_id = recv.comm_id.value.data
                if comm_id in self.arrived:
                    states[rank].views[name][...] = self.arrived[comm_id][states[rank].coord(recv.dest)]
                    del regs[name]

    def undelivered(self) -> str:
        return ", ".join(f"rank {r} never receives @{a.sym_name.data} (id {a.comm_id.value.data})"
                         for r, regs in self.expected.items() for a in regs.values())


def _members(states, actor: plan.CommOp) -> list[int]:
    return list(actor.group.get_values()) if actor.kind.data == "transfer" else _placement_ranks(states, actor)


def _placement_ranks(states, actor: plan.CommOp) -> list[int]:
    state = next(iter(states.values()))
    return list(state.mesh(actor.source).ranks)


def _distributed(states, t: DTensorType, refs: dict[int, str]) -> Distributed:
    return _distributed_pieces(states, t, {r: states[r].views[name] for r, name in refs.items()})


def _distributed_pieces(states, t: DTensorType, pieces: dict[int, np.ndarray]) -> Distributed:
    """The dtensor `t` from each rank's piece."""
    state = next(iter(states.values()))
    by_coord = {states[r].coord(t): piece for r, piece in pieces.items()}
    return Distributed(state.mesh(t), nd_to_plain(t.nd_sbp), t.get_shape(), numpy_dtype(t.element_type), by_coord)


def _communicate(states, actors: list[plan.CommOp], ranks: list[int]) -> None:
    actor = actors[0]
    source, dest = actor.source, actor.dest
    ins = {r: a.ins.data[0].string_value() for r, a in zip(ranks, actors) if a.ins.data}
    outs = {r: a.outs.data[0].string_value() for r, a in zip(ranks, actors) if a.outs.data}
    value = _distributed(states, source, ins)
    if actor.kind.data == "transfer":
        target = _distributed(states, dest, {})
        pieces, _ = run_transfer(value, target)
    else:
        # a collective into or out of grouped or gathered rows reads the group
        # ends or the index, whole on every member (after its input)
        views = states[ranks[0]].views
        extra = [views[r.string_value()] for r in actor.ins.data[1:]]
        ends = extra.pop(0) if actor.reads_group_ends() else None
        index = extra.pop(0) if actor.reads_index() else None
        pieces, _ = run_collective(actor.kind.data, value, nd_to_plain(dest.nd_sbp),
                                   list(actor.mesh_axes.get_values()), ends, index)
    for r, name in outs.items():
        states[r].views[name][...] = pieces[states[r].coord(dest)]
