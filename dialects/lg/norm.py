"""Normalizations along one axis: softmax, log_softmax and layernorm."""

from __future__ import annotations

from abc import ABC
from typing import ClassVar

from xdsl.dialects.builtin import I64, Float64Type, FloatAttr, IntegerAttr, f64, i64
from xdsl.ir import SSAValue
from xdsl.irdl import (
    AttrSizedOperandSegments,
    VarConstraint,
    operand_def,
    opt_operand_def,
    prop_def,
    result_def,
    traits_def,
)
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from ..irdl_verify import op_definition
from ..sbp import TensorLike, global_shape
from .base import (
    LgOp,
    ShapeError,
    aligned_splits,
    check_axis,
    passthrough_signatures,
    require_float,
    same_element_type,
    split_ok,
)
from .elementwise import AddOp, ExpOp, MulOp, RsqrtOp, SubOp
from .reduce import ReduceMeanOp, ReduceSumOp


class AxisOp(LgOp, ABC):
    """softmax-like: normalizes along one axis; the result has the operand's type."""

    KERNEL_KIND: ClassVar[str] = "row"

    T: ClassVar = VarConstraint("T", TensorLike)
    input = operand_def(T)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(T)

    traits = traits_def(Pure())

    assembly_format = "$input `axis` $axis attr-dict `:` type($input)"

    def __init__(self, input: SSAValue, axis: int):
        axis = axis % max(len(global_shape(input.type)), 1)
        super().__init__(operands=[input], properties={"axis": IntegerAttr(axis, i64)}, result_types=[input.type])

    def params(self):
        return {"axis": self.axis.value.data}

    FLOPS_PER_ELEMENT: ClassVar[float] = 5.0

    @classmethod
    def rule(cls, shapes, elems, axis):
        require_float("operand", elems[0])
        check_axis(axis, len(shapes[0]))
        return shapes[0], elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axis):
        sigs = [sig for sig in aligned_splits(in_shapes, out_shape, p) if sig[1][0] != f"S{axis}"]
        return sigs + passthrough_signatures(1, ())


@op_definition
class SoftmaxOp(AxisOp):
    name = "lg.softmax"

    def gradient(self, g, e):
        dot = e.emit(ReduceSumOp(e.emit(MulOp(g, self.result)), [self.axis.value.data], keepdims=True))
        return [e.emit(MulOp(self.result, e.emit(SubOp(g, dot))))]


@op_definition
class LogSoftmaxOp(AxisOp):
    name = "lg.log_softmax"

    def gradient(self, g, e):
        total = e.emit(ReduceSumOp(g, [self.axis.value.data], keepdims=True))
        return [e.emit(SubOp(g, e.emit(MulOp(e.emit(ExpOp(self.result)), total))))]


@op_definition
class LayerNormOp(LgOp):
    """Normalizes over the axes `axis..rank-1` (ONNX LayerNormalization); with
    `weight` and `bias` (affine) it then scales and shifts, both shaped like
    the normalized axes."""

    KERNEL_KIND: ClassVar[str] = "row"

    name = "lg.layernorm"

    T: ClassVar = VarConstraint("T", TensorLike)
    input = operand_def(T)
    weight = opt_operand_def(TensorLike)
    bias = opt_operand_def(TensorLike)
    axis = prop_def(IntegerAttr[I64])
    epsilon = prop_def(FloatAttr[Float64Type])
    result = result_def(T)

    traits = traits_def(Pure())
    irdl_options = (AttrSizedOperandSegments(as_property=True),)

    assembly_format = (
        "$input (`weight` $weight^ `:` type($weight))? (`bias` $bias^ `:` type($bias))? "
        "`axis` $axis `eps` $epsilon attr-dict `:` type($input)"
    )

    def __init__(
        self,
        input: SSAValue,
        axis: int,
        epsilon: float = 1e-5,
        weight: SSAValue | None = None,
        bias: SSAValue | None = None,
    ):
        axis = axis % max(len(global_shape(input.type)), 1)
        super().__init__(
            operands=[input, [weight] if weight else [], [bias] if bias else []],
            properties={"axis": IntegerAttr(axis, i64), "epsilon": FloatAttr(epsilon, f64)},
            result_types=[input.type],
        )

    FLOPS_PER_ELEMENT: ClassVar[float] = 8.0

    def params(self):
        return {"axis": self.axis.value.data, "affine": self.weight is not None, "has_bias": self.bias is not None}

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axis, affine, has_bias):
        """Split any axis before the normalized ones; weight and bias stay whole."""
        extra = ("B",) * (len(in_shapes) - 1)
        sigs = [((f"S{i}", *extra), (f"S{i}",)) for i in range(axis) if split_ok(out_shape[i], p)]
        return sigs + [(("B", *extra), ("B",))]

    @classmethod
    def rule(cls, shapes, elems, axis, affine, has_bias):
        x = shapes[0]
        check_axis(axis, len(x))
        if affine != has_bias:
            raise ShapeError("an affine layernorm needs both weight and bias")
        for what, shape in zip(("weight", "bias"), shapes[1:]):
            if shape != x[axis:]:
                raise ShapeError(f"{what} shape {list(shape)} must equal the normalized shape {list(x[axis:])}")
        return x, same_element_type(elems)

    def verify_(self) -> None:
        if self.epsilon.value.data <= 0:
            raise VerifyException(f"'{self.name}': eps must be positive, got {self.epsilon.value.data}")
        super().verify_()

    def gradient(self, g, e):
        x = self.input
        shape = global_shape(x.type)
        axis = self.axis.value.data
        axes = list(range(axis, len(shape)))
        mean = e.emit(ReduceMeanOp(x, axes, keepdims=True))
        xc = e.emit(SubOp(x, mean))
        var = e.emit(ReduceMeanOp(e.emit(MulOp(xc, xc)), axes, keepdims=True))
        rstd = e.emit(RsqrtOp(e.emit(AddOp(var, e.scalar(self.epsilon.value.data, x)))))
        xhat = e.emit(MulOp(xc, rstd))
        grads: list[SSAValue | None] = [None, None, None]
        dxhat = g
        if self.weight is not None:
            dxhat = e.emit(MulOp(g, self.weight))
            lead = list(range(axis))
            gw = e.emit(MulOp(g, xhat))
            grads[1] = e.emit(ReduceSumOp(gw, lead)) if lead else gw
            grads[2] = e.emit(ReduceSumOp(g, lead)) if lead else g
        m1 = e.emit(ReduceMeanOp(dxhat, axes, keepdims=True))
        m2 = e.emit(ReduceMeanOp(e.emit(MulOp(dxhat, xhat)), axes, keepdims=True))
        dx = e.emit(MulOp(rstd, e.emit(SubOp(e.emit(SubOp(dxhat, m1)), e.emit(MulOp(xhat, m2))))))
        grads[0] = dx
        return grads if self.weight is not None else [dx]
