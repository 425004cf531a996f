"""Reductions over axes (sum, mean, max), argmax and top-k along one axis,
and the inclusive scan cumsum."""

from __future__ import annotations

import math
from abc import ABC
from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import I64, DenseArrayBase, IntegerAttr, IntegerType, UnitAttr, i64
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import operand_def, opt_prop_def, prop_def, result_def, traits_def
from xdsl.traits import Pure

from ..builders import i64_array
from ..irdl_verify import op_definition
from ..sbp import TensorLike, element_type, global_shape
from .base import (
    LgOp,
    ShapeError,
    check_axis,
    is_float,
    is_index,
    passthrough_signatures,
    require_float,
    require_value_type,
    split_ok,
)
from .elementwise import DivOp, MulOp
from .mask import CastOp, CompareOp
from .shape import BroadcastToOp, ReshapeOp


def _axes_prop(axes: Sequence[int], rank: int) -> DenseArrayBase[IntegerType]:
    return i64_array(sorted({a % max(rank, 1) for a in axes}))


class ReduceOp(LgOp, ABC):
    """Reduces the listed axes (sorted, distinct); `keepdims` keeps them as 1."""

    KERNEL_KIND: ClassVar[str] = "row"

    input = operand_def(TensorLike)
    axes = prop_def(DenseArrayBase.constr(i64))
    keepdims = opt_prop_def(UnitAttr)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$input `axes` $axes (`keepdims` $keepdims^)? attr-dict `:` type($input) `->` type($result)"
    )

    def __init__(self, input: SSAValue, axes: Sequence[int], keepdims: bool = False):
        axes_prop = _axes_prop(axes, len(global_shape(input.type)))
        props: dict[str, Attribute] = {"axes": axes_prop}
        if keepdims:
            props["keepdims"] = UnitAttr()
        result_type = self.infer([input], axes=tuple(axes_prop.get_values()), keepdims=keepdims)
        super().__init__(operands=[input], properties=props, result_types=[result_type])

    def params(self):
        return {"axes": tuple(self.axes.get_values()), "keepdims": self.keepdims is not None}

    INTEGERS: ClassVar[bool] = False
    """Whether i32/i64 operands are taken too (counting a mask's tokens)."""

    @classmethod
    def rule(cls, shapes, elems, axes, keepdims):
        x = shapes[0]
        if not (cls.INTEGERS and is_index(elems[0])):
            require_float("operand", elems[0])
        if list(axes) != sorted(set(axes)):
            raise ShapeError(f"axes {list(axes)} must be sorted and distinct")
        for a in axes:
            check_axis(a, len(x))
        if keepdims:
            return tuple(1 if i in axes else d for i, d in enumerate(x)), elems[0]
        return tuple(d for i, d in enumerate(x) if i not in axes), elems[0]

    PARTIAL: ClassVar[str] = "P"
    """What a split on a reduced axis becomes, and the partial kind kept."""

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axes, keepdims):
        """S on a reduced axis gives a partial result; S on a kept axis stays S."""
        sigs = []
        for i, d in enumerate(in_shapes[0]):
            if not split_ok(d, p):
                continue
            if i in axes:
                sigs.append(((f"S{i}",), (cls.PARTIAL,)))
            else:
                out_axis = i if keepdims else i - sum(1 for a in axes if a < i)
                sigs.append(((f"S{i}",), (f"S{out_axis}",)))
        return sigs + passthrough_signatures(1, (cls.PARTIAL,))

    @classmethod
    def flops(cls, in_shapes, out_shape, **params):
        return float(math.prod(in_shapes[0]))

    def _spread(self, g, e, scale: float | None = None) -> list[SSAValue | None]:
        """The gradient of a sum (times `scale`): g broadcast back over the reduced axes."""
        x_shape = global_shape(self.input.type)
        axes = list(self.axes.get_values())
        kept = tuple(1 if i in axes else d for i, d in enumerate(x_shape))
        if global_shape(g.type) != kept:
            g = e.emit(ReshapeOp(g, kept))
        if scale is not None:
            g = e.emit(MulOp(g, e.scalar(scale, g)))
        return [e.emit(BroadcastToOp(g, x_shape))]


@op_definition
class ReduceSumOp(ReduceOp):
    name = "lg.reduce_sum"
    INTEGERS: ClassVar[bool] = True

    def gradient(self, g, e):
        return self._spread(g, e)


@op_definition
class ReduceMeanOp(ReduceOp):
    name = "lg.reduce_mean"

    def gradient(self, g, e):
        return self._spread(g, e, 1.0 / math.prod(global_shape(self.input.type)[a] for a in self.axes.get_values()))


@op_definition
class ReduceMaxOp(ReduceOp):
    name = "lg.reduce_max"
    INTEGERS: ClassVar[bool] = True
    PARTIAL: ClassVar[str] = "Pmax"

    def gradient(self, g, e):
        """PyTorch's `amax` gradient: g goes to the elements equal to the
        maximum, shared evenly where several are (integers: none)."""
        elem = element_type(self.input.type)
        if not is_float(elem):
            return [None]
        x_shape = global_shape(self.input.type)
        axes = list(self.axes.get_values())
        kept = tuple(1 if i in axes else d for i, d in enumerate(x_shape))
        top = self.result if global_shape(self.result.type) == kept else e.emit(ReshapeOp(self.result, kept))
        hit = e.emit(CastOp(e.emit(CompareOp("eq", self.input, top)), elem))
        share = e.emit(DivOp(hit, e.emit(ReduceSumOp(hit, axes, keepdims=True))))
        (spread,) = self._spread(g, e)
        assert spread is not None  # (_spread always gives the broadcast gradient)
        return [e.emit(MulOp(spread, share))]


@op_definition
class ArgmaxOp(LgOp):
    """The index (i64) of the largest element along `axis`, which the result
    drops: the first where several are largest, the first NaN where there is
    one (numpy's and PyTorch's `argmax`). Splits along the other axes pass
    through; the reduced axis must be whole (a piece's index and its maximum
    would have to travel together). No gradient flows through an index."""

    KERNEL_KIND: ClassVar[str] = "row"

    name = "lg.argmax"

    input = operand_def(TensorLike)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$input `axis` $axis attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, axis: int):
        super().__init__(operands=[input], properties={"axis": IntegerAttr(axis, i64)},
                         result_types=[self.infer([input], axis=axis)])

    def params(self):
        return {"axis": self.axis.value.data}

    @classmethod
    def rule(cls, shapes, elems, axis):
        require_value_type("operand", elems[0])
        check_axis(axis, len(shapes[0]))
        if shapes[0][axis] == 0:
            raise ShapeError(f"axis {axis} is empty: no element to pick")
        return tuple(d for i, d in enumerate(shapes[0]) if i != axis), i64

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axis):
        sigs = [((f"S{i}",), (f"S{i if i < axis else i - 1}",)) for i, d in enumerate(in_shapes[0])
                if i != axis and split_ok(d, p)]
        return sigs + [(("B",), ("B",))]


@op_definition
class TopkOp(LgOp):
    """The indices (i64) of the `k` largest elements along `axis` (with
    `smallest`, the k smallest), in order: the largest first (the smallest
    first), the lower index first among equals, NaN larger than any number.
    That is PyTorch's stable `sort` (k the whole axis) and its `topk`, whose
    order of equals PyTorch leaves unspecified. The values are a gather at
    these indices (`lg.gather`), so their gradient reaches the elements
    picked and no gradient flows through the indices. As for argmax, splits
    along the other axes pass through and the searched axis must be whole."""

    KERNEL_KIND: ClassVar[str] = "row"

    name = "lg.topk"

    input = operand_def(TensorLike)
    k = prop_def(IntegerAttr[I64])
    axis = prop_def(IntegerAttr[I64])
    smallest = opt_prop_def(UnitAttr)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$input `k` $k `axis` $axis (`smallest` $smallest^)? attr-dict `:` type($input) `->` type($result)"
    )

    def __init__(self, input: SSAValue, k: int, axis: int, smallest: bool = False):
        props: dict[str, Attribute] = {"k": IntegerAttr(k, i64), "axis": IntegerAttr(axis, i64)}
        if smallest:
            props["smallest"] = UnitAttr()
        super().__init__(operands=[input], properties=props,
                         result_types=[self.infer([input], k=k, axis=axis, smallest=smallest)])

    def params(self):
        return {"k": self.k.value.data, "axis": self.axis.value.data, "smallest": self.smallest is not None}

    @classmethod
    def rule(cls, shapes, elems, k, axis, smallest):
        require_value_type("operand", elems[0])
        check_axis(axis, len(shapes[0]))
        if not 0 <= k <= shapes[0][axis]:
            raise ShapeError(f"k {k} is not between 0 and the size {shapes[0][axis]} of axis {axis}")
        return tuple(k if i == axis else d for i, d in enumerate(shapes[0])), i64

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, k, axis, smallest):
        sigs = [((f"S{i}",), (f"S{i}",)) for i, d in enumerate(in_shapes[0]) if i != axis and split_ok(d, p)]
        return sigs + [(("B",), ("B",))]


@op_definition
class CumsumOp(LgOp):
    """Running sum along `axis` (PyTorch's `cumsum`): element i is the sum
    of elements 0..i, or with `reverse` of elements i..end, of floats or
    integers. With the scanned axis split, each device computes what its
    elements add to every position of the whole axis (0 before them, their
    running sum along them, their total after them): a partial sum, so the
    scan needs no exchange of running totals between devices."""

    KERNEL_KIND: ClassVar[str] = "row"

    name = "lg.cumsum"

    input = operand_def(TensorLike)
    axis = prop_def(IntegerAttr[I64])
    reverse = opt_prop_def(UnitAttr)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$input `axis` $axis (`reverse` $reverse^)? attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, axis: int, reverse: bool = False):
        props: dict[str, Attribute] = {"axis": IntegerAttr(axis, i64)}
        if reverse:
            props["reverse"] = UnitAttr()
        super().__init__(operands=[input], properties=props,
                         result_types=[self.infer([input], axis=axis, reverse=reverse)])

    def params(self):
        return {"axis": self.axis.value.data, "reverse": self.reverse is not None}

    @classmethod
    def rule(cls, shapes, elems, axis, reverse):
        if not (is_float(elems[0]) or is_index(elems[0])):
            raise ShapeError(f"operand must be a float, i32 or i64 tensor, got {elems[0]}")
        check_axis(axis, len(shapes[0]))
        return shapes[0], elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axis, reverse):
        sigs = [((f"S{i}",), (f"S{i}" if i != axis else "P",)) for i, d in enumerate(in_shapes[0]) if split_ok(d, p)]
        return sigs + passthrough_signatures(1, ("P",))

    def gradient(self, g, e):
        if not is_float(element_type(self.input.type)):
            return [None]
        return [e.emit(CumsumOp(g, self.axis.value.data, reverse=self.reverse is None))]
