"""Elementwise arithmetic: unary ops of one float tensor and binary ops
with numpy broadcasting. Each carries the `Elementwise` trait, so a chain
of them is one kernel (plan-fuse-elementwise)."""

from __future__ import annotations

from abc import ABC
from typing import ClassVar

from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import VarConstraint, operand_def, result_def, traits_def
from xdsl.traits import Pure

from ..irdl_verify import op_definition
from ..sbp import TensorLike, global_shape
from .base import (
    Elementwise,
    LgOp,
    ShapeError,
    Signature,
    aligned_splits,
    broadcast_shapes,
    is_index,
    passthrough_signatures,
    require_float,
    same_element_type,
)


class UnaryOp(LgOp, ABC):
    """An elementwise op of one float tensor; the result has the operand's type."""

    T: ClassVar = VarConstraint("T", TensorLike)
    input = operand_def(T)
    result = result_def(T)

    traits = traits_def(Pure(), Elementwise())

    assembly_format = "$input attr-dict `:` type($input)"

    def __init__(self, input: SSAValue):
        super().__init__(operands=[input], result_types=[input.type])

    PARTIALS: ClassVar[tuple[str, ...]] = ()
    """Partial kinds the op keeps: "P" where it is linear, "Pmax" where it is
    monotone non-decreasing (f(max x) = max f(x))."""

    @classmethod
    def rule(cls, shapes, elems, **params):
        require_float("operand", elems[0])
        return shapes[0], elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        return aligned_splits(in_shapes, out_shape, p) + passthrough_signatures(1, cls.PARTIALS)


@op_definition
class NegOp(UnaryOp):
    name = "lg.neg"
    PARTIALS: ClassVar[tuple[str, ...]] = ("P",)

    def gradient(self, g, e):
        return [e.emit(NegOp(g))]


@op_definition
class ReluOp(UnaryOp):
    name = "lg.relu"
    PARTIALS: ClassVar[tuple[str, ...]] = ("Pmax",)

    def gradient(self, g, e):
        # where the output is positive, as where the input is (NaN in neither),
        # so the backward keeps the output it reads anyway and not the input:
        # a chain ending in the relu then fuses it (batch normalization's)
        return [e.emit(MulOp(g, e.emit(StepOp(self.result))))]


@op_definition
class GeluOp(UnaryOp):
    """GELU, tanh form: 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))."""

    name = "lg.gelu"
    FLOPS_PER_ELEMENT: ClassVar[float] = 8.0

    def gradient(self, g, e):
        x = self.input
        k, c = 0.7978845608028654, 0.044715
        x2 = e.emit(MulOp(x, x))
        x3 = e.emit(MulOp(x2, x))
        inner = e.emit(MulOp(e.emit(AddOp(x, e.emit(MulOp(x3, e.scalar(c, x))))), e.scalar(k, x)))
        t = e.emit(TanhOp(inner))
        one_plus_t = e.emit(AddOp(t, e.scalar(1.0, x)))
        sech2 = e.emit(SubOp(e.scalar(1.0, x), e.emit(MulOp(t, t))))
        dinner = e.emit(MulOp(e.emit(AddOp(e.emit(MulOp(x2, e.scalar(3 * c, x))), e.scalar(1.0, x))), e.scalar(k, x)))
        d = e.emit(AddOp(e.emit(MulOp(one_plus_t, e.scalar(0.5, x))),
                         e.emit(MulOp(e.emit(MulOp(e.emit(MulOp(x, sech2)), dinner)), e.scalar(0.5, x)))))
        return [e.emit(MulOp(g, d))]


@op_definition
class TanhOp(UnaryOp):
    name = "lg.tanh"
    PARTIALS: ClassVar[tuple[str, ...]] = ("Pmax",)
    FLOPS_PER_ELEMENT: ClassVar[float] = 4.0

    def gradient(self, g, e):
        return [e.emit(MulOp(g, e.emit(SubOp(e.scalar(1.0, g), e.emit(MulOp(self.result, self.result))))))]


@op_definition
class ErfOp(UnaryOp):
    """The error function; GELU's exact form is 0.5 x (1 + erf(x / sqrt 2))
    (PyTorch's default `nn.GELU()`), which the torch frontend builds from it."""

    name = "lg.erf"
    PARTIALS: ClassVar[tuple[str, ...]] = ("Pmax",)
    FLOPS_PER_ELEMENT: ClassVar[float] = 8.0

    def gradient(self, g, e):
        # d/dx erf(x) = 2 / sqrt(pi) exp(-x^2)
        x = self.input
        gauss = e.emit(ExpOp(e.emit(NegOp(e.emit(MulOp(x, x))))))
        return [e.emit(MulOp(g, e.emit(MulOp(gauss, e.scalar(1.1283791670955126, x)))))]


@op_definition
class ExpOp(UnaryOp):
    name = "lg.exp"
    PARTIALS: ClassVar[tuple[str, ...]] = ("Pmax",)
    FLOPS_PER_ELEMENT: ClassVar[float] = 4.0

    def gradient(self, g, e):
        return [e.emit(MulOp(g, self.result))]


@op_definition
class SqrtOp(UnaryOp):
    """No Pmax: a device's candidate may lie outside sqrt's domain."""

    name = "lg.sqrt"
    FLOPS_PER_ELEMENT: ClassVar[float] = 4.0

    def gradient(self, g, e):
        return [e.emit(DivOp(e.emit(MulOp(g, e.scalar(0.5, g))), self.result))]


@op_definition
class RsqrtOp(UnaryOp):
    name = "lg.rsqrt"
    FLOPS_PER_ELEMENT: ClassVar[float] = 4.0

    def gradient(self, g, e):
        cube = e.emit(MulOp(self.result, e.emit(MulOp(self.result, self.result))))
        return [e.emit(MulOp(e.emit(MulOp(g, e.scalar(-0.5, g))), cube))]


@op_definition
class LogOp(UnaryOp):
    """The natural logarithm (log2, log10, log1p and pow's general case
    are composed from it by the importer). No Pmax, as sqrt: a device's
    candidate may lie outside its domain."""

    name = "lg.log"
    FLOPS_PER_ELEMENT: ClassVar[float] = 4.0

    def gradient(self, g, e):
        return [e.emit(DivOp(g, self.input))]


@op_definition
class SinOp(UnaryOp):
    name = "lg.sin"
    FLOPS_PER_ELEMENT: ClassVar[float] = 4.0

    def gradient(self, g, e):
        return [e.emit(MulOp(g, e.emit(CosOp(self.input))))]


@op_definition
class CosOp(UnaryOp):
    name = "lg.cos"
    FLOPS_PER_ELEMENT: ClassVar[float] = 4.0

    def gradient(self, g, e):
        return [e.emit(NegOp(e.emit(MulOp(g, e.emit(SinOp(self.input))))))]


@op_definition
class AtanOp(UnaryOp):
    """The arctangent (asin, acos and atan2 are composed from it)."""

    name = "lg.atan"
    PARTIALS: ClassVar[tuple[str, ...]] = ("Pmax",)
    FLOPS_PER_ELEMENT: ClassVar[float] = 8.0

    def gradient(self, g, e):
        x = self.input  # 1 / (1 + x^2)
        return [e.emit(DivOp(g, e.emit(AddOp(e.emit(MulOp(x, x)), e.scalar(1.0, x)))))]


class _RoundingOp(UnaryOp, ABC):
    """An integer-valued rounding of a float: monotone, so a P<max> stays
    one, and flat almost everywhere, so no gradient flows (PyTorch's is zero)."""

    PARTIALS: ClassVar[tuple[str, ...]] = ("Pmax",)

    def gradient(self, g, e):
        return [None]


@op_definition
class FloorOp(_RoundingOp):
    name = "lg.floor"


@op_definition
class CeilOp(_RoundingOp):
    name = "lg.ceil"


@op_definition
class RoundOp(_RoundingOp):
    """To the nearest integer, halves to even (PyTorch's `round`, numpy's `rint`)."""

    name = "lg.round"


@op_definition
class TruncOp(_RoundingOp):
    """Toward zero."""

    name = "lg.trunc"


@op_definition
class StepOp(UnaryOp):
    """Heaviside step: 1 where x > 0, else 0 (relu's derivative)."""

    name = "lg.step"

    def gradient(self, g, e):
        return [None]  # zero almost everywhere


@op_definition
class StopGradientOp(UnaryOp):
    """The operand itself, through which no gradient flows (PyTorch's
    `detach`): what is computed from it is a constant to lg-autodiff.
    The identity keeps every partial kind."""

    name = "lg.stop_gradient"

    PARTIALS: ClassVar[tuple[str, ...]] = ("P", "Pmax")

    def gradient(self, g, e):
        return [None]


class BinaryOp(LgOp, ABC):
    """An elementwise op of two float tensors with numpy broadcasting."""

    lhs = operand_def(TensorLike)
    rhs = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure(), Elementwise())

    assembly_format = "$lhs `,` $rhs attr-dict `:` functional-type(operands, results)"

    def __init__(self, lhs: SSAValue, rhs: SSAValue, result_type: Attribute | None = None):
        super().__init__(operands=[lhs, rhs], result_types=[result_type or self.infer([lhs, rhs])])

    PARTIAL_SIGNATURES: ClassVar[tuple[Signature, ...]] = ()
    """Signatures with partial operands, where the op is linear (P) or
    monotone (Pmax) in them."""

    INTEGERS: ClassVar[bool] = False
    """Whether i32/i64 operands are taken too (exact integer arithmetic:
    positions counted from masks); their results get no gradient."""

    @classmethod
    def rule(cls, shapes, elems, **params):
        if cls.INTEGERS and is_index(elems[0]):
            if any(e != elems[0] for e in elems[1:]):
                raise ShapeError(f"operands must share one element type, got {', '.join(map(str, elems))}")
            return broadcast_shapes(*shapes), elems[0]
        return broadcast_shapes(*shapes), same_element_type(elems)

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        return aligned_splits(in_shapes, out_shape, p) + [(("B", "B"), ("B",)), *cls.PARTIAL_SIGNATURES]


@op_definition
class AddOp(BinaryOp):
    name = "lg.add"
    INTEGERS: ClassVar[bool] = True
    PARTIAL_SIGNATURES: ClassVar[tuple[Signature, ...]] = (
        (("P", "P"), ("P",)),
        (("Pmax", "B"), ("Pmax",)),
        (("B", "Pmax"), ("Pmax",)),
    )

    def gradient(self, g, e):
        return [e.unbroadcast(g, global_shape(self.lhs.type)), e.unbroadcast(g, global_shape(self.rhs.type))]


@op_definition
class SubOp(BinaryOp):
    name = "lg.sub"
    INTEGERS: ClassVar[bool] = True
    PARTIAL_SIGNATURES: ClassVar[tuple[Signature, ...]] = ((("P", "P"), ("P",)), (("Pmax", "B"), ("Pmax",)))

    def gradient(self, g, e):
        return [e.unbroadcast(g, global_shape(self.lhs.type)),
                e.unbroadcast(e.emit(NegOp(g)), global_shape(self.rhs.type))]


@op_definition
class MulOp(BinaryOp):
    name = "lg.mul"
    INTEGERS: ClassVar[bool] = True
    PARTIAL_SIGNATURES: ClassVar[tuple[Signature, ...]] = ((("P", "B"), ("P",)), (("B", "P"), ("P",)))

    def gradient(self, g, e):
        return [e.unbroadcast(e.emit(MulOp(g, self.rhs)), global_shape(self.lhs.type)),
                e.unbroadcast(e.emit(MulOp(g, self.lhs)), global_shape(self.rhs.type))]


@op_definition
class DivOp(BinaryOp):
    name = "lg.div"
    PARTIAL_SIGNATURES: ClassVar[tuple[Signature, ...]] = ((("P", "B"), ("P",)),)
    FLOPS_PER_ELEMENT: ClassVar[float] = 4.0

    def gradient(self, g, e):
        quotient = e.emit(NegOp(e.emit(DivOp(e.emit(MulOp(g, self.result)), self.rhs))))
        return [e.unbroadcast(e.emit(DivOp(g, self.rhs)), global_shape(self.lhs.type)),
                e.unbroadcast(quotient, global_shape(self.rhs.type))]


@op_definition
class FloorDivOp(BinaryOp):
    """Integer division rounded down (toward minus infinity), of i32 or i64
    operands: Python's `//`, PyTorch's `floor_divide` and its `div` with
    `rounding_mode="floor"` on integers (a sorted position's token,
    `perm // top_k`). A zero divisor gives 0 (PyTorch raises). Not linear,
    so no partial operand passes; floats divide with lg.div then lg.floor."""

    name = "lg.floordiv"
    INTEGERS: ClassVar[bool] = True

    @classmethod
    def rule(cls, shapes, elems, **params):
        if not is_index(elems[0]):
            raise ShapeError(f"operands must be i32 or i64 (floats: lg.div, then lg.floor), got {elems[0]}")
        return super().rule(shapes, elems, **params)

    def gradient(self, g, e):
        return [None, None]  # integers carry no gradient
