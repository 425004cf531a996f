"""Booleans, integers and casts: masks computed from the inputs (logical
and comparison ops, select) and element-type casts."""

from __future__ import annotations

from abc import ABC
from typing import ClassVar

from xdsl.dialects.builtin import StringAttr, TensorType, i1
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import operand_def, prop_def, result_def, traits_def
from xdsl.traits import Pure

from ..irdl_verify import op_definition
from ..sbp import TensorLike, element_type, global_shape
from .base import LgOp, ShapeError, aligned_splits, broadcast_shapes, is_bool, is_float, require_value_type


@op_definition
class CastOp(LgOp):
    """Elementwise conversion to another element type, as PyTorch's
    `.to(dtype)`: float to integer truncates toward zero, anything to i1 is
    `!= 0`, i1 to a number is 0 or 1. The gradient flows between float types
    only (an integer or boolean has none)."""

    name = "lg.cast"

    input = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, elem: Attribute):
        super().__init__(operands=[input], result_types=[TensorType(elem, global_shape(input.type))])

    def params(self):
        return {"elem": element_type(self.result.type)}

    @classmethod
    def rule(cls, shapes, elems, elem):
        require_value_type("operand", elems[0])
        require_value_type("result", elem)
        return shapes[0], elem

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, elem):
        return aligned_splits(in_shapes, out_shape, p) + [(("B",), ("B",))]

    def gradient(self, g, e):
        if not (is_float(element_type(self.input.type)) and is_float(element_type(self.result.type))):
            return [None]
        return [e.emit(CastOp(g, element_type(self.input.type)))]


class _KindedBinaryOp(LgOp, ABC):
    """An elementwise op of two tensors with numpy broadcasting whose
    `kind` (one of KINDS) says what it computes; no gradient flows through
    it (its result is boolean)."""

    lhs = operand_def(TensorLike)
    rhs = operand_def(TensorLike)
    kind = prop_def(StringAttr)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$kind $lhs `,` $rhs attr-dict `:` functional-type(operands, results)"

    KINDS: ClassVar[tuple[str, ...]] = ()

    def __init__(self, kind: str, lhs: SSAValue, rhs: SSAValue):
        props = {"kind": StringAttr(kind)}
        super().__init__(operands=[lhs, rhs], properties=props,
                         result_types=[self.infer([lhs, rhs], kind=kind)])

    def params(self):
        return {"kind": self.kind.data}

    @classmethod
    def _check_kind(cls, kind: str) -> None:
        if kind not in cls.KINDS:
            raise ShapeError(f"kind must be one of {', '.join(cls.KINDS)}, got '{kind}'")

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, kind):
        return aligned_splits(in_shapes, out_shape, p) + [(("B", "B"), ("B",))]

    def gradient(self, g, e):
        return [None, None]


LOGICAL_KINDS = ("and", "or", "xor")


@op_definition
class LogicalOp(_KindedBinaryOp):
    """Elementwise `and`, `or` or `xor` of two i1 tensors, with numpy
    broadcasting (`not x` is `x xor true`)."""

    name = "lg.logical"
    KINDS: ClassVar[tuple[str, ...]] = LOGICAL_KINDS

    @classmethod
    def rule(cls, shapes, elems, kind):
        cls._check_kind(kind)
        for elem in elems:
            if not is_bool(elem):
                raise ShapeError(f"operands must be i1, got {elem}")
        return broadcast_shapes(*shapes), elems[0]


COMPARE_KINDS = ("eq", "ne", "lt", "le", "gt", "ge")


@op_definition
class CompareOp(_KindedBinaryOp):
    """Elementwise comparison `eq`, `ne`, `lt`, `le`, `gt` or `ge` of two
    tensors of one element type, with numpy broadcasting: an i1 tensor
    (PyTorch's `==`, `<`, ... on tensors: causal and padding masks built
    from positions, the count of labels not ignored)."""

    name = "lg.compare"
    KINDS: ClassVar[tuple[str, ...]] = COMPARE_KINDS

    @classmethod
    def rule(cls, shapes, elems, kind):
        cls._check_kind(kind)
        require_value_type("operands", elems[0])
        if elems[0] != elems[1]:
            raise ShapeError(f"operands must share one element type, got {elems[0]}, {elems[1]}")
        return broadcast_shapes(*shapes), i1


@op_definition
class SelectOp(LgOp):
    """`where`: elementwise, `if_true` where the i1 condition holds and
    `if_false` elsewhere, all three broadcast as in numpy."""

    name = "lg.select"

    condition = operand_def(TensorLike)
    if_true = operand_def(TensorLike)
    if_false = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$condition `,` $if_true `,` $if_false attr-dict `:` functional-type(operands, results)"

    def __init__(self, condition: SSAValue, if_true: SSAValue, if_false: SSAValue):
        super().__init__(operands=[condition, if_true, if_false],
                         result_types=[self.infer([condition, if_true, if_false])])

    @classmethod
    def rule(cls, shapes, elems, **params):
        if not is_bool(elems[0]):
            raise ShapeError(f"condition must be i1, got {elems[0]}")
        require_value_type("values", elems[1])
        if elems[1] != elems[2]:
            raise ShapeError(f"values must share one element type, got {elems[1]}, {elems[2]}")
        return broadcast_shapes(*shapes), elems[1]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        """Linear in the two values together: partial values under one whole
        condition stay partial."""
        return aligned_splits(in_shapes, out_shape, p) + [(("B", "B", "B"), ("B",)), (("B", "P", "P"), ("P",))]

    def gradient(self, g, e):
        zero = e.scalar(0.0, g)
        return [None,
                e.unbroadcast(e.emit(SelectOp(self.condition, g, zero)), global_shape(self.if_true.type)),
                e.unbroadcast(e.emit(SelectOp(self.condition, zero, g)), global_shape(self.if_false.type))]
