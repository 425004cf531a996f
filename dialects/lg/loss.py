"""Losses: cross-entropy (from logits and integer labels), mean squared
error, and the row statistics of Megatron's cross-entropy over logits
split by class. In SBP terms each row's max (lg.reduce_max: a partial max)
and sum of exponentials (lg.sum_exp: a partial sum) are reduced across the
class shards, and the loss of a row takes its target logit from the shard
that holds it. No device forms a one-hot row of the vocabulary, forward or
backward."""

from __future__ import annotations

import math
from abc import ABC
from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import I64, IntegerAttr, i64
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import operand_def, opt_prop_def, result_def, traits_def
from xdsl.traits import Pure

from ..irdl_verify import op_definition
from ..sbp import TensorLike, element_type, global_shape
from .base import LgOp, Shape, ShapeError, Signature, is_index, require_float, same_element_type, split_ok
from .elementwise import ExpOp, MulOp, NegOp, SubOp
from .index import OneHotOp
from .norm import SoftmaxOp
from .shape import ReshapeOp


def _logits_and_labels_rule(shapes: Sequence[Shape], elems: Sequence[Attribute]) -> None:
    """Float logits [..., C] and integer labels [...] of a cross-entropy."""
    logits, labels = shapes[:2]
    if len(logits) < 1:
        raise ShapeError("logits must have a class axis")
    require_float("logits", elems[0])
    if not is_index(elems[1]):
        raise ShapeError(f"labels must be i32 or i64, got {elems[1]}")
    if labels != logits[:-1]:
        raise ShapeError(
            f"labels shape {list(labels)} must be the logits shape without its class axis {list(logits[:-1])}"
        )


@op_definition
class CrossEntropyOp(LgOp):
    """Mean softmax cross-entropy: logits [..., C], integer labels [...]."""

    KERNEL_KIND: ClassVar[str] = "row"

    name = "lg.cross_entropy"

    logits = operand_def(TensorLike)
    labels = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$logits `,` $labels attr-dict `:` functional-type(operands, results)"

    def __init__(self, logits: SSAValue, labels: SSAValue):
        super().__init__(operands=[logits, labels], result_types=[self.infer([logits, labels])])

    @classmethod
    def rule(cls, shapes, elems, **params):
        _logits_and_labels_rule(shapes, elems)
        return (), elems[0]

    FLOPS_PER_ELEMENT: ClassVar[float] = 6.0
    SBP_NOTE: ClassVar[str] = (
        "class-split logits (S on the class axis) are not supported: they need a distributed "
        "max and sum-exp reduction; split the batch instead"
    )

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        """Split batch axes give partial sums of the mean (each device divides
        its local sum by the global count)."""
        logits, _ = in_shapes
        sigs = [((f"S{i}", f"S{i}"), ("P",)) for i, d in enumerate(logits[:-1]) if split_ok(d, p)]
        return sigs + [(("B", "B"), ("B",))]

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return cls.FLOPS_PER_ELEMENT * math.prod(in_shapes[0])

    def gradient(self, g, e):
        logits, labels = self.logits, self.labels
        count = math.prod(global_shape(labels.type)) or 1
        probs = e.emit(SoftmaxOp(logits, len(global_shape(logits.type)) - 1))
        onehot = e.emit(OneHotOp(labels, global_shape(logits.type)[-1], element_type(logits.type)))
        scaled = e.emit(MulOp(g, e.scalar(1.0 / count, g)))
        return [e.emit(MulOp(e.emit(SubOp(probs, onehot)), scaled)), None]


@op_definition
class MseLossOp(LgOp):
    """Mean squared error of two tensors of one shape."""

    KERNEL_KIND: ClassVar[str] = "row"

    name = "lg.mse_loss"

    lhs = operand_def(TensorLike)
    rhs = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$lhs `,` $rhs attr-dict `:` functional-type(operands, results)"

    def __init__(self, lhs: SSAValue, rhs: SSAValue):
        super().__init__(operands=[lhs, rhs], result_types=[self.infer([lhs, rhs])])

    @classmethod
    def rule(cls, shapes, elems, **params):
        if shapes[0] != shapes[1]:
            raise ShapeError(f"operands must have one shape, got {list(shapes[0])} and {list(shapes[1])}")
        return (), same_element_type(elems)

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        sigs = [((f"S{i}", f"S{i}"), ("P",)) for i, d in enumerate(in_shapes[0]) if split_ok(d, p)]
        return sigs + [(("B", "B"), ("B",))]

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return 3.0 * math.prod(in_shapes[0])

    def gradient(self, g, e):
        count = math.prod(global_shape(self.lhs.type)) or 1
        diff = e.emit(SubOp(self.lhs, self.rhs))
        da = e.emit(MulOp(diff, e.emit(MulOp(g, e.scalar(2.0 / count, g)))))
        return [da, e.emit(NegOp(da))]


def _row_statistics_rule(what: str, row_shape: Shape, elem: Attribute, logits: Shape, logits_elem: Attribute) -> None:
    if row_shape != logits[:-1]:
        raise ShapeError(f"{what} shape {list(row_shape)} must be the logits shape without its class axis "
                         f"{list(logits[:-1])}")
    if elem != logits_elem:
        raise ShapeError(f"{what} must be {logits_elem} as the logits are, got {elem}")


def _row_signatures(in_shapes: Sequence[Shape], p: int, class_split: Signature, partial_ok: bool) -> list[Signature]:
    """Signatures of an op over rows of logits [..., C] and per-row operands:
    a split row axis splits every operand and the result alike; a split
    class axis (with the per-row operands whole) gives `class_split`."""
    logits = in_shapes[0]
    count = len(in_shapes)
    sigs: list[Signature] = [((f"S{i}",) * count, (f"S{i}",)) for i, d in enumerate(logits[:-1]) if split_ok(d, p)]
    if logits and split_ok(logits[-1], p):
        sigs.append(class_split)
    return sigs + [(("B",) * count, ("B",))] + ([(("B",) * (count - 1) + ("P",), ("P",))] if partial_ok else [])


@op_definition
class SumExpOp(LgOp):
    """Each row's sum of exponentials, sum_c exp(x[..., c] - shift[...]),
    over the last axis: x [..., C], shift [...] (the row's max, so that no
    term overflows) -> [...]. With x split over its last axis each device
    sums the classes it holds: a partial sum."""

    KERNEL_KIND: ClassVar[str] = "row"

    name = "lg.sum_exp"

    input = operand_def(TensorLike)
    shift = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$input `,` $shift attr-dict `:` functional-type(operands, results)"

    def __init__(self, input: SSAValue, shift: SSAValue):
        super().__init__(operands=[input, shift], result_types=[self.infer([input, shift])])

    @classmethod
    def rule(cls, shapes, elems, **params):
        x, shift = shapes
        if len(x) < 1:
            raise ShapeError("operand must have an axis to sum over")
        require_float("operand", elems[0])
        _row_statistics_rule("shift", shift, elems[1], x, elems[0])
        return x[:-1], elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        last = len(in_shapes[0]) - 1
        return _row_signatures(in_shapes, p, ((f"S{last}", "B"), ("P",)), partial_ok=False)

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return 3.0 * math.prod(in_shapes[0])

    def gradient(self, g, e):
        x_shape = global_shape(self.input.type)
        rows = (*x_shape[:-1], 1)
        shifted = e.emit(SubOp(self.input, e.emit(ReshapeOp(self.shift, rows))))
        dx = e.emit(MulOp(e.emit(ExpOp(shifted)), e.emit(ReshapeOp(g, rows))))
        return [dx, e.emit(NegOp(e.emit(MulOp(self.result, g))))]


class _TokenCrossEntropyBase(LgOp, ABC):
    """What the per-token cross-entropy and its gradient share. Each
    declares its operands itself (logits, labels, row_max, sum_exp, and the
    gradient's grad last): IRDL orders a subclass's fields first."""

    KERNEL_KIND: ClassVar[str] = "row"

    @property
    def ignored(self) -> int | None:
        """The label whose rows give no loss and no gradient, if any."""
        attr = self.properties.get("ignore_index")
        return attr.value.data if isinstance(attr, IntegerAttr) else None

    @staticmethod
    def _props(ignore_index: int | None) -> dict[str, Attribute]:
        return {} if ignore_index is None else {"ignore_index": IntegerAttr(ignore_index, i64)}

    @classmethod
    def _check_operands(cls, shapes, elems) -> None:
        logits, _, row_max, sum_exp = shapes[:4]
        _logits_and_labels_rule(shapes, elems)
        _row_statistics_rule("row_max", row_max, elems[2], logits, elems[0])
        _row_statistics_rule("sum_exp", sum_exp, elems[3], logits, elems[0])


@op_definition
class TokenCrossEntropyOp(_TokenCrossEntropyBase):
    """Each row's cross-entropy -log softmax(logits)[label] = log(sum_exp) +
    row_max - logits[label], from logits [..., C], integer labels [...] and
    the row statistics lg.reduce_max and lg.sum_exp computed of these
    logits -> [...]; a row whose label is `ignore_index` gives 0.

    With the logits split over classes, the device holding a row's label
    subtracts its logit and the device holding class 0 adds log(sum_exp) +
    row_max: a partial sum. The gradient for the logits is the whole
    derivative, softmax minus one-hot through the statistics too
    (lg.token_cross_entropy_grad), so the statistics get none: they must be
    those of the logits."""

    name = "lg.token_cross_entropy"

    logits = operand_def(TensorLike)
    labels = operand_def(TensorLike)
    row_max = operand_def(TensorLike)
    sum_exp = operand_def(TensorLike)
    ignore_index = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$logits `,` $labels `,` $row_max `,` $sum_exp (`ignore` $ignore_index^)? attr-dict `:` "
        "functional-type(operands, results)"
    )

    def __init__(self, logits: SSAValue, labels: SSAValue, row_max: SSAValue, sum_exp: SSAValue,
                 ignore_index: int | None = None):
        operands = [logits, labels, row_max, sum_exp]
        super().__init__(operands=operands, properties=self._props(ignore_index),
                         result_types=[self.infer(operands)])

    @classmethod
    def rule(cls, shapes, elems, **params):
        cls._check_operands(shapes, elems)
        return shapes[1], elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        last = len(in_shapes[0]) - 1
        return _row_signatures(in_shapes, p, ((f"S{last}", "B", "B", "B"), ("P",)), partial_ok=False)

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return 4.0 * math.prod(out_shape)

    def gradient(self, g, e):
        return [e.emit(TokenCrossEntropyGradOp(self.logits, self.labels, self.row_max, self.sum_exp, g,
                                               self.ignored)), None, None, None]


@op_definition
class TokenCrossEntropyGradOp(_TokenCrossEntropyBase):
    """The gradient of lg.token_cross_entropy for its logits: row r is
    grad[r] * (exp(logits[r] - row_max[r]) / sum_exp[r] - one_hot(label[r])),
    and 0 where the label is `ignore_index`. With the logits split over
    classes each device writes its classes; only the device holding a
    row's label subtracts grad[r] there."""

    name = "lg.token_cross_entropy_grad"

    logits = operand_def(TensorLike)
    labels = operand_def(TensorLike)
    row_max = operand_def(TensorLike)
    sum_exp = operand_def(TensorLike)
    grad = operand_def(TensorLike)
    ignore_index = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$logits `,` $labels `,` $row_max `,` $sum_exp `,` $grad (`ignore` $ignore_index^)? attr-dict `:` "
        "functional-type(operands, results)"
    )

    def __init__(self, logits: SSAValue, labels: SSAValue, row_max: SSAValue, sum_exp: SSAValue, grad: SSAValue,
                 ignore_index: int | None = None):
        operands = [logits, labels, row_max, sum_exp, grad]
        super().__init__(operands=operands, properties=self._props(ignore_index),
                         result_types=[self.infer(operands)])

    @classmethod
    def rule(cls, shapes, elems, **params):
        cls._check_operands(shapes, elems)
        _row_statistics_rule("grad", shapes[4], elems[4], shapes[0], elems[0])
        return shapes[0], elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        """Linear in the incoming gradient: a partial gradient under whole
        logits gives a partial result."""
        last = len(in_shapes[0]) - 1
        return _row_signatures(in_shapes, p, ((f"S{last}", "B", "B", "B", "B"), (f"S{last}",)), partial_ok=True)

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return 4.0 * math.prod(out_shape)
