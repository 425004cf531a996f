"""`lg-recompute{policy=selective|full loss=loss}`: activation recomputation.

Run on a training step (after lg-autodiff; before or after lg-optimizer),
before sbp-infer. A forward activation that the backward pass reads (a
*saved* value) occupies memory from the moment the forward pass makes it
until its gradient is taken, which for the first layers is the whole step.
The pass trades compute for that memory: for each saved value it chooses
not to keep, it clones the forward op that makes it (and, under `full`, the
forward ops that op needs in turn) just before the first backward op that
reads it, and points the backward reads at the clone. The original is then
dead once the forward pass is done with it.

Policies:

- `selective` (Megatron-LM's selective recomputation in spirit): every saved
  value made by an op that is cheap to repeat (anything but a contraction:
  elementwise ops, GELU, softmax, layernorm, reshapes) from operands that
  are kept anyway (parameters, inputs, or saved values that are not
  recomputed) is recomputed. The GEMMs run once; the activations between
  them that cost a pass over memory are not kept.
- `full` (checkpointing, as `torch.utils.checkpoint` per block): only the
  checkpoints are kept, the values that alone cross a cut of the forward
  pass (in a transformer the residual stream between blocks; in general
  the values crossing the cuts that the fewest values cross; slices of
  the input data do not count). Every other saved
  value is recomputed from the checkpoint before it, GEMMs included: about
  one more forward pass, and memory for the checkpoints plus one segment.
  The last segment (from the last checkpoint to the loss) is kept: its
  backward starts at once.
- `none`: nothing (for the planner's uniformity).

Values the graph outputs are never recomputed (they live to the end
anyway). Clones carry the unit attribute `lg.recompute`; sbp-to-plan's
schedule holds such an op back until the other operands of the backward op
that reads it are ready, so the recomputation runs just before its use
rather than as soon as its inputs exist. The values computed are the same
(every lg op is deterministic); only the memory and the time change.
"""

from __future__ import annotations

from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp, UnitAttr
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg
from sbpc.dialects.lg_analysis import (
    RECOMPUTE_ATTR,
    SOURCES,
    data_ops,
    forward_ops,
    narrow_cuts,
    owner_op,
    saved_values,
)

POLICIES = ("none", "selective", "full")

CONTRACTIONS = (lg.MatmulOp,)
"""Ops `selective` never repeats: their cost grows faster than their result."""


def checkpoints(order: list[Operation]) -> tuple[set[SSAValue], int]:
    """The values `full` keeps, and the position in `order` (the forward
    ops) of the last cut they cross: those crossing the narrowest cuts (the
    fewest values crossing; a transformer's residual stream between blocks,
    one checkpoint per block as Megatron-LM's full recomputation keeps).
    Keeping only about sqrt(n) of n such cuts (Chen et al. 2016) needed
    more memory on the GPTs measured, not less: a segment of several blocks
    is recomputed, and held, at once."""
    crossing = narrow_cuts(order)
    counts = [len(c) for c in crossing if c]
    if not counts:
        return set(), -1
    fewest = min(counts)
    narrow = [i for i, c in enumerate(crossing) if c and len(c) == fewest]
    return set().union(*(crossing[i] for i in narrow)), narrow[-1]


def recompute(graph: lg.GraphOp, loss: str, policy: str) -> int:
    """Applies `policy` to `graph`; returns the number of ops cloned."""
    if policy == "none":
        return 0
    forward = forward_ops(graph, loss)
    saved = saved_values(graph, forward)
    saved_set = set(saved)
    index = {op: i for i, op in enumerate(graph.body.ops)}
    # The batch itself (what inputs and constants alone make: a micro-batch's
    # slice, one-hot labels) is kept, never recomputed: it is no activation,
    # and a clone of a whole-batch reshape would serve every micro-batch's
    # backward at once, tying a pipeline stage's first backward to its last.
    data = data_ops([op for op in graph.body.ops if op in forward and not isinstance(op, SOURCES)])
    if policy == "selective":
        again: set[SSAValue] = set()
        for v in saved:
            op = owner_op(v)
            assert op is not None  # a saved value is an op's result
            if isinstance(op, CONTRACTIONS) or op in data:
                continue
            if all(_kept(u, forward, again, saved_set) for u in op.operands):
                again.add(v)
        keep = set(saved) - again
    else:
        order = [op for op in graph.body.ops if op in forward and not isinstance(op, SOURCES)]
        keep, last_cut = checkpoints(order)
        tail = set(order[last_cut + 1:]) if last_cut >= 0 else set(order)
        again = {v for v in saved if v not in keep and owner_op(v) not in tail and owner_op(v) not in data}
        keep |= {v for v in saved if v not in again}
    keep |= {r for op in data for r in op.results}
    clones: dict[SSAValue, SSAValue] = {}

    def clone_of(value: SSAValue, anchor: Operation) -> SSAValue:
        if value in clones:
            return clones[value]
        op = owner_op(value)
        assert op is not None
        mapper = {u: clone_of(u, anchor) for u in op.operands if _recomputable(u, forward, keep)}
        new = op.clone(value_mapper=mapper)
        new.attributes[RECOMPUTE_ATTR] = UnitAttr()
        block = anchor.parent_block()
        assert block is not None
        block.insert_op_before(new, anchor)
        for old, made in zip(op.results, new.results, strict=True):
            made.name_hint = f"{old.name_hint}_again" if old.name_hint else "again"  # %a, %a_again
            clones[old] = made
        return clones[value]

    def first_backward_use(v: SSAValue) -> Operation:
        return min((u.operation for u in v.uses if u.operation not in forward), key=index.__getitem__)

    for v in sorted(again, key=lambda v: index[first_backward_use(v)]):
        anchor = first_backward_use(v)
        made = clone_of(v, anchor)
        for use in list(v.uses):
            user = use.operation
            if user not in forward and RECOMPUTE_ATTR not in user.attributes:
                user.operands[use.index] = made
    return len({id(c.owner) for c in clones.values()})


def _kept(value: SSAValue, forward: set[Operation], again: set[SSAValue], saved: set[SSAValue]) -> bool:
    """Whether `selective` may read `value` from a clone: it is alive in the
    backward pass anyway (a source, or a saved value that is kept)."""
    op = owner_op(value)
    if op is None or op not in forward or isinstance(op, SOURCES):
        return True
    return value not in again and value in saved


def _recomputable(value: SSAValue, forward: set[Operation], keep: set[SSAValue]) -> bool:
    op = owner_op(value)
    return op is not None and op in forward and not isinstance(op, SOURCES) and value not in keep


@dataclass(frozen=True)
class LgRecomputePass(ModulePass):
    name = "lg-recompute"

    policy: str = "selective"
    """`selective` (repeat the cheap ops between GEMMs), `full` (keep only
    checkpoints between blocks) or `none`."""
    loss: str = "loss"
    """The output the forward pass computes."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.policy not in POLICIES:
            raise PassFailedException(
                f"lg-recompute: unknown policy '{self.policy}' (known: {', '.join(POLICIES)})")
        for graph in lg.graphs(op):
            recompute(graph, self.loss, self.policy)
