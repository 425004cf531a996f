"""The list scheduler sbp-to-plan orders a graph's ops with, and the
sbp-bucket-collectives' timing replays: one topological order, the same in
both, in which communication starts as early as its input allows and
compute that reads a collective's result waits as long as it can."""

from __future__ import annotations

import functools
import heapq
from collections.abc import Callable

from xdsl.ir import Block, Operation
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg, sbp
from sbpc.dialects.lg_analysis import RECOMPUTE_ATTR


def schedule(ops: list[Operation], slot: Callable[[Operation], int] | None = None,
             stream_per_group: bool = False) -> list[Operation]:
    """Topological order by list scheduling. Operands made by ops outside
    `ops` count as ready (a pipeline stage's inputs from another stage).
    With `slot`, a ready op of a lower slot always goes first (a pipeline
    schedule's phase). Then, among ready ops: communication first; then
    compute that feeds communication (so it starts early); then other
    compute; last, compute that reads the result of a collective (so
    the collective has work to overlap with; a local slice is no
    collective, so an optimizer update that reads the slice of its
    parameter runs as soon as its gradient is ready, and the communication
    of its result overlaps the rest of the backward pass). Where the
    device runs each group's collectives on a stream of its own
    (`stream_per_group`, NCCL), one issued later may finish first (a
    tensor-parallel all-reduce beside a queue of gradient reductions): of
    the last, the one with the longer chain of ops behind it goes first
    (the backward pass before the updates behind the gradients'
    reductions), then the one whose collective was issued first; a leaf
    (the loss) before them all, as it is the last read of what the
    backward reads too. On one lane (the MPI runtime) they finish in the
    order they are issued, and program order keeps to it. Other ties in
    program order. Gates hold back what would be ready too soon and stay
    live: compute made from parameters and constants alone (a parameter's
    cast for its update), FSDP's parameter gathers and recomputed ops."""
    # by id: ops hash in Python, ints in C (every op is alive during the call)
    index = {id(op): i for i, op in enumerate(ops)}
    comm = [sbp.is_collective(type(op)) for op in ops]
    # per op (by index): the indices of its operands' producers among `ops`,
    # one per operand (an op reading a value twice waits for it twice)
    producers: list[list[int]] = []
    user_indices: list[list[int]] = [[] for _ in ops]
    for i, op in enumerate(ops):
        made_by = []
        for operand in op.operands:
            p = index.get(id(operand.owner))  # an owner may be a block: never in `index`
            if p is not None:
                made_by.append(p)
                user_indices[p].append(i)
        producers.append(made_by)

    def priority(i: int) -> int:
        if comm[i]:
            return 0
        if any(comm[p] and sbp.communicates(type(ops[p])) for p in producers[i]):
            return 3
        if any(comm[u] for u in user_indices[i]):
            return 1
        return 2

    waiting = [len(made_by) for made_by in producers]
    # A pipeline's stages keep their phases' order (the rules below are for
    # one stage's step: its waits for collectives and its parameters' copies).
    staged = slot is not None or any(isinstance(op, sbp.TransferOp) for op in ops)
    by_level = stream_per_group and not staged
    # The longest chain of ops behind each op (HLFET's level; program order
    # is topological, and so far `user_indices` holds the data flow only).
    level = [0] * len(ops)
    if by_level:
        for i in reversed(range(len(ops))):
            level[i] = 1 + max((level[u] for u in user_indices[i]), default=0)
    gated = {} if staged else _made_from_state(ops, comm, producers, user_indices)
    has_gathers = any(is_comm and isinstance(op.operands[0].owner, lg.ParamOp) for op, is_comm in zip(ops, comm))
    has_recomputations = any(RECOMPUTE_ATTR in op.attributes for op in ops)
    if has_gathers or has_recomputations:  # (rare: the gates read the graph by op)
        op_index: dict[Operation | Block, int] = {op: i for i, op in enumerate(ops)}
        is_comm = dict(zip(ops, comm))
        users = {op: [ops[u] for u in user_indices[i]] for i, op in enumerate(ops)}
        gates = _parameter_gathers(ops, op_index, is_comm, users) if has_gathers else {}
        if has_recomputations:
            gates.update(_recomputations(ops, op_index, is_comm, users))
        for head, gate in gates.items():
            gated[op_index[head]] = {op_index[op] for op in gate}
    for head_index, gate_indices in gated.items():
        for g in gate_indices:
            user_indices[g].append(head_index)
        waiting[head_index] += len(gate_indices)

    position = [0] * len(ops)
    """Each op's place in the order, once placed (its producers are, when it is ready)."""

    def key(i: int) -> tuple[int, int, int, int, int]:  # ties in program order: the index is unique
        p = priority(i)
        if p != 3 or not by_level:
            return (slot(ops[i]) if slot is not None else 0, p, 0, 0, i)
        issued = max(position[q] for q in producers[i] if comm[q] and sbp.communicates(type(ops[q])))
        if level[i] == 1:  # a leaf (the loss): the last read of what it waits for, which the backward reads too
            return (0, p, -len(ops).bit_length() - 1, issued, i)
        return (0, p, -level[i].bit_length(), issued, i)

    ready = [key(i) for i in range(len(ops)) if not waiting[i]]
    heapq.heapify(ready)
    order: list[Operation] = []
    while ready:
        i = heapq.heappop(ready)[-1]
        position[i] = len(order)
        order.append(ops[i])
        for user in user_indices[i]:
            waiting[user] -= 1
            if not waiting[user]:
                heapq.heappush(ready, key(user))
    if len(order) != len(ops):
        stuck = next(op for i, op in enumerate(ops) if waiting[i])
        raise PassFailedException(f"sbp-to-plan: no schedule: '{stuck.name}' waits on a cycle")
    return order


@functools.cache
def source_kind(kind: type) -> type | None:
    """lg.InputOp, lg.ParamOp or lg.ConstantOp where an op of class `kind`
    is one (its register is a feed, a parameter or a constant), else None;
    once per class (op classes are ABCs: isinstance is slow per op)."""
    return next((k for k in (lg.InputOp, lg.ParamOp, lg.ConstantOp) if issubclass(kind, k)), None)


def _parameter_gathers(ops, index, is_comm, users) -> dict[Operation, set[Operation]]:
    """For each redistribution of a parameter (FSDP's gather): the ops it
    waits for. A parameter is ready from the start, so without a gate its
    gather would run first and the gathered copy would stay live until its
    use. It is issued one op ahead of its use instead: once the producers of
    the inputs of the use's other operands have run, so the gather overlaps
    the op that makes the use's activation."""
    chain: set[Operation] = set()
    heads = []
    for op in ops:
        if is_comm[op]:
            owner = op.operands[0].owner
            if isinstance(owner, lg.ParamOp):
                chain.add(op)
                heads.append(op)
            elif owner in chain:
                chain.add(op)
    gates: dict[Operation, set[Operation]] = {}
    for head in heads:
        consumers: list[Operation] = []
        todo = [head]
        while todo:
            for user in users[todo.pop()]:
                (todo if user in chain else consumers).append(user)
        gate: set[Operation] = set()
        for consumer in consumers:
            for operand in consumer.operands:
                producer = operand.owner
                if (
                    not isinstance(producer, Operation)
                    or producer not in index
                    or producer in chain
                    or isinstance(producer, lg.ParamOp)
                ):
                    continue
                earlier = [o.owner for o in producer.operands if isinstance(o.owner, Operation) and o.owner in index]
                gate.update(earlier or [producer])
        # What needs the gathered value cannot gate the gather (a cycle). Program
        # order is topological, so only the first consumer and later ops can.
        first = min(index[c] for c in consumers) if consumers else len(ops)
        if any(index[op] >= first for op in gate):
            after, todo = set(), list(consumers)
            while todo:
                op = todo.pop()
                if op not in after:
                    after.add(op)
                    todo.extend(users[op])
            gate -= after
        if gate:
            gates[head] = gate
    return gates


def _recomputations(ops, index, is_comm, users) -> dict[Operation, set[Operation]]:
    """For each op lg-recompute made (`lg.recompute`): the ops it waits for.
    Its inputs are ready early (kept activations), so without a gate it
    would run as soon as the backward pass starts, and its result would
    stay live as long as the original it replaces. It waits instead for
    the producers of the other operands of the backward ops that read it
    (through other recomputed ops and their redistributions), so it runs
    just before them. Only producers earlier in program order than the
    recomputed op gate it (later ones may depend on it: a cycle); a later
    producer is replaced by its own earlier producers."""
    chain = {op for op in ops if RECOMPUTE_ATTR in op.attributes}
    for op in ops:  # redistributions of a recomputed value belong to it
        if is_comm[op] and op.operands and op.operands[0].owner in chain:
            chain.add(op)
    gates: dict[Operation, set[Operation]] = {}
    for head in (op for op in ops if RECOMPUTE_ATTR in op.attributes):
        consumers: set[Operation] = set()
        todo = [head]
        passed: set[Operation] = set()
        visited = {head}
        while todo:
            for user in users[todo.pop()]:
                if user in visited:
                    continue
                visited.add(user)
                if user in chain:
                    todo.append(user)
                elif all(_from_chain_or_source(o, chain, passed, index) for o in user.operands):
                    passed.add(user)  # a reshape of the value for its use: wait for what the use needs
                    todo.append(user)
                else:
                    consumers.add(user)
        gate: set[Operation] = set()
        seen: set[Operation] = set(passed)
        producers = [o.owner for c in consumers for o in c.operands]
        while producers:
            p = producers.pop()
            if not isinstance(p, Operation) or p not in index or p in chain or p in seen:
                continue
            seen.add(p)
            if index[p] < index[head]:
                gate.add(p)
            else:
                producers.extend(o.owner for o in p.operands)
        if gate:
            gates[head] = gate
    return gates


def _from_chain_or_source(value, chain: set[Operation], passed: set[Operation], index) -> bool:
    owner = value.owner
    return owner in chain or owner in passed or not isinstance(owner, Operation) or owner not in index or isinstance(
        owner, (lg.InputOp, lg.ParamOp, lg.ConstantOp))


def _made_from_state(ops: list[Operation], comm: list[bool], producers: list[list[int]],
                     user_indices: list[list[int]]) -> dict[int, set[int]]:
    """For compute made from parameters and constants alone (a parameter's
    cast for its update, a weight's transpose), by index: the ops it waits
    for. Ready from the start, it would run first and its result stay live
    until its use (an f32 copy of every bf16 weight held through the step).
    It waits instead for the producers of the other operands of its first
    user outside such chains; a producer later in program order than it
    (which may depend on it) is replaced by its own producers."""
    state = [source_kind(op.__class__) in (lg.ParamOp, lg.ConstantOp) for op in ops]
    chain = [False] * len(ops)
    heads = []
    for i, op in enumerate(ops):  # program order is topological
        made_by = producers[i]
        if state[i] or not made_by or len(made_by) != len(op.operands):
            continue  # (an operand made outside `ops` is no parameter of this stage)
        if all(state[p] or chain[p] for p in made_by):
            if not any(chain[p] for p in made_by):
                if comm[i]:
                    continue  # a parameter's own redistribution: _parameter_gathers
                heads.append(i)
            chain[i] = True
    gates: dict[int, set[int]] = {}
    for head in heads:
        first = len(ops)
        todo = [head]
        seen = {head}
        while todo:
            for user in user_indices[todo.pop()]:
                if user not in seen:
                    seen.add(user)
                    if chain[user]:
                        todo.append(user)
                    else:
                        first = min(first, user)
        if first == len(ops):
            continue
        # ready for its first user: a chain many use (an update's step
        # count) waits for the first of them, not the last
        gate: set[int] = set()
        more = list(producers[first])
        while more:
            p = more.pop()
            if p in seen or chain[p] or state[p]:
                continue
            seen.add(p)
            if p < head:
                gate.add(p)
            else:
                more.extend(producers[p])
        if gate:
            gates[head] = gate
    return gates
