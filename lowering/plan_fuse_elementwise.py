"""`plan-fuse-elementwise`: merges chains of elementwise compute actors on
one device into single `plan.fused` actors.

A register qualifies for fusion when an elementwise actor (unary, step,
broadcasting binary, or an already fused chain) writes it and exactly one
other actor, itself elementwise, reads it, and the register is only an
intermediate: no feed, parameter, constant or fetched output, and no
communication actor touches it. The producer is folded into its consumer:
the consumer becomes a `plan.fused` actor (see plan.FUSED) whose steps are
the producer's followed by its own, its inputs the union of both, and the
register disappears from the device.

Why a plan-level rewrite rather than fusion inside plan-codegen only:

- The memory plan drops the intermediates. Run before
  plan-allocate-memory, the fused registers never get arena bytes, which is
  exactly what a fused GPU kernel needs (its intermediates live in
  registers) and what the live-set bound should count.
- Every backend gains: the numpy executor fires one actor instead of a
  chain (less per-firing overhead), the plan simulator and the trace show
  what really runs, and plan-codegen emits one CUDA kernel per actor with
  no fusion logic of its own.
- The plan stays the whole program: the fused steps are data on the actor,
  checked by its verifier, readable in the IR and in FileCheck tests.

Moving the producer's work to the consumer's place in the schedule is safe:
registers are written once per step before allocation, so the producer's
inputs still hold their values there, and the collectives are untouched,
so every rank still issues them in the same order. The pass therefore
refuses an allocated plan.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TypeGuard

from xdsl.context import Context
from xdsl.dialects.builtin import ArrayAttr, ModuleOp, StringAttr, SymbolRefAttr
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import plan


def _fusable(actor) -> TypeGuard[plan.ComputeOp]:
    return isinstance(actor, plan.ComputeOp) and (
        actor.kernel.data in plan.FUSABLE_KERNELS or actor.kernel.data == plan.FUSED
    )


def _steps(actor: plan.ComputeOp, out_type) -> list[plan.FusedStep]:
    if actor.kernel.data == plan.FUSED:
        return plan.fused_steps(actor)
    return [plan.FusedStep(actor.kernel.data, tuple(range(len(actor.ins.data))), out_type)]


def _rounded(reg: plan.RegisterOp) -> bool:
    """A 16-bit float value: each op rounds its result to it, so a chain
    that kept it in float32 between steps would compute something else."""
    return str(reg.type.element_type) in ("f16", "bf16")


def _is_intermediate(reg: plan.RegisterOp) -> bool:
    return (reg.feed is None and reg.param is None and reg.constant is None and reg.fetch is None
            and reg.is_persistent is None)


def merge(
    producer: plan.ComputeOp, consumer: plan.ComputeOp, via: str, registers: dict
) -> tuple[list, list[plan.FusedStep]]:
    """The inputs and steps of `consumer` with `producer` (which writes
    register `via`) folded in front of it."""
    p_ins = [r.string_value() for r in producer.ins.data]
    c_ins = [r.string_value() for r in consumer.ins.data]
    ins = list(p_ins) + [r for r in c_ins if r != via and r not in p_ins]
    n = len(ins)
    p_steps = _steps(producer, registers[via].type)
    c_steps = _steps(consumer, registers[consumer.outs.data[0].string_value()].type)
    # producer: its input i is ins[i]; its step j result is at n + j
    steps = [plan.FusedStep(s.kernel, tuple(a if a < len(p_ins) else n + a - len(p_ins) for a in s.args), s.type)
             for s in p_steps]
    via_index = n + len(p_steps) - 1

    def remap(a: int) -> int:
        if a < len(c_ins):
            name = c_ins[a]
            return via_index if name == via else ins.index(name)
        return n + len(p_steps) + a - len(c_ins)

    steps += [plan.FusedStep(s.kernel, tuple(remap(a) for a in s.args), s.type) for s in c_steps]
    return ins, steps


def fuse_device(device: plan.DeviceOp) -> int:
    """Fuses the device's elementwise chains; returns how many registers went."""
    registers = {r.sym_name.data: r for r in device.registers()}
    producers: dict[str, plan.ComputeOp | plan.CommOp] = {}
    readers: dict[str, set] = {}
    for actor in device.actors():
        for ref in actor.ins.data:
            readers.setdefault(ref.string_value(), set()).add(actor)
        for ref in actor.outs.data:
            producers[ref.string_value()] = actor
    fused = 0
    for actor in device.actors():  # producers come first, so chains fold whole
        if not _fusable(actor):
            continue
        changed = True
        while changed:  # folding a producer can leave another input read by this actor alone
            changed = False
            for ref in actor.ins.data:
                name = ref.string_value()
                producer = producers.get(name)
                if (producer is None or producer is actor or not _fusable(producer)
                        or readers.get(name) != {actor} or not _is_intermediate(registers[name])
                        or _rounded(registers[name])):
                    continue
                ins, steps = merge(producer, actor, name, registers)
                for r in producer.ins.data:
                    readers[r.string_value()].discard(producer)
                    readers[r.string_value()].add(actor)
                actor.ins = ArrayAttr([SymbolRefAttr(r) for r in ins])
                actor.kernel = StringAttr(plan.FUSED)
                actor.props = plan.fused_props(steps)
                producer.detach()
                producer.erase()
                dead = registers.pop(name)
                dead.detach()
                dead.erase()
                readers.pop(name)
                producers.pop(name)
                fused += 1
                changed = True
                break
    return fused


@dataclass(frozen=True)
class PlanFuseElementwisePass(ModulePass):
    name = "plan-fuse-elementwise"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for program in plan.programs(op):
            for device in program.devices():
                if device.arena is not None:
                    raise PassFailedException(
                        f"'plan.device' @{device.sym_name.data}: the plan is already allocated; "
                        "run plan-fuse-elementwise before plan-allocate-memory"
                    )
                fuse_device(device)
