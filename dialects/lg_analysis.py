"""Analyses of an lg training graph that several layers read:
lg-recompute (which values to keep), the autoplan search (where to cut a
graph into layers and stages, what a layer saves for its backward) and
sbp-to-plan's pipeline schedule."""

from __future__ import annotations

from xdsl.ir import Operation, SSAValue
from xdsl.utils.exceptions import PassFailedException

from . import lg
from .sbp import global_shape

OPTIMIZER_STATE_PREFIXES = ("adam.m.", "adam.v.", "momentum.")
"""How the keys of a parameter's optimizer state begin (the parameter's
key follows): lg-optimizer names them so, and ZeRO, the planner and the
API's checkpoints find them by it."""

ADAM_STEP_KEY = "adam.step"
"""Adam's step count (i64 state), from which its bias corrections are computed."""

OPTIMIZER_STATE_KEYS = (*OPTIMIZER_STATE_PREFIXES, ADAM_STEP_KEY)

LEARNING_RATE = "lr"
"""The input lg-optimizer's update reads its learning rate from (a scalar,
so schedules stay outside the graph)."""
TYPICAL_LEARNING_RATE = 1e-3
"""What a feed of it stands at where the caller gives none (sbp-run's generated feeds)."""
"""Every parameter key the optimizer adds begins so."""

SCHEDULES = ("gpipe", "1f1b")
"""The pipeline schedules lg-micro-batch records and the planner tries."""

RECOMPUTE_ATTR = "lg.recompute"
"""Unit attribute of an op that lg-recompute cloned to repeat a forward
value for the backward pass: the list schedule runs it just before its use."""

SOURCES = (lg.InputOp, lg.ParamOp, lg.ConstantOp)
"""Ops that compute nothing: what a graph reads."""


def owner_op(value: SSAValue) -> Operation | None:
    """The op that makes `value` (None: a block argument)."""
    return value.owner if isinstance(value.owner, Operation) else None


def forward_ops(graph: lg.GraphOp, loss: str, user: str = "lg-recompute") -> set[Operation]:
    """The ops the output `loss` depends on: the forward pass. `user` names
    who asked, for the error where there is no such output."""
    output = graph.output()
    names = [n.data for n in output.names.data]
    if loss not in names:
        raise PassFailedException(
            f"'lg.graph' @{graph.sym_name.data}: {user}: no output named \"{loss}\" (the forward pass is "
            f"what it depends on)")
    return lg.ancestors([output.values[names.index(loss)]])


def saved_values(graph: lg.GraphOp, forward: set[Operation]) -> list[SSAValue]:
    """Results of forward compute ops that an op outside the forward pass
    reads, in program order, leaving out what the graph outputs."""
    saved = []
    for op in graph.body.ops:
        if op not in forward or isinstance(op, SOURCES):
            continue
        for v in op.results:
            users = [u.operation for u in v.uses]
            if any(isinstance(u, lg.OutputOp) for u in users):
                continue
            if any(u not in forward for u in users):
                saved.append(v)
    return saved


def narrow_cuts(order: list[Operation]) -> list[set[SSAValue]]:
    """crossing[i]: the non-scalar values made at or before order[i] and read
    after it (by the ops of `order`)."""
    pos = {op: i for i, op in enumerate(order)}
    data = data_ops(order)
    last_use: dict[SSAValue, int] = {}
    for op in order:
        for v in op.operands:
            if owner_op(v) in pos and owner_op(v) not in data and global_shape(v.type) != ():
                last_use[v] = max(last_use.get(v, -1), pos[op])
    crossing: list[set[SSAValue]] = []
    live: set[SSAValue] = set()
    for i, op in enumerate(order):
        live.update(v for v in op.results if last_use.get(v, -1) > i)
        live = {v for v in live if last_use[v] > i}
        crossing.append(set(live))
    return crossing


def data_ops(order: list[Operation]) -> set[Operation]:
    """Ops computed from inputs and constants alone (a micro-batch's slice
    of the batch, one-hot labels): data, not activations. The slices of
    every micro-batch are made up front and cross every cut until their
    micro-batch runs; they do not make a cut wide."""
    data: set[Operation] = set()
    for op in order:
        if all(isinstance(owner_op(v), (lg.InputOp, lg.ConstantOp)) or owner_op(v) in data for v in op.operands):
            data.add(op)
    return data


def one_f_one_b(stage: int, stages: int, micro_batches: int) -> dict[tuple[bool, int], int]:
    """The 1F1B order of a stage (PipeDream-Flush, Megatron-LM's default;
    `lg.schedule = "1f1b"`): stage s of S runs min(S-1-s, M) forwards ahead,
    then alternates one forward and one backward, then the remaining
    backwards. Maps (is_backward, micro-batch) to its place in that order."""
    ahead = min(stages - 1 - stage, micro_batches)
    order = [(False, k) for k in range(ahead)]
    for k in range(micro_batches - ahead):
        order += [(False, ahead + k), (True, k)]
    order += [(True, k) for k in range(micro_batches - ahead, micro_batches)]
    return {phase: i for i, phase in enumerate(order)}
