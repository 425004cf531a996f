"""Shape manipulation: reshape and broadcast_to (a target shape), transpose,
concat, slice and pad."""

from __future__ import annotations

import math
from abc import ABC
from collections.abc import Sequence
from typing import ClassVar

from xdsl.dialects.builtin import I64, DenseArrayBase, Float64Type, FloatAttr, IntegerAttr, f64, i64
from xdsl.ir import SSAValue
from xdsl.irdl import operand_def, prop_def, result_def, traits_def, var_operand_def
from xdsl.traits import Pure

from ..builders import i64_array
from ..irdl_verify import op_definition
from ..sbp import TensorLike, element_type, global_shape
from .base import (
    LgOp,
    SameBytes,
    ShapeError,
    aligned_splits,
    broadcast_shapes,
    check_axis,
    is_float,
    passthrough_signatures,
    require_value_type,
    split_ok,
)


class ToShapeOp(LgOp, ABC):
    """An op whose target shape is its result type's shape."""

    KERNEL_KIND: ClassVar[str] = "layout"

    input = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$input attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, shape: Sequence[int]):
        super().__init__(operands=[input], result_types=[self.infer([input], shape=tuple(shape))])

    def params(self):
        return {"shape": global_shape(self.result.type)}


@op_definition
class ReshapeOp(ToShapeOp):
    """Same elements, row-major, in a new shape."""

    name = "lg.reshape"

    traits = traits_def(SameBytes())

    @classmethod
    def rule(cls, shapes, elems, shape):
        if math.prod(shapes[0]) != math.prod(shape):
            raise ShapeError(
                f"cannot reshape {list(shapes[0])} ({math.prod(shapes[0])} elements) to "
                f"{list(shape)} ({math.prod(shape)} elements)"
            )
        return tuple(shape), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, shape):
        """S<i> maps to the result axis j with the same leading element count
        (prod(in[:i]) == prod(out[:j])) when both axes divide by p: then every
        device's piece is one contiguous run of each leading block on both sides."""
        x = in_shapes[0]
        sigs = []
        for i, d in enumerate(x):
            if d < p or d % p:
                continue
            lead = math.prod(x[:i])
            for j, e in enumerate(out_shape):
                if math.prod(out_shape[:j]) == lead and e >= p and e % p == 0:
                    sigs.append(((f"S{i}",), (f"S{j}",)))
                    break
        return sigs + passthrough_signatures(1, ("P", "Pmax"))

    def gradient(self, g, e):
        return [e.emit(ReshapeOp(g, global_shape(self.input.type)))]


@op_definition
class BroadcastToOp(ToShapeOp):
    """Expands size-1 and missing leading axes, as numpy.broadcast_to."""

    name = "lg.broadcast_to"

    @classmethod
    def rule(cls, shapes, elems, shape):
        if broadcast_shapes(shapes[0], tuple(shape)) != tuple(shape):
            raise ShapeError(f"cannot broadcast {list(shapes[0])} to {list(shape)}")
        return tuple(shape), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, shape):
        """A kept axis splits alike; an expanded axis can be split from a whole
        (B) input, each device materializing only its slice."""
        return aligned_splits(in_shapes, out_shape, p) + passthrough_signatures(1, ("P", "Pmax"))

    def gradient(self, g, e):
        return [e.unbroadcast(g, global_shape(self.input.type))]


@op_definition
class TransposeOp(LgOp):
    """Permutes axes: result axis i is operand axis perm[i]."""

    KERNEL_KIND: ClassVar[str] = "layout"

    name = "lg.transpose"

    input = operand_def(TensorLike)
    perm = prop_def(DenseArrayBase.constr(i64))
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$input `perm` $perm attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, perm: Sequence[int]):
        result_type = self.infer([input], perm=tuple(perm))
        super().__init__(
            operands=[input], properties={"perm": DenseArrayBase.from_list(i64, perm)}, result_types=[result_type]
        )

    def params(self):
        return {"perm": tuple(self.perm.get_values())}

    @classmethod
    def rule(cls, shapes, elems, perm):
        x = shapes[0]
        if sorted(perm) != list(range(len(x))):
            raise ShapeError(f"perm {list(perm)} is not a permutation of the {len(x)} axes")
        return tuple(x[p] for p in perm), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, perm):
        sigs = [((f"S{src}",), (f"S{i}",)) for i, src in enumerate(perm) if split_ok(out_shape[i], p)]
        return sigs + passthrough_signatures(1, ("P", "Pmax"))

    def gradient(self, g, e):
        perm = list(self.perm.get_values())
        return [e.emit(TransposeOp(g, [perm.index(i) for i in range(len(perm))]))]


@op_definition
class ConcatOp(LgOp):
    """Joins tensors along `axis`; all other axes must agree."""

    KERNEL_KIND: ClassVar[str] = "layout"

    name = "lg.concat"

    inputs = var_operand_def(TensorLike)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$inputs `axis` $axis attr-dict `:` functional-type($inputs, $result)"

    def __init__(self, inputs: Sequence[SSAValue], axis: int):
        axis = axis % max(len(global_shape(inputs[0].type)), 1)
        result_type = self.infer(inputs, axis=axis)
        super().__init__(operands=[inputs], properties={"axis": IntegerAttr(axis, i64)}, result_types=[result_type])

    def params(self):
        return {"axis": self.axis.value.data}

    @classmethod
    def rule(cls, shapes, elems, axis):
        if not shapes:
            raise ShapeError("needs at least one operand")
        first = shapes[0]
        check_axis(axis, len(first))
        for s in shapes[1:]:
            if len(s) != len(first) or any(a != b for i, (a, b) in enumerate(zip(s, first)) if i != axis):
                raise ShapeError(f"shapes {[list(s) for s in shapes]} differ outside axis {axis}")
        if any(e != elems[0] for e in elems):
            raise ShapeError(f"operands must share one element type, got {', '.join(map(str, elems))}")
        return (*first[:axis], sum(s[axis] for s in shapes), *first[axis + 1 :]), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axis):
        n = len(in_shapes)
        sigs = [((f"S{i}",) * n, (f"S{i}",)) for i, d in enumerate(out_shape) if i != axis and split_ok(d, p)]
        return sigs + passthrough_signatures(n, ("P", "Pmax"))

    def gradient(self, g, e):
        axis = self.axis.value.data
        out: list[SSAValue | None] = []
        at = 0
        full = global_shape(g.type)
        for value in self.inputs:
            n = global_shape(value.type)[axis]
            starts = [at if i == axis else 0 for i in range(len(full))]
            limits = [at + n if i == axis else d for i, d in enumerate(full)]
            out.append(e.emit(SliceOp(g, starts, limits)))
            at += n
        return out


@op_definition
class SliceOp(LgOp):
    """Strided slice: per axis, elements start, start+stride, ... below limit."""

    KERNEL_KIND: ClassVar[str] = "layout"

    name = "lg.slice"

    input = operand_def(TensorLike)
    starts = prop_def(DenseArrayBase.constr(i64))
    limits = prop_def(DenseArrayBase.constr(i64))
    strides = prop_def(DenseArrayBase.constr(i64))
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$input `starts` $starts `limits` $limits `strides` $strides attr-dict `:` type($input) `->` type($result)"
    )

    @classmethod
    def bytes_touched(cls, operand_bytes: Sequence[float], result_bytes: float) -> float:
        # it reads only what it copies: a gradient bucket's 25 slices were
        # each priced as reading the whole bucket, 4.6x their measured time
        return 2.0 * result_bytes

    def __init__(
        self, input: SSAValue, starts: Sequence[int], limits: Sequence[int], strides: Sequence[int] | None = None
    ):
        strides = list(strides) if strides is not None else [1] * len(starts)
        result_type = self.infer([input], starts=tuple(starts), limits=tuple(limits), strides=tuple(strides))
        super().__init__(
            operands=[input],
            properties={
                "starts": i64_array(starts),
                "limits": i64_array(limits),
                "strides": i64_array(strides),
            },
            result_types=[result_type],
        )

    def params(self):
        return {
            "starts": tuple(self.starts.get_values()),
            "limits": tuple(self.limits.get_values()),
            "strides": tuple(self.strides.get_values()),
        }

    @classmethod
    def rule(cls, shapes, elems, starts, limits, strides):
        x = shapes[0]
        if not len(starts) == len(limits) == len(strides) == len(x):
            raise ShapeError(f"starts, limits and strides need one entry per axis ({len(x)})")
        out = []
        for axis, (d, lo, hi, st) in enumerate(zip(x, starts, limits, strides)):
            if not (0 <= lo <= hi <= d and st >= 1):
                raise ShapeError(f"axis {axis}: need 0 <= start <= limit <= {d} and stride >= 1, got {lo}:{hi}:{st}")
            out.append(-(-(hi - lo) // st))
        return tuple(out), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, starts, limits, strides):
        """Only axes the slice keeps whole may be split."""
        x = in_shapes[0]
        sigs = [
            ((f"S{i}",), (f"S{i}",))
            for i, d in enumerate(x)
            if (starts[i], limits[i], strides[i]) == (0, d, 1) and split_ok(d, p)
        ]
        return sigs + passthrough_signatures(1, ("P", "Pmax"))

    def gradient(self, g, e):
        """The gradient placed back where the slice took it, zeros between:
        along a strided axis each element is first followed by stride - 1
        zeros (a unit axis added after it, padded, merged back), then every
        axis gets the zeros before its start and after its end."""
        p = self.params()
        x_shape = list(global_shape(self.input.type))
        current = g
        for axis, (lo, st) in enumerate(zip(p["starts"], p["strides"])):
            cur_shape = list(global_shape(current.type))
            length = cur_shape[axis]
            if st > 1 and length:
                widened = [*cur_shape[:axis + 1], 1, *cur_shape[axis + 1:]]
                high = [0] * len(widened)
                high[axis + 1] = st - 1
                spread = e.emit(PadOp(e.emit(ReshapeOp(current, widened)), [0] * len(widened), high))
                length = min(length * st, x_shape[axis] - lo)  # the last element's trailing zeros past the end go
                merged = [*cur_shape[:axis], cur_shape[axis] * st, *cur_shape[axis + 1:]]
                current = e.emit(ReshapeOp(spread, merged))
                if merged[axis] != length:
                    limits = list(merged)
                    limits[axis] = length
                    current = e.emit(SliceOp(current, [0] * len(merged), limits))
                cur_shape = list(global_shape(current.type))
            parts = []
            if lo:
                parts.append(e.zeros([*cur_shape[:axis], lo, *cur_shape[axis + 1:]], current))
            parts.append(current)
            if x_shape[axis] - lo - length:
                parts.append(e.zeros([*cur_shape[:axis], x_shape[axis] - lo - length, *cur_shape[axis + 1:]], current))
            if len(parts) > 1:
                current = e.emit(ConcatOp(parts, axis))
        return [current]


@op_definition
class PadOp(LgOp):
    """Constant padding: `low[i]` elements of `value` before axis i and
    `high[i]` after it (PyTorch's `constant_pad_nd`, `F.pad` in constant
    mode, with widths of at least 0). Axes without padding may be split."""

    KERNEL_KIND: ClassVar[str] = "layout"

    name = "lg.pad"

    input = operand_def(TensorLike)
    low = prop_def(DenseArrayBase.constr(i64))
    high = prop_def(DenseArrayBase.constr(i64))
    value = prop_def(FloatAttr[Float64Type])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$input `low` $low `high` $high `value` $value attr-dict `:` type($input) `->` type($result)"

    def __init__(self, input: SSAValue, low: Sequence[int], high: Sequence[int], value: float = 0.0):
        result_type = self.infer([input], low=tuple(low), high=tuple(high), value=float(value))
        super().__init__(
            operands=[input],
            properties={"low": DenseArrayBase.from_list(i64, low), "high": DenseArrayBase.from_list(i64, high),
                        "value": FloatAttr(float(value), f64)},
            result_types=[result_type],
        )

    def params(self):
        return {"low": tuple(self.low.get_values()), "high": tuple(self.high.get_values()),
                "value": self.value.value.data}

    @classmethod
    def rule(cls, shapes, elems, low, high, value):
        x = shapes[0]
        if not len(low) == len(high) == len(x):
            raise ShapeError(f"low and high need one entry per axis ({len(x)})")
        if any(w < 0 for w in (*low, *high)):
            raise ShapeError(f"padding widths must be at least 0, got low {list(low)} high {list(high)}")
        require_value_type("operand", elems[0])
        if not is_float(elems[0]) and value != int(value):
            raise ShapeError(f"a {elems[0]} tensor cannot be padded with {value}")
        return tuple(d + lo + hi for d, lo, hi in zip(x, low, high)), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, low, high, value):
        sigs = [((f"S{i}",), (f"S{i}",)) for i, d in enumerate(in_shapes[0])
                if low[i] == high[i] == 0 and split_ok(d, p)]
        return sigs + [(("B",), ("B",))] + ([(("P",), ("P",))] if value == 0 else [])

    def gradient(self, g, e):
        if not is_float(element_type(self.input.type)):
            return [None]
        p = self.params()
        shape = global_shape(g.type)
        return [e.emit(SliceOp(g, p["low"], [d - hi for d, hi in zip(shape, p["high"])]))]
