"""`lg-micro-batch{count=K}`: one step runs K micro-batches.

Run before lg-autodiff. Every input of rank >= 1 is a batch of examples
along axis 0; the pass cuts it into K micro-batches (strided: micro-batch k
holds examples k, k+K, k+2K, ..., so a batch split S(0) over the devices
stays local: reshape (B, ...) -> (B/K, K, ...) and take index k of axis 1)
and repeats, once per micro-batch, every op that depends on the batch.
Parameters, constants and what depends only on them are shared. The
batch-dependent outputs (the losses) become the mean of their K copies.

Gradient accumulation then needs no op of its own: lg-autodiff adds up the
contributions of all uses of a parameter, so each weight gradient is the sum
over micro-batches of their gradients, and lg-optimizer makes one update per
step. Because the copies are independent until that sum, the plan can run
micro-batch k+1's forward while k's is still in flight: on pipeline stages
(ops placed on disjoint rank sets with `sbp.placement`) the stages overlap,
in GPipe order (the forwards micro-batch after micro-batch, then the
backwards in reverse), since the one schedule every rank follows is the
program order of the unrolled graph, which the pass makes micro-batch-major.

What must hold (checked, with a diagnostic naming the op): every value that
depends on the batch keeps the batch as its axis 0 (as the leading factor of
axis 0 after a reshape merges it with the axes after it: `view(-1, hidden)`
gives B*T rows, T per example), or is a scalar; outputs
that depend on the batch are scalars that are means over the examples (a
loss), so the mean of the K micro-batch means is the batch's mean, or
ratios of two sums over the batch (a cross-entropy's mean over the labels
not ignored: loss total over count), combined as the ratio of the summed
sums, which is the batch's where the micro-batches count different
numbers of labels. Shapes
written in ops (reshape, broadcast_to, slice limits) have their leading
B*r replaced by (B/K)*r. A dropout's copy records which rows of the batch
it holds, so that it draws the whole batch's mask: micro-batching changes
no random number.

An op that mixes the examples (a running sum along the batch axis, a
softmax across it, a reduction over it that is not a scalar, a matmul that
contracts it: a mixture of experts' capacity counted over the whole batch,
its load-balancing loss, its dispatch into the experts' buffers) is not
repeated: it runs once on the whole batch, joined from the micro-batches'
copies of its operands (their rows put back in the batch's order), so that
it means what it means without micro-batches. A result that keeps each
row where it was (a running sum, a softmax) is cut into micro-batches
again; another (a reduction, a contraction) is one value that every
micro-batch's copies then share, and ops computed from such values alone
run once too. A join waits for every micro-batch's forward up to it, which
the GPipe order allows and 1F1B's (a backward before the last forward)
does not: 1F1B refuses it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from xdsl.context import Context
from xdsl.dialects.builtin import (
    AnyFloat,
    DenseArrayBase,
    DenseIntOrFPElementsAttr,
    IntegerAttr,
    ModuleOp,
    StringAttr,
    TensorType,
    i64,
)
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg, sbp
from sbpc.dialects.lg_analysis import SCHEDULES
from sbpc.dialects.sbp import DTensorType, element_type, global_shape

MICRO_BATCH_ATTR = "lg.micro_batch"
"""Integer attribute: the micro-batch an op of lg-micro-batch's unrolled
graph works on (the ops autodiff adds inherit it through their operands)."""

SCHEDULE_ATTR = "lg.pipeline_schedule"
"""String attribute of a micro-batched lg.graph: the order in which each
pipeline stage runs its micro-batches' forward and backward passes."""


def _retyped(old, shape) -> TensorType | DTensorType:
    if isinstance(old, DTensorType):
        return DTensorType(shape, old.element_type, old.placement_name, old.nd_sbp)
    return TensorType(element_type(old), list(shape))


class Unroller:
    def __init__(self, graph: lg.GraphOp, count: int, schedule: str = "gpipe"):
        self.graph = graph
        self.count = count
        self.schedule = schedule
        self.batch: int | None = None
        self.rows: dict[SSAValue, int] = {}
        """Rows of axis 0 per example of each batch-dependent value (0: a scalar)."""

    def fail(self, op: Operation, why: str) -> PassFailedException:
        return PassFailedException(f"'{op.name}': lg-micro-batch{{count={self.count}}}: {why}")

    def emit(self, op: Operation, before: Operation, placement) -> SSAValue:
        if placement is not None:
            op.attributes[sbp.PLACEMENT_ATTR] = placement
        block = before.parent_block()
        assert block is not None  # `before` is an op of the graph
        block.insert_op_before(op, before)
        return op.results[0]

    def split_input(self, op: lg.InputOp, anchor: Operation) -> list[SSAValue]:
        """Micro-batch k of the input: examples k, k+K, ..."""
        shape = global_shape(op.result.type)
        k = self.count
        if self.batch is None:
            self.batch = shape[0]
        if shape[0] != self.batch:
            raise self.fail(op, f"input \"{op.key.data}\" has {shape[0]} rows but the batch has {self.batch}")
        if shape[0] % k:
            raise self.fail(op, f"the batch of {shape[0]} does not divide into {k} micro-batches")
        return self.cut(op.result, 1, anchor, op.attributes.get(sbp.PLACEMENT_ATTR), op.key.data)

    def cut(self, value: SSAValue, rows: int, anchor: Operation, placement, name: str | None) -> list[SSAValue]:
        """The K micro-batches' parts of a whole-batch value whose axis 0
        holds `rows` rows per example: part k holds examples k, k+K, ..."""
        assert self.batch is not None
        shape = global_shape(value.type)
        k, per = self.count, self.batch // self.count
        rest = [rows, *shape[1:]] if rows > 1 else list(shape[1:])  # an example's rows, as one axis where several
        grouped = self.emit(lg.ReshapeOp(value, [per, k, *rest]), anchor, placement)
        pieces = []
        for i in range(k):
            one = self.emit(lg.SliceOp(grouped, [0, i, *(0 for _ in rest)], [per, i + 1, *rest]), anchor, placement)
            piece = self.emit(lg.ReshapeOp(one, [per * rows, *shape[1:]]), anchor, placement)
            if name:
                piece.name_hint = f"{name}_mb{i}"
            for made in (one, piece):
                assert isinstance(made.owner, Operation)  # emit returns an op's result
                made.owner.attributes[MICRO_BATCH_ATTR] = IntegerAttr(i, i64)
            pieces.append(piece)
        return pieces

    def join(self, parts: list[SSAValue], rows: int, anchor: Operation, placement) -> SSAValue:
        """The whole batch from its micro-batches' parts (`cut` undone):
        example i*K + k is row i of part k."""
        assert self.batch is not None
        per = self.batch // self.count
        rest = list(global_shape(parts[0].type)[1:])
        grouped = [self.emit(lg.ReshapeOp(part, [per, 1, rows, *rest]), anchor, placement) for part in parts]
        together = self.emit(lg.ConcatOp(grouped, 1), anchor, placement)
        return self.emit(lg.ReshapeOp(together, [self.batch * rows, *rest]), anchor, placement)

    def mixes(self, op: Operation) -> str | None:
        """How `op` mixes the examples of its batch-dependent operands, if
        it does: "rows" where its result keeps each row where it was (a
        running sum or a softmax along axis 0), "whole" where its result
        has no rows of examples (a reduction over axis 0 that is not a
        scalar, a matmul that contracts axis 0); None where it works on
        each example alone."""
        first = op.operands[0] if op.operands else None
        if first is None or not self.rows.get(first):
            return None
        shape = global_shape(op.results[0].type)
        if isinstance(op, lg.CumsumOp | lg.AxisOp) and op.params()["axis"] == 0:
            return "rows"
        if isinstance(op, lg.LayerNormOp) and op.params()["axis"] == 0:
            return "rows"
        if isinstance(op, lg.ReduceOp) and 0 in op.axes.get_values() and shape:
            return "whole"
        if isinstance(op, lg.ArgmaxOp | lg.TopkOp) and op.params()["axis"] == 0:
            return "whole"
        if isinstance(op, lg.MatmulOp) and len(global_shape(op.lhs.type)) == 2 == len(global_shape(op.rhs.type)):
            contracted = [o for o, axis in ((op.lhs, 0 if op.transpose_lhs else 1), (op.rhs, 1 if op.transpose_rhs
                                                                                      else 0)) if axis == 0]
            if any(self.rows.get(o) for o in contracted):
                return "whole"
        return None

    def rows_per_example(self, op: Operation) -> int:
        """How many rows of axis 0 of `op`'s result each example owns (0 for a
        scalar), where the result stays batch-major: each example's elements
        one contiguous block, in example order, so that micro-batch k's part
        of axis 0 is its examples' rows. Inputs hold 1 row per example; a
        reshape keeps the order of elements, so its axis 0 may merge the
        batch with the axes after it (Hugging Face's `view(-1, hidden)`:
        B*T rows of B examples); ops that move another axis to the front
        (a transpose, a reduction or concatenation along axis 0, a broadcast
        that adds leading axes) lose it, and are refused."""
        assert self.batch is not None  # the inputs set it before any copy
        shape = global_shape(op.results[0].type)
        if not shape:
            return 0
        major = [(o, self.rows[o]) for o in op.operands if self.rows.get(o)]
        lost = None
        if not major:
            lost = "a batch-dependent scalar"
        elif isinstance(op, lg.ReshapeOp):
            if shape[0] % self.batch == 0:
                return shape[0] // self.batch
            lost = f"a reshape whose axis 0 is not a multiple of the batch of {self.batch}"
        elif isinstance(op, lg.TransposeOp) and op.perm.get_values()[0] != 0:
            lost = "a transpose that moves axis 0"
        elif isinstance(op, lg.ReduceOp) and 0 in op.axes.get_values():
            lost = "a reduction over axis 0"
        elif isinstance(op, lg.ConcatOp) and op.axis.value.data == 0:
            lost = "a concatenation along axis 0"
        elif (lg.is_elementwise(type(op)) or isinstance(op, lg.BroadcastToOp)) and any(
                len(global_shape(o.type)) != len(shape) for o, _ in major):
            lost = "broadcasting that adds axes in front of the batch"
        elif any(shape[0] != self.batch * rows for _, rows in major):
            lost = "an op whose axis 0 is not its batch-dependent operands' axis 0"
        if lost is None:
            return major[0][1]
        raise self.fail(
            op, f"a value that depends on the batch must keep it as axis 0 (size {self.batch}, or a multiple "
            f"after a reshape merges it with the axes after it) or be a scalar: {lost} gives shape {list(shape)}"
        )

    def copy(self, op: Operation, mapping: dict[SSAValue, SSAValue], mixing: str | None = None) -> Operation:
        """`op` on micro-batch operands, with its written shapes and result type
        made per micro-batch. An op that `mixes` the examples is taken as
        it comes only where the pass means to: in `rebatch`, which profiles
        a smaller batch (a batch-norm's statistics over it are what a
        replica's computes)."""
        new = op.clone(value_mapper=dict(mapping))
        assert self.batch is not None  # run splits the inputs, which sets it, before any copy
        old_shape = global_shape(op.results[0].type)
        if mixing == "whole":  # no rows of examples: the shape stays
            rows, shape = 0, tuple(old_shape)
        else:
            rows = self.rows[op.operands[0]] if mixing == "rows" else self.rows_per_example(op)
            shape = (old_shape[0] // self.count, *old_shape[1:]) if old_shape else ()
        if isinstance(op, lg.SliceOp):
            starts, limits = list(op.starts.get_values()), list(op.limits.get_values())
            if starts[0] != 0 or limits[0] != old_shape[0] or op.strides.get_values()[0] != 1:
                raise self.fail(op, "a slice of a batch-dependent value must keep the whole batch axis")
            limits[0] = shape[0]
            new.properties["limits"] = DenseArrayBase.from_list(i64, limits)
        if isinstance(op, lg.LgOp):
            try:
                params = {**op.params(), **self._written(op, shape)}
                shape = tuple(type(op).infer(list(new.operands), **params).get_shape())
            except ValueError as e:
                raise self.fail(op, str(e)) from None
        made = Rewriter.replace_value_with_new_type(new.results[0], _retyped(op.results[0].type, shape))
        self.rows[op.results[0]] = self.rows[made] = rows
        return new

    def draw_as_in_the_batch(self, op: lg.DropoutOp, k: int) -> None:
        """Micro-batch k's copy of a dropout draws what the whole batch's
        would for its rows: its row r is the batch's row of example
        (r / R) * K + k (lg.dropout's micro_batch)."""
        rows = self.rows[op.results[0]]
        if op.params()["micro_batch"] != (1, 0, 1) or not rows:
            raise self.fail(op, "a dropout of a value already cut into micro-batches, or of a scalar that depends "
                            "on the batch, has no row in the batch to draw for")
        op.properties["micro_batch"] = DenseArrayBase.from_list(i64, [self.count, k, rows])

    @staticmethod
    def ratio_of_batch_sums(value: SSAValue, copies: list[dict[SSAValue, SSAValue]]) -> lg.DivOp | None:
        """The division that makes `value` when both its operands are sums
        over the batch axis (a mean over the labels not ignored: their loss
        total over their count), else None."""
        owner = value.owner
        if not isinstance(owner, lg.DivOp):
            return None
        for operand in owner.operands:
            summed = operand.owner
            if (not isinstance(summed, lg.ReduceSumOp) or 0 not in summed.axes.get_values()
                    or global_shape(operand.type) or operand not in copies[0]):
                return None
        return owner

    def combine_ratio(self, value: SSAValue, ratio: lg.DivOp, copies: list[dict[SSAValue, SSAValue]],
                      output: lg.OutputOp, placement) -> SSAValue:
        """The batch's ratio of sums: the micro-batches' numerators summed
        over their denominators summed (the mean of their own ratios would
        weigh a micro-batch with few counted labels as much as one with
        many). Their own ratios, now unused, go."""
        parts = []
        for operand in ratio.operands:
            total = copies[0][operand]
            for k in range(1, self.count):
                total = self.emit(lg.AddOp(total, copies[k][operand]), output, placement)
            parts.append(total)
        combined = self.emit(lg.DivOp(parts[0], parts[1]), output, placement)
        combined.name_hint = value.name_hint
        for k in range(self.count):
            quotient = copies[k][value]
            if not quotient.uses and isinstance(quotient.owner, Operation):
                quotient.owner.detach()
                quotient.owner.erase()
        return combined

    @staticmethod
    def _written(op: Operation, shape) -> dict:
        if isinstance(op, lg.ToShapeOp):
            return {"shape": tuple(shape)}
        if isinstance(op, lg.SliceOp):
            return {"limits": (shape[0], *op.params()["limits"][1:])}
        return {}

    def run(self) -> None:
        output = self.graph.output()
        body = [op for op in self.graph.body.ops if op is not output]
        inputs = [op for op in body if isinstance(op, lg.InputOp) and global_shape(op.result.type)]
        if not inputs:
            raise PassFailedException(
                f"'lg.graph' @{self.graph.sym_name.data}: lg-micro-batch: no input has a batch axis"
            )
        # What does not depend on the batch (parameters, constants, what is
        # computed from them only) moves ahead, in its order, so that each
        # micro-batch's ops can then follow one another: micro-batch 0's
        # whole forward, then micro-batch 1's, ... The one schedule follows
        # program order among ready ops, so stage 0 sends micro-batch 0 on
        # while it computes micro-batch 1: the stages overlap.
        # a random draw whose axis 0 is the batch (drop path's per-sample
        # mask) is cut as an input is: each micro-batch's rows are the batch's
        draws = batch_draws(body, global_shape(inputs[0].result.type)[0])
        dependent = {op.result for op in inputs} | {op.result for op in draws}
        batch_ops = []
        for op in body:
            if not isinstance(op, lg.InputOp) and any(o in dependent for o in op.operands):
                dependent.add(op.results[0])
                batch_ops.append(op)
        for op in batch_ops:
            op.detach()
        copies: list[dict[SSAValue, SSAValue]] = [{} for _ in range(self.count)]
        shared: dict[SSAValue, SSAValue] = {}
        """Whole-batch values that every micro-batch's copies use: the
        results of joins that keep no rows of examples, and what is
        computed from them alone."""
        for op in inputs:
            self.rows[op.result] = 1
            for k, piece in enumerate(self.split_input(op, output)):
                copies[k][op.result] = piece
        for op in draws:
            self.rows[op.result] = 1
            for k, piece in enumerate(self.cut(op.result, 1, output, op.attributes.get(sbp.PLACEMENT_ATTR),
                                               op.result.name_hint)):
                copies[k][op.result] = piece
        segment: list[Operation] = []
        per_micro_batch = {op.result for op in inputs} | {op.result for op in draws}
        """The values (of the whole-batch graph) that each micro-batch has its own copy of."""
        whole_batch: dict[SSAValue, SSAValue] = {v: v for v in per_micro_batch}
        """Such values as the whole batch (a join made once, or a join's result before its cut)."""

        def repeat_segment() -> None:
            """The ops since the last join, once per micro-batch, micro-batch after micro-batch."""
            for k in range(self.count):
                for op in segment:
                    new = self.copy(op, {**shared, **copies[k]})
                    new.attributes[MICRO_BATCH_ATTR] = IntegerAttr(k, i64)
                    if isinstance(new, lg.DropoutOp):
                        self.draw_as_in_the_batch(new, k)
                    if op.results[0].name_hint:
                        new.results[0].name_hint = f"{op.results[0].name_hint}_mb{k}"
                    self.graph.body.block.insert_op_before(new, output)
                    copies[k][op.results[0]] = new.results[0]
            segment.clear()

        for op in batch_ops:
            if not per_micro_batch.intersection(op.operands):  # computed from whole-batch values alone
                repeat_segment()
                once = op.clone(value_mapper=dict(shared))
                self.graph.body.block.insert_op_before(once, output)
                shared.update(zip(op.results, once.results, strict=True))
                continue
            mixing = self.mixes(op)
            if mixing is None:
                self.rows[op.results[0]] = self.rows_per_example(op)  # what the ops after it look at
                per_micro_batch.add(op.results[0])
                segment.append(op)
                continue
            if self.schedule == "1f1b":
                raise self.fail(op, "it mixes the examples of the batch, so it runs once on the whole batch after "
                                "every micro-batch's forward up to it, which the 1f1b schedule (a backward before "
                                "the last forward) cannot order; use gpipe")
            repeat_segment()
            placement = op.attributes.get(sbp.PLACEMENT_ATTR)
            for operand in op.operands:
                if operand in per_micro_batch and operand not in whole_batch:
                    whole_batch[operand] = self.join([c[operand] for c in copies], self.rows[operand], output,
                                                     placement)
            once = op.clone(value_mapper={**shared, **whole_batch})
            self.graph.body.block.insert_op_before(once, output)
            if mixing == "rows":
                rows = self.rows[op.operands[0]]
                self.rows[op.results[0]] = rows
                per_micro_batch.add(op.results[0])
                whole_batch[op.results[0]] = once.results[0]
                for k, piece in enumerate(self.cut(once.results[0], rows, output, placement,
                                                   op.results[0].name_hint)):
                    copies[k][op.results[0]] = piece
                    self.rows[piece] = rows
            else:
                shared[op.results[0]] = once.results[0]
        repeat_segment()
        values = list(output.values)
        for j, value in enumerate(values):
            if value in shared:  # computed once, on the whole batch
                values[j] = shared[value]
                continue
            if value not in copies[0]:
                continue
            name = output.names.data[j].data
            if global_shape(value.type):
                raise self.fail(
                    output, f"output \"{name}\" depends on the batch but is not a scalar; micro-batched outputs "
                    "are averaged, so they must be means over the examples (a loss)"
                )
            owner = value.owner
            placement = owner.attributes.get(sbp.PLACEMENT_ATTR) if isinstance(owner, Operation) else None
            ratio = self.ratio_of_batch_sums(value, copies)
            if ratio is not None:
                values[j] = self.combine_ratio(value, ratio, copies, output, placement)
                continue
            total = copies[0][value]
            for k in range(1, self.count):
                total = self.emit(lg.AddOp(total, copies[k][value]), output, placement)
            # the losses averaged are floats (from_list's overloads take float or integer types)
            scale = cast("TensorType[AnyFloat]", TensorType(element_type(value.type), []))
            inv = self.emit(
                lg.ConstantOp(DenseIntOrFPElementsAttr.from_list(scale, [1.0 / self.count])), output, placement
            )
            values[j] = self.emit(lg.MulOp(total, inv), output, placement)
            values[j].name_hint = value.name_hint
        output.operands = values
        # The whole-batch ops (detached) are now unused; drop them, last first.
        for op in reversed(batch_ops):
            op.erase(safe_erase=False)
        self.graph.attributes[SCHEDULE_ATTR] = StringAttr(self.schedule)


def batch_draws(body, batch: int) -> list[lg.UniformOp]:
    """The random draws whose axis 0 is the batch of `batch` examples."""
    return [op for op in body if isinstance(op, lg.UniformOp) and global_shape(op.result.type)[:1] == (batch,)]


def rebatch(graph: lg.GraphOp, size: int) -> None:
    """The same graph on `size` examples: every input of rank >= 1 gets
    `size` rows and every op that depends on the batch is retyped, its
    written shapes following (as one micro-batch of `batch / size` would
    be). The batch must be a multiple of `size`. sbp-autoplan profiles a
    layer at a data-parallel replica's micro-batch this way."""
    inputs = [op for op in graph.body.ops if isinstance(op, lg.InputOp) and global_shape(op.result.type)]
    if not inputs:
        return
    batch = global_shape(inputs[0].result.type)[0]
    if size < 1 or batch % size:
        raise PassFailedException(f"'lg.graph' @{graph.sym_name.data}: a batch of {batch} has no part of {size}")
    unroller = Unroller(graph, batch // size)
    unroller.batch = batch
    for op in inputs:
        shape = global_shape(op.result.type)
        if shape[0] != batch:
            raise unroller.fail(op, f"input \"{op.key.data}\" has {shape[0]} rows but the batch has {batch}")
        Rewriter.replace_value_with_new_type(op.result, _retyped(op.result.type, (size, *shape[1:])))
        unroller.rows[op.result] = 1
    draws = batch_draws(list(graph.body.ops), batch)
    for draw in draws:
        shape = global_shape(draw.result.type)
        Rewriter.replace_value_with_new_type(draw.result, _retyped(draw.result.type, (size, *shape[1:])))
        unroller.rows[draw.result] = 1
    dependent: set[SSAValue] = {op.result for op in inputs} | {draw.result for draw in draws}
    for each in list(graph.body.ops):
        if isinstance(each, (lg.InputOp, lg.OutputOp)) or not any(o in dependent for o in each.operands):
            continue
        mixing = unroller.mixes(each)
        if mixing is None and global_shape(each.results[0].type) and not any(unroller.rows.get(o)
                                                                            for o in each.operands):
            mixing = "whole"  # computed from such values alone (a batch-norm's statistics, reshaped)
        new = unroller.copy(each, {}, mixing=mixing)
        graph.body.block.insert_op_before(new, each)
        for old, made in zip(each.results, new.results, strict=True):
            old.replace_all_uses_with(made)
            made.name_hint = old.name_hint
            dependent.add(made)
        each.detach()
        each.erase()


@dataclass(frozen=True)
class LgMicroBatchPass(ModulePass):
    name = "lg-micro-batch"

    count: int = 1
    """Micro-batches per step (1: no change)."""
    schedule: str = "gpipe"
    """How pipeline stages order the micro-batches (recorded on the graph
    for sbp-to-plan): `gpipe`, every forward then every backward (the
    activations of all micro-batches live at once), or `1f1b` (stage s of S
    runs S-1-s forwards ahead, then one backward per forward: at most S-s
    micro-batches' activations live on it)."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.count < 1:
            raise PassFailedException(f"lg-micro-batch: count must be at least 1, got {self.count}")
        if self.schedule not in SCHEDULES:
            raise PassFailedException(
                f"lg-micro-batch: unknown schedule '{self.schedule}' (known: {', '.join(SCHEDULES)})")
        if self.count == 1:
            return
        for graph in lg.graphs(op):
            Unroller(graph, self.count, self.schedule).run()
