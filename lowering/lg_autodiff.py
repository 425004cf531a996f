"""`lg-autodiff`: appends the backward graph of a scalar loss.

Walks the graph from the loss output backwards, applying each op's gradient
rule (its `gradient` method, defined with the op in dialects/lg/), adding up the contributions where a
value has several uses, and appends an output `grad.<param>` for every
parameter the loss is computed from (zeros where its derivative is zero);
one outside the loss has none, as a PyTorch parameter's .grad stays None,
and no optimizer moves it. On a graph that
lg-micro-batch unrolled for 1F1B, what the micro-batches share (a weight)
has its gradient summed in micro-batch order, the order a stage's
backward passes make the parts. SBP hints pass
gradients through unchanged; sbp-infer then distributes forward and
backward together (in data parallelism every weight gradient comes out P).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import cast

from xdsl.context import Context
from xdsl.dialects.builtin import AnyFloat, DenseIntOrFPElementsAttr, IntegerAttr, ModuleOp, StringAttr, TensorType
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg, sbp
from sbpc.dialects.sbp import element_type, global_shape, tensor_type

from .lg_micro_batch import MICRO_BATCH_ATTR, SCHEDULE_ATTR


class Emitter:
    """Appends gradient ops before the graph's output. Every op it emits is
    placed where `placement` says (the forward op's `sbp.placement`), so a
    pipeline stage's backward runs on that stage."""

    def __init__(self, anchor: Operation):
        self.anchor = anchor
        self.placement: Attribute | None = None
        # (id(type), the value's exact bits as float.hex: -0.0 is not 0.0)
        # -> (the type, the dense attribute of that one value): gradient
        # rules ask for the same few constants in every layer, and
        # attributes are immutable (the entry keeps the type alive)
        self.dense: dict[tuple[int, str], tuple[TensorType, DenseIntOrFPElementsAttr]] = {}

    def place_like(self, op: Operation) -> None:
        self.placement = op.attributes.get(sbp.PLACEMENT_ATTR)

    def emit(self, op: Operation) -> SSAValue:
        if self.placement is not None:
            op.attributes[sbp.PLACEMENT_ATTR] = self.placement
        block = self.anchor.parent_block()
        assert block is not None  # the anchor is the graph's output op, always in the graph's block
        block.insert_op_before(op, self.anchor)
        return op.results[0]

    def constant(self, shape, like: SSAValue, value: float) -> SSAValue:
        # a float tensor: the values gradients take (from_list's overloads take float or integer types)
        t = cast("TensorType[AnyFloat]", tensor_type(element_type(like.type), shape))
        key = (id(t), float(value).hex())
        known = self.dense.get(key)
        if known is None or known[0] is not t:
            known = self.dense[key] = (t, DenseIntOrFPElementsAttr.from_list(t, [float(value)]))
        return self.emit(lg.ConstantOp(known[1]))

    def scalar(self, value: float, like: SSAValue) -> SSAValue:
        return self.constant((), like, value)

    def zeros(self, shape, like: SSAValue) -> SSAValue:
        return self.constant(shape, like, 0.0)

    def swap_last(self, value: SSAValue) -> SSAValue:
        rank = len(global_shape(value.type))
        return self.emit(lg.TransposeOp(value, [*range(rank - 2), rank - 1, rank - 2]))

    def unbroadcast(self, grad: SSAValue, shape) -> SSAValue:
        """Sums a gradient over the axes numpy broadcasting added or expanded."""
        have = global_shape(grad.type)
        shape = tuple(shape)
        if have == shape:
            return grad
        lead = len(have) - len(shape)
        axes = [*range(lead), *(i for i in range(lead, len(have)) if shape[i - lead] == 1 and have[i] != 1)]
        if axes:
            grad = self.emit(lg.ReduceSumOp(grad, axes, keepdims=True))
        if global_shape(grad.type) != shape:
            grad = self.emit(lg.ReshapeOp(grad, shape))
        return grad

    def unsupported(self, op: Operation, what: str) -> PassFailedException:
        return PassFailedException(f"'{op.name}': lg-autodiff cannot differentiate {what}")


def differentiate(graph: lg.GraphOp, loss: str) -> None:
    output = graph.output()
    names = [n.data for n in output.names.data]
    if loss not in names:
        raise PassFailedException(f"'lg.graph' @{graph.sym_name.data}: no output named \"{loss}\" to differentiate")
    loss_value = output.values[names.index(loss)]
    if global_shape(loss_value.type) != ():
        raise PassFailedException(
            f"'lg.graph' @{graph.sym_name.data}: the loss \"{loss}\" must be a scalar, got shape "
            f"{list(global_shape(loss_value.type))}"
        )
    e = Emitter(output)
    forward = [op for op in graph.body.ops if op is not output]
    if isinstance(loss_value.owner, Operation):
        e.place_like(loss_value.owner)
    grads: dict[SSAValue, SSAValue] = {loss_value: e.scalar(1.0, loss_value)}
    # Under 1F1B a stage runs micro-batch 0's backward first, so a weight's
    # gradient is summed in micro-batch order (((dW0 + dW1) + dW2) + ...),
    # each sum as soon as its parts exist: the reverse walk's order would
    # keep every micro-batch's dW alive until the last one's backward.
    schedule = graph.attributes.get(SCHEDULE_ATTR)
    in_order = isinstance(schedule, StringAttr) and schedule.data == "1f1b"
    parts: dict[SSAValue, list[tuple[int, SSAValue, Attribute | None]]] = {}

    def settle(value: SSAValue) -> None:
        for _, contribution, placement in sorted(parts.pop(value, []), key=lambda part: part[0]):
            e.placement = placement
            grads[value] = e.emit(lg.AddOp(grads[value], contribution)) if value in grads else contribution

    # Only float values computed from parameters get gradients: a loss's
    # normalizer counted from the labels (an imported cross-entropy's
    # ignore_index mean), a mask or a position table gets none, and neither
    # does an integer (a router's choices, a count) nor what is computed
    # from one alone (their one-hot).
    trained: set[SSAValue] = set()
    for op in forward:
        if (isinstance(op, lg.ParamOp) and op.trained) or any(o in trained for o in op.operands):
            trained.update(r for r in op.results if lg.is_float(element_type(r.type)))

    # What the loss is computed from through float values: a parameter
    # outside it has no gradient, as in PyTorch (its .grad stays None, and
    # no optimizer moves it, not even by weight decay: a pooler a masked-LM
    # loss never reads); one inside it whose derivative is zero (through
    # trunc, or a product with zero) has a zero gradient, as in PyTorch.
    reaches: set[SSAValue] = {loss_value}
    for op in reversed(forward):
        if any(r in reaches for r in op.results) and not isinstance(op, lg.StopGradientOp):
            reaches.update(o for o in op.operands if o in trained)

    for op in reversed(forward):
        if op.results:
            settle(op.results[0])  # shared ops come before every micro-batch's: all parts are in
        if not op.results or op.results[0] not in grads or op.results[0] not in trained or isinstance(
                op, lg.InputOp | lg.ParamOp | lg.ConstantOp):
            continue
        e.place_like(op)
        g = grads[op.results[0]]
        if isinstance(op, sbp.AnnotateOp):
            contributions: list[SSAValue | None] = [g]
        else:
            if not isinstance(op, lg.LgOp) or not op.differentiable():
                raise e.unsupported(op, "this op (no gradient rule)")
            contributions = op.gradient(g, e)
        for operand, contribution in zip(op.operands, contributions):
            if contribution is None or operand not in trained:
                continue
            micro = op.attributes.get(MICRO_BATCH_ATTR)
            owner = operand.owner
            shared = isinstance(owner, Operation) and MICRO_BATCH_ATTR not in owner.attributes
            if in_order and shared and isinstance(micro, IntegerAttr):
                parts.setdefault(operand, []).append((micro.value.data, contribution, e.placement))
                continue
            if operand in grads:
                grads[operand] = e.emit(lg.AddOp(grads[operand], contribution))
            else:
                grads[operand] = contribution
    for value in list(parts):
        settle(value)  # the parameters (sources are not walked)
    values, out_names = list(output.values), list(names)
    for op in forward:
        if isinstance(op, lg.ParamOp) and op.trained and op.result in reaches:
            grad = grads.get(op.result)
            if grad is None:
                e.place_like(op)
                grad = e.zeros(global_shape(op.result.type), op.result)
            values.append(grad)
            out_names.append(f"grad.{op.key.data}")
    new_output = lg.OutputOp(values, out_names)
    graph.body.block.insert_op_before(new_output, output)
    output.detach()
    output.erase()
    backward = set(graph.body.ops) - set(forward)
    fold_spreads([op for op in graph.body.ops if op in backward and isinstance(op, lg.BroadcastToOp)])


def fold_spreads(spreads: list[lg.BroadcastToOp]) -> None:
    """A reduction's gradient is spread back over the reduced axes
    (lg.broadcast_to); where an elementwise op of two operands reads the
    spread and its other operand has the whole shape, the op broadcasts the
    reduced value itself: one pass over the tensor and one buffer fewer,
    the same values (batch normalization's backward: 42 spreads a step of
    the ResNet bench). A spread left with no reader goes."""
    for spread in spreads:
        whole = global_shape(spread.result.type)
        for use in list(spread.result.uses):
            op = use.operation
            if not isinstance(op, lg.AddOp | lg.SubOp | lg.MulOp | lg.DivOp):
                continue
            other = op.operands[1 - use.index]
            if other is spread.result or global_shape(other.type) != whole:
                continue
            op.operands[use.index] = spread.input
        if not spread.result.uses:
            spread.detach()
            spread.erase()


@dataclass(frozen=True)
class LgAutodiffPass(ModulePass):
    name = "lg-autodiff"

    loss: str = "loss"
    """The output to differentiate (a scalar)."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for graph in lg.graphs(op):
            differentiate(graph, self.loss)


