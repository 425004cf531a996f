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
  chain (less per-firing overhead), the plan interpreter and the trace show
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
from xdsl.dialects.builtin import (
    ArrayAttr,
    BFloat16Type,
    DictionaryAttr,
    Float16Type,
    ModuleOp,
    StringAttr,
    SymbolRefAttr,
)
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import plan


def _fusable(actor) -> TypeGuard[plan.ComputeOp]:
    return isinstance(actor, plan.ComputeOp) and (
        actor.kernel.data in plan.FUSABLE_KERNELS or actor.kernel.data == plan.FUSED
    )


def _rounded(reg: plan.RegisterOp) -> bool:
    """A 16-bit float value: each op rounds its result to it, so a chain
    that kept it in float32 between steps would compute something else."""
    return isinstance(reg.type.element_type, Float16Type | BFloat16Type)


def _is_intermediate(reg: plan.RegisterOp) -> bool:
    return (reg.feed is None and reg.param is None and reg.constant is None and reg.fetch is None
            and reg.is_persistent is None)


Chain = tuple[list[str], list[plan.FusedStep]]
"""The inputs (register names) and steps of a fused actor, as plain data."""


def merge(p_ins: list[str], p_steps: list[plan.FusedStep], c_ins: list[str], c_steps: list[plan.FusedStep],
          via: str) -> Chain:
    """The inputs and steps of a consumer (`c_ins`, `c_steps`) with its
    producer (`p_ins`, `p_steps`, which writes register `via`) folded in
    front of it."""
    ins = list(p_ins) + [r for r in c_ins if r != via and r not in p_ins]
    n = len(ins)
    # producer: its input i is ins[i]; its step j result is at n + j
    steps = [plan.FusedStep(s.kernel, tuple(a if a < len(p_ins) else n + a - len(p_ins) for a in s.args), s.type)
             for s in p_steps]
    via_index = n + len(p_steps) - 1
    position = {name: i for i, name in reversed(list(enumerate(ins)))}

    def remap(a: int) -> int:
        if a < len(c_ins):
            name = c_ins[a]
            return via_index if name == via else position[name]
        return n + len(p_steps) + a - len(c_ins)

    steps += [plan.FusedStep(s.kernel, tuple(remap(a) for a in s.args), s.type) for s in c_steps]
    return ins, steps


class _StepAttrs:
    """Attributes of fused steps, one per distinct step: a chain's steps
    recur on every rank and in every repeated layer, and building the
    dictionary, string and dense array of each anew was most of the pass."""

    def __init__(self) -> None:
        self._steps: dict[plan.FusedStep, DictionaryAttr] = {}
        self._props: dict[tuple[plan.FusedStep, ...], DictionaryAttr] = {}

    def props(self, steps: list[plan.FusedStep]) -> DictionaryAttr:
        """The props of a fused actor: one per distinct chain (the same
        chain on every rank, in every repeated layer)."""
        key = tuple(steps)
        found = self._props.get(key)
        if found is not None:
            return found
        attrs = []
        for step in steps:
            attr = self._steps.get(step)
            if attr is None:
                attr = self._steps[step] = step.attr()
            attrs.append(attr)
        found = self._props[key] = DictionaryAttr({"steps": ArrayAttr(attrs)})
        return found


def fuse_device(device: plan.DeviceOp, step_attrs: _StepAttrs | None = None) -> int:
    """Fuses the device's elementwise chains; returns how many registers
    went. A chain is built as plain data (`chains`) and written into its
    actor once, when the device is done: rebuilding and re-reading its
    attributes at every fold cost more than the rest of the pass."""
    step_attrs = step_attrs or _StepAttrs()
    register_list, actors = device.contents()
    registers = {r.sym_name.data: r for r in register_list}
    producers: dict[str, plan.ComputeOp | plan.CommOp] = {}
    readers: dict[str, set] = {}
    inputs: dict[plan.ComputeOp | plan.CommOp, list[str]] = {}  # each actor's input names, read once
    # a reference to every register some actor reads: whatever a fused
    # actor reads, an actor read before, so its reference is reused
    refs: dict[str, SymbolRefAttr] = {}
    for actor in actors:
        names = inputs[actor] = []
        for ref in actor.ins.data:
            name = ref.string_value()
            names.append(name)
            refs.setdefault(name, ref)
            readers.setdefault(name, set()).add(actor)
        for ref in actor.outs.data:
            producers[ref.string_value()] = actor
    chains: dict[plan.ComputeOp, Chain] = {}

    def chain(actor: plan.ComputeOp) -> Chain:
        found = chains.get(actor)
        if found is not None:
            return found
        ins = inputs[actor]
        if actor.kernel.data == plan.FUSED:
            return ins, plan.fused_steps(actor)
        out_type = registers[actor.outs.data[0].string_value()].type
        return ins, [plan.FusedStep(actor.kernel.data, tuple(range(len(ins))), out_type)]

    fusable: set[plan.ComputeOp | plan.CommOp] = {actor for actor in actors if _fusable(actor)}
    fused = 0
    for actor in actors:  # producers come first, so chains fold whole
        if actor not in fusable or not isinstance(actor, plan.ComputeOp):
            continue
        changed = True
        while changed:  # folding a producer can leave another input read by this actor alone
            changed = False
            ins = chains[actor][0] if actor in chains else inputs[actor]
            for name in ins:
                producer = producers.get(name)
                if (producer is None or producer is actor or producer not in fusable
                        or readers.get(name) != {actor} or not _is_intermediate(registers[name])
                        or _rounded(registers[name])):
                    continue
                assert isinstance(producer, plan.ComputeOp)  # a fusable actor
                p_ins, p_steps = chain(producer)
                c_ins, c_steps = chain(actor)
                chains[actor] = merge(p_ins, p_steps, c_ins, c_steps, name)
                for r in p_ins:
                    readers[r].discard(producer)
                    readers[r].add(actor)
                chains.pop(producer, None)
                fusable.discard(producer)
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
    if chains:
        kernel = StringAttr(plan.FUSED)
        for actor, (ins, steps) in chains.items():
            actor.ins = ArrayAttr([refs[r] for r in ins])
            actor.kernel = kernel
            actor.props = step_attrs.props(steps)
    return fused


@dataclass(frozen=True)
class PlanFuseElementwisePass(ModulePass):
    name = "plan-fuse-elementwise"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for program in plan.programs(op):
            step_attrs = _StepAttrs()
            for device in program.devices():
                if device.arena is not None:
                    raise PassFailedException(
                        f"'plan.device' @{device.sym_name.data}: the plan is already allocated; "
                        "run plan-fuse-elementwise before plan-allocate-memory"
                    )
                if device.like is None:  # a device like another runs that one's body, fused there
                    fuse_device(device, step_attrs)
