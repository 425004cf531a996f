"""Normalizations along one axis: softmax, log_softmax and layernorm, and
layernorm's input gradient in one row pass."""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass
from typing import ClassVar, TypeVar

from xdsl.dialects.builtin import I64, Float64Type, FloatAttr, IntegerAttr, f64, i64
from xdsl.ir import Operation, SSAValue
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
from .elementwise import AddOp, ExpOp, MulOp, NegOp, RsqrtOp, SubOp
from .graph import ConstantOp
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


def _check_epsilon(op: LayerNormOp | LayerNormGradOp) -> None:
    """Layernorm's and its gradient's epsilon: positive (the variance plus it is a root's radicand)."""
    if op.epsilon.value.data <= 0:
        raise VerifyException(f"'{op.name}': eps must be positive, got {op.epsilon.value.data}")


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
        _check_epsilon(self)
        super().verify_()

    def gradient(self, g, e):
        """Decomposed, so that sbp-infer may lay each part out on its own (a
        row split over the normalized axes, a partial gradient); where the
        layout it chose keeps each row on one device, sbp-fuse-norms fuses
        the statistics back into one lg.layernorm and the input's gradient
        into one lg.layernorm_grad (`normalization_of`, `input_gradient_of`)."""
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


@op_definition
class LayerNormGradOp(LgOp):
    """The gradient of lg.layernorm's normalization: with x̂ the input
    normalized over the axes `axis..rank-1` (mean 0, variance 1, `epsilon`
    as lg.layernorm's) and r = 1 / sqrt(variance + epsilon), the gradient
    `grad` of x̂ gives the input's, r * (grad - mean(grad) - x̂ * mean(grad * x̂)).
    One pass per row with its statistics in cache, where the ops it stands
    for (14 of them, the statistics recomputed with it) each made a pass
    over the whole tensor."""

    KERNEL_KIND: ClassVar[str] = "row"

    name = "lg.layernorm_grad"

    input = operand_def(TensorLike)
    grad = operand_def(TensorLike)
    axis = prop_def(IntegerAttr[I64])
    epsilon = prop_def(FloatAttr[Float64Type])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$input `,` $grad `axis` $axis `eps` $epsilon attr-dict `:` functional-type(operands, results)"
    )

    def __init__(self, input: SSAValue, grad: SSAValue, axis: int, epsilon: float = 1e-5):
        axis = axis % max(len(global_shape(input.type)), 1)
        super().__init__(
            operands=[input, grad],
            properties={"axis": IntegerAttr(axis, i64), "epsilon": FloatAttr(epsilon, f64)},
            result_types=[self.infer([input, grad], axis=axis)],
        )

    FLOPS_PER_ELEMENT: ClassVar[float] = 14.0

    def params(self):
        return {"axis": self.axis.value.data}

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axis):
        """Rows split alike on any axis before the normalized ones; linear in
        the gradient, so a partial gradient under a whole input gives a
        partial result."""
        sigs = [((f"S{i}", f"S{i}"), (f"S{i}",)) for i in range(axis) if split_ok(out_shape[i], p)]
        return sigs + [(("B", "B"), ("B",)), (("B", "P"), ("P",))]

    @classmethod
    def rule(cls, shapes, elems, axis):
        check_axis(axis, len(shapes[0]))
        require_float("input", elems[0])
        if tuple(shapes[1]) != tuple(shapes[0]):
            raise ShapeError(f"grad shape {list(shapes[1])} must equal the input's {list(shapes[0])}")
        return shapes[0], same_element_type(elems)

    def verify_(self) -> None:
        _check_epsilon(self)
        super().verify_()

    def gradient(self, g, e):
        """Second order, for a double backward through layernorm. The map
        from `grad` to the result is linear and symmetric (r (I - 11ᵀ/n -
        x̂x̂ᵀ/n) per row), so `grad`'s gradient is this op applied to `g`.
        The input's: with xc = x - mean(x), g' = grad - mean(grad), s =
        mean(grad * xc), a = mean(g * g') and b = mean(g * xc), the result
        is r g' - r³ s xc, whose adjoint is x̄c = -r³ (s g + b g' + (a - 3 r²
        s b) xc), then x̄ = x̄c - mean(x̄c)."""
        x, dy = self.input, self.grad
        axis = self.axis.value.data
        axes = list(range(axis, len(global_shape(x.type))))

        def mean(v: SSAValue) -> SSAValue:
            return e.emit(ReduceMeanOp(v, axes, keepdims=True))

        def mul(a: SSAValue, b: SSAValue) -> SSAValue:
            return e.emit(MulOp(a, b))

        def sub(a: SSAValue, b: SSAValue) -> SSAValue:
            return e.emit(SubOp(a, b))

        xc = sub(x, mean(x))
        r = e.emit(RsqrtOp(e.emit(AddOp(mean(mul(xc, xc)), e.scalar(self.epsilon.value.data, x)))))
        r2 = mul(r, r)
        gp = sub(dy, mean(dy))
        s = mean(mul(dy, xc))
        a = mean(mul(g, gp))
        b = mean(mul(g, xc))
        coefficient = sub(a, mul(mul(e.scalar(3.0, x), r2), mul(s, b)))
        inner = e.emit(AddOp(e.emit(AddOp(mul(s, g), mul(b, gp))), mul(coefficient, xc)))
        xcbar = e.emit(NegOp(mul(mul(r2, r), inner)))
        return [sub(xcbar, mean(xcbar)), e.emit(LayerNormGradOp(x, g, axis, self.epsilon.value.data))]


# -- layernorm's gradient, recognized ---------------------------------------------------
# LayerNormOp.gradient emits its statistics and its input's gradient as
# single ops, so that sbp-infer may lay each out on its own. The matchers
# below recognize that form (any of its operands' layouts); sbp-fuse-norms
# fuses what they find where the layout keeps each row on one device.


_Op = TypeVar("_Op", bound=Operation)


@dataclass(frozen=True)
class Recognized:
    """A value recognized as one of layernorm's row computations: its
    operands (the input, and for the input's gradient the normalized
    value's gradient), the normalized axes `axis..rank-1`, epsilon as the
    graph adds it, and the ops that compute it from there, the value's own
    last: what a fused op replaces, where nothing else reads them."""

    operands: tuple[SSAValue, ...]
    axis: int
    epsilon: float
    ops: tuple[Operation, ...]


def _made_by(value: SSAValue, cls: type[_Op]) -> _Op | None:
    owner = value.owner
    return owner if isinstance(owner, cls) else None


def _row_mean(value: SSAValue) -> tuple[SSAValue, int] | None:
    """(x, axis) where `value` is x's mean over axis..rank-1, dims kept."""
    op = _made_by(value, ReduceMeanOp)
    if op is None or op.keepdims is None:
        return None
    axes, rank = list(op.axes.get_values()), len(global_shape(op.input.type))
    if not axes or axes != list(range(axes[0], rank)):
        return None
    return op.input, axes[0]


def _scalar(value: SSAValue) -> float | None:
    op = _made_by(value, ConstantOp)
    if op is None or global_shape(op.result.type) != ():
        return None
    number = op.value.get_values()[0]
    return float(number)


def normalization_of(xhat: SSAValue) -> Recognized | None:
    """`xhat` as LayerNormOp.gradient computes the normalized input:
    (x - mean(x)) * rsqrt(mean((x - mean(x))^2) + eps), each mean over the
    axes axis..rank-1; else None."""
    scaled = _made_by(xhat, MulOp)
    if scaled is None:
        return None
    centred, rstd = _made_by(scaled.lhs, SubOp), _made_by(scaled.rhs, RsqrtOp)
    if centred is None or rstd is None:
        return None
    mean = _row_mean(centred.rhs)
    shifted = _made_by(rstd.input, AddOp)
    if mean is None or mean[0] is not centred.lhs or shifted is None:
        return None
    variance, eps = _row_mean(shifted.lhs), _scalar(shifted.rhs)
    squares = _made_by(variance[0], MulOp) if variance is not None else None
    if (variance is None or variance[1] != mean[1] or eps is None or eps <= 0 or squares is None
            or squares.lhs is not centred.result or squares.rhs is not centred.result):
        return None
    ops = (centred.rhs.owner, centred, squares, shifted.lhs.owner, shifted, rstd, scaled)
    return Recognized((centred.lhs,), mean[1], eps, tuple(o for o in ops if isinstance(o, Operation)))


def input_gradient_of(dx: SSAValue) -> Recognized | None:
    """`dx` as LayerNormOp.gradient computes the input's gradient from the
    normalized value's, dxhat: rstd * ((dxhat - mean(dxhat)) - xhat *
    mean(dxhat * xhat)), xhat and rstd the normalization's
    (`normalization_of`); else None. Its ops are those after the
    normalization, which may have other readers (the weight's gradient)."""
    result = _made_by(dx, MulOp)
    if result is None:
        return None
    outer = _made_by(result.rhs, SubOp)
    if outer is None:
        return None
    centred, projected = _made_by(outer.lhs, SubOp), _made_by(outer.rhs, MulOp)
    if centred is None or projected is None:
        return None
    xhat, m2 = projected.lhs, projected.rhs
    normalized = normalization_of(xhat)
    if normalized is None or result.lhs is not normalized.ops[-1].operands[1]:  # the same rsqrt
        return None
    dxhat = centred.lhs
    m1, dot = _row_mean(centred.rhs), _row_mean(m2)
    product = _made_by(dot[0], MulOp) if dot is not None else None
    if (m1 is None or dot is None or m1[0] is not dxhat or m1[1] != normalized.axis or dot[1] != normalized.axis
            or product is None or product.lhs is not dxhat or product.rhs is not xhat):
        return None
    ops = (centred.rhs.owner, centred, product, m2.owner, projected, outer, result)
    return Recognized((normalized.operands[0], dxhat), normalized.axis, normalized.epsilon,
                      tuple(o for o in ops if isinstance(o, Operation)))
