"""Random numbers: dropout and uniform draws, whose keep decisions come from a counter-based
generator keyed by the op's seed, the step and the element's global index,
so every plan draws the same mask."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, ClassVar, cast

from xdsl.dialects.builtin import (
    I64,
    DenseArrayBase,
    Float64Type,
    FloatAttr,
    IntegerAttr,
    IntegerType,
    TensorType,
    f32,
    f64,
    i64,
)
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import operand_def, opt_prop_def, prop_def, result_def, traits_def
from xdsl.traits import Pure

from ..irdl_verify import op_definition
from ..sbp import TensorLike, element_type, global_shape
from .base import LgOp, ShapeError, fmt_type, is_float, split_ok

DROPOUT_BITS = 24
"""Bits of each random word a keep decision compares: element e is kept when
its 24-bit draw is at least round(rate * 2^24) (exact in every backend)."""


def dropout_threshold(rate: float) -> int:
    return round(rate * (1 << DROPOUT_BITS))


@op_definition
class DropoutOp(LgOp):
    """Dropout: each element of `input` times 0 (dropped, with probability
    `rate`) or 1 / (1 - rate), as PyTorch's `dropout` in training.

    The decision for an element is a function of the seed, the step, the
    op's `stream` and the element's index in the whole (global) tensor only:
    the 24 high bits of word (index mod 4) of Philox4x32-10 (Random123) with
    key = seed (64 bits) and counter = (index / 4 as 64 bits, stream, step
    mod 2^32). So every plan draws the same mask: a device holding a piece
    computes its elements' indices from where the piece starts, and a copy
    made by lg-micro-batch maps its rows back to the batch's with
    `micro_batch` = (count, index, rows per example): micro-batch k of K
    holds examples k, k+K, ... (the same definition as the reference
    interpreter's on the whole batch). `seed` and `step` are i64 scalars
    (the frontend's `rng.seed` and `rng.step` state, which each step
    advances). Linear in `input`, so a split or a partial sum passes
    through, and its gradient is the same dropout of the incoming gradient
    (the mask drawn again, not stored)."""

    name = "lg.dropout"

    input = operand_def(TensorLike)
    seed = operand_def(TensorLike)
    step = operand_def(TensorLike)
    rate = prop_def(FloatAttr[Float64Type])
    stream = prop_def(IntegerAttr[I64])
    micro_batch = opt_prop_def(DenseArrayBase.constr(i64))
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    FLOPS_PER_ELEMENT: ClassVar[float] = 16.0  # a Philox round's two multiplies and xors, ten rounds per four elements

    assembly_format = (
        "$input `,` $seed `,` $step `rate` $rate `stream` $stream (`micro_batch` $micro_batch^)? attr-dict `:` "
        "functional-type(operands, results)"
    )

    def __init__(self, input: SSAValue, seed: SSAValue, step: SSAValue, rate: float, stream: int,
                 micro_batch: Sequence[int] | None = None):
        props: dict[str, Attribute] = {"rate": FloatAttr(float(rate), f64), "stream": IntegerAttr(stream, i64)}
        if micro_batch is not None and tuple(micro_batch) != (1, 0, 1):
            props["micro_batch"] = DenseArrayBase.from_list(i64, list(micro_batch))
        operands = [input, seed, step]
        super().__init__(operands=operands, properties=props,
                         result_types=[self.infer(operands, **self._params_of(props))])

    @staticmethod
    def _params_of(props: dict[str, Attribute]) -> dict[str, Any]:
        batch = props.get("micro_batch")
        return {"rate": cast(FloatAttr, props["rate"]).value.data,
                "stream": cast(IntegerAttr, props["stream"]).value.data,
                "micro_batch": (1, 0, 1) if batch is None
                else tuple(cast("DenseArrayBase[IntegerType]", batch).get_values())}

    def params(self):
        return self._params_of(dict(self.properties))

    @classmethod
    def rule(cls, shapes, elems, rate, stream, micro_batch):
        if not is_float(elems[0]):
            raise ShapeError(f"input must be a float tensor, got {elems[0]}")
        for what, shape, elem in (("seed", shapes[1], elems[1]), ("step", shapes[2], elems[2])):
            if shape or elem != i64:
                raise ShapeError(f"{what} must be an i64 scalar, got {fmt_type(shape, elem)}")
        if not 0.0 <= rate < 1.0:
            raise ShapeError(f"rate must be in [0, 1), got {rate}")
        if not 0 <= stream < 1 << 32:
            raise ShapeError(f"stream must be in [0, 2^32), got {stream}")
        if len(micro_batch) != 3:
            raise ShapeError(f"micro_batch is (count, index, rows per example), got {list(micro_batch)}")
        count, index, rows = micro_batch
        if not (count >= 1 and 0 <= index < count and rows >= 1) or (count > 1 and not shapes[0]):
            raise ShapeError(f"micro_batch (count, index, rows per example) = {list(micro_batch)} is not a "
                             "micro-batch of a batch along axis 0")
        return shapes[0], elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        sigs = [((f"S{i}", "B", "B"), (f"S{i}",)) for i, d in enumerate(in_shapes[0]) if split_ok(d, p)]
        return sigs + [(("B", "B", "B"), ("B",)), (("P", "B", "B"), ("P",))]

    def gradient(self, g, e):
        p = self.params()
        return [e.emit(DropoutOp(g, self.seed, self.step, p["rate"], p["stream"], p["micro_batch"])), None, None]


@op_definition
class UniformOp(LgOp):
    """Uniform random numbers in [0, 1) (PyTorch's `rand`), a new draw at
    every step: element e (its index in the whole tensor) is its 24-bit
    Philox draw, the same word lg.dropout compares (key = seed, counter =
    (e / 4, stream, step)), times 2^-24, so every plan draws the same
    values. `floor(keep + rand)`, drop path's per-sample mask, is 1 exactly
    where lg.dropout at rate 1 - keep would keep. float32 or float64: a
    24-bit fraction rounded to 16 bits could reach 1. No operand is a
    tensor of the batch: lg-micro-batch cuts a draw whose axis 0 is the
    batch as it cuts an input."""

    name = "lg.uniform"

    seed = operand_def(TensorLike)
    step = operand_def(TensorLike)
    stream = prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    FLOPS_PER_ELEMENT: ClassVar[float] = 16.0  # as lg.dropout's draw

    assembly_format = "$seed `,` $step `stream` $stream attr-dict `:` functional-type(operands, results)"

    def __init__(self, seed: SSAValue, step: SSAValue, shape: Sequence[int], elem: Attribute, stream: int):
        super().__init__(operands=[seed, step], properties={"stream": IntegerAttr(stream, i64)},
                         result_types=[TensorType(elem, list(shape))])

    def params(self):
        return {"shape": tuple(global_shape(self.result.type)), "elem": element_type(self.result.type),
                "stream": self.stream.value.data}

    @classmethod
    def rule(cls, shapes, elems, shape, elem, stream):
        for what, s, e in (("seed", shapes[0], elems[0]), ("step", shapes[1], elems[1])):
            if s or e != i64:
                raise ShapeError(f"{what} must be an i64 scalar, got {fmt_type(s, e)}")
        if elem not in (f32, f64):
            raise ShapeError(f"the draws must be f32 or f64, got {elem}")
        if any(d < 0 for d in shape):
            raise ShapeError(f"shape {list(shape)} has a negative size")
        if not 0 <= stream < 1 << 32:
            raise ShapeError(f"stream must be in [0, 2^32), got {stream}")
        return tuple(shape), elem

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        sigs = [(("B", "B"), (f"S{i}",)) for i, d in enumerate(out_shape) if split_ok(d, p)]
        return sigs + [(("B", "B"), ("B",))]
