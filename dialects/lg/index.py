"""Gathers by integer indices: embedding lookup, one_hot, gather along an
axis, and the scatter-adds their gradients need."""

from __future__ import annotations

from collections.abc import Sequence
from typing import ClassVar, cast

from xdsl.dialects.builtin import I64, DenseIntOrFPElementsAttr, IntegerAttr, IntegerType, TensorType, i64
from xdsl.ir import Attribute, Operation, SSAValue
from xdsl.irdl import operand_def, opt_prop_def, prop_def, result_def, traits_def
from xdsl.traits import Pure
from xdsl.utils.exceptions import VerifyException

from ..irdl_verify import op_definition
from ..sbp import TensorLike, element_type, global_shape
from .base import LgOp, Shape, ShapeError, check_axis, is_float, is_index, require_float, require_value_type, split_ok
from .elementwise import MulOp
from .graph import ConstantOp
from .mask import CastOp, CompareOp, SelectOp
from .shape import BroadcastToOp, ReshapeOp


@op_definition
class EmbeddingOp(LgOp):
    """Row gather: result[..., :] = table[indices[...], :]. With `padding`,
    the table's row of that index gets no gradient (PyTorch's `padding_idx`:
    BERT's padding token); the gather itself is unchanged."""

    KERNEL_KIND: ClassVar[str] = "gather"

    name = "lg.embedding"

    table = operand_def(TensorLike)
    indices = operand_def(TensorLike)
    padding_idx = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$table `,` $indices (`padding` $padding_idx^)? attr-dict `:` functional-type(operands, results)"
    )

    @classmethod
    def bytes_touched(cls, operand_bytes: Sequence[float], result_bytes: float) -> float:
        # the rows it gathers and the indices, not the whole table (GPT-2's
        # is 154 MB, a batch's rows a few MB)
        return operand_bytes[1] + 2.0 * result_bytes

    def __init__(self, table: SSAValue, indices: SSAValue, padding_idx: int | None = None):
        props = {} if padding_idx is None else {"padding_idx": IntegerAttr(padding_idx, i64)}
        super().__init__(operands=[table, indices], properties=props, result_types=[self.infer([table, indices])])

    @property
    def padding(self) -> int | None:
        """The row that gets no gradient, if any."""
        return None if self.padding_idx is None else self.padding_idx.value.data

    def verify_(self) -> None:
        super().verify_()
        _verify_padding(self, self.padding, global_shape(self.table.type)[0])

    @classmethod
    def rule(cls, shapes, elems, **params):
        table, indices = shapes
        if len(table) != 2:
            raise ShapeError(f"table must have rank 2, got {list(table)}")
        require_float("table", elems[0])
        if not is_index(elems[1]):
            raise ShapeError(f"indices must be i32 or i64, got {elems[1]}")
        return (*indices, table[1]), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, **params):
        """Table S<0>: each device gathers the rows it holds and zeros the
        others, a partial sum, or, the index being a vector, the rows it
        gathered owned by it (I: rows gathered by an index). Table S<1>: the
        embedding dim splits. Split indices split the result alike.
        Gathering is linear in the table."""
        table, indices = in_shapes
        last = len(out_shape) - 1
        sigs = [(("B", f"S{i}"), (f"S{i}",)) for i, d in enumerate(indices) if split_ok(d, p)]
        if split_ok(table[0], p):
            sigs.append((("S0", "B"), ("P",)))
            if len(indices) == 1:  # the same rows, each owned by the device that gathered it
                sigs.append((("S0", "B"), (f"I{table[0]}",)))
        if split_ok(table[1], p):
            sigs.append((("S1", "B"), (f"S{last}",)))
        return sigs + [(("B", "B"), ("B",)), (("P", "B"), ("P",))]

    def gradient(self, g, e):
        return [e.emit(EmbeddingGradOp(g, self.indices, global_shape(self.table.type)[0], self.padding)), None]


def _verify_padding(op: Operation, padding: int | None, rows: int) -> None:
    if padding is not None and not 0 <= padding < rows:
        raise VerifyException(f"'{op.name}': padding {padding} is not a row of the {rows}-row table")


@op_definition
class OneHotOp(LgOp):
    """Integer labels [...] to float rows [..., classes] with a 1 at each
    label. A label equal to `ignore_index` gives a row of zeros: PyTorch's
    ignored cross-entropy targets (`ignore_index=-100`, nanoGPT's -1)."""

    KERNEL_KIND: ClassVar[str] = "gather"

    name = "lg.one_hot"

    labels = operand_def(TensorLike)
    classes = prop_def(IntegerAttr[I64])
    ignore_index = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$labels `classes` $classes (`ignore` $ignore_index^)? attr-dict `:` type($labels) `->` type($result)"
    )

    def __init__(self, labels: SSAValue, classes: int, elem: Attribute, ignore_index: int | None = None):
        shape = (*global_shape(labels.type), classes)
        props: dict[str, Attribute] = {"classes": IntegerAttr(classes, i64)}
        if ignore_index is not None:
            props["ignore_index"] = IntegerAttr(ignore_index, i64)
        super().__init__(operands=[labels], properties=props, result_types=[TensorType(elem, shape)])

    def params(self):
        return {"classes": self.classes.value.data, "elem": element_type(self.result.type)}

    @property
    def ignored(self) -> int | None:
        """The label that gives a row of zeros, if any."""
        return None if self.ignore_index is None else self.ignore_index.value.data

    @classmethod
    def rule(cls, shapes, elems, classes, elem):
        if not is_index(elems[0]):
            raise ShapeError(f"labels must be i32 or i64, got {elems[0]}")
        if classes < 1:
            raise ShapeError(f"classes must be positive, got {classes}")
        require_float("result", elem)
        return (*shapes[0], classes), elem

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, classes, elem):
        sigs = [((f"S{i}",), (f"S{i}",)) for i, d in enumerate(in_shapes[0]) if split_ok(d, p)]
        return sigs + [(("B",), ("B",))]


@op_definition
class EmbeddingGradOp(LgOp):
    """The gradient of lg.embedding for its table: rows [rows, D] where row r
    is the sum of the gradient rows whose index is r (a scatter-add); the
    row `padding`, if given, stays zero."""

    KERNEL_KIND: ClassVar[str] = "gather"

    name = "lg.embedding_grad"

    grad = operand_def(TensorLike)
    indices = operand_def(TensorLike)
    rows = prop_def(IntegerAttr[I64])
    padding_idx = opt_prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$grad `,` $indices `rows` $rows (`padding` $padding_idx^)? attr-dict `:` functional-type(operands, results)"
    )

    def __init__(self, grad: SSAValue, indices: SSAValue, rows: int, padding_idx: int | None = None):
        result_type = self.infer([grad, indices], rows=rows)
        props: dict[str, Attribute] = {"rows": IntegerAttr(rows, i64)}
        if padding_idx is not None:
            props["padding_idx"] = IntegerAttr(padding_idx, i64)
        super().__init__(operands=[grad, indices], properties=props, result_types=[result_type])

    @property
    def padding(self) -> int | None:
        """The row that stays zero, if any."""
        return None if self.padding_idx is None else self.padding_idx.value.data

    def verify_(self) -> None:
        super().verify_()
        _verify_padding(self, self.padding, self.rows.value.data)

    def params(self):
        return {"rows": self.rows.value.data}

    @classmethod
    def rule(cls, shapes, elems, rows):
        grad, indices = shapes
        require_float("grad", elems[0])
        if not is_index(elems[1]):
            raise ShapeError(f"indices must be i32 or i64, got {elems[1]}")
        if grad[:-1] != indices or not grad:
            raise ShapeError(f"grad shape {list(grad)} must be the indices shape {list(indices)} plus one axis")
        return (rows, grad[-1]), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, rows):
        """Split index positions give partial tables (each device adds its
        rows); a split embedding dim stays split; rows gathered by the index
        (I) give each device its own table rows (S<0>); linear in the
        gradient."""
        grad, indices = in_shapes
        sigs = [((f"S{i}", f"S{i}"), ("P",)) for i, d in enumerate(indices) if split_ok(d, p)]
        if split_ok(grad[-1], p):
            sigs.append(((f"S{len(grad) - 1}", "B"), ("S1",)))
        if split_ok(rows, p) and len(indices) == 1:
            # each device adds up its table rows from the rows it owns: those
            # whose index falls in them (I)
            sigs.append(((f"I{rows}", "B"), ("S0",)))
        return sigs + [(("B", "B"), ("B",)), (("P", "B"), ("P",))]

    def gradient(self, g, e):
        """PyTorch's double backward: linear in the gradient, so its own is
        `g` looked up at the indices, zero where an index is the padding
        row's (which took no gradient)."""
        looked = e.emit(EmbeddingOp(g, self.indices))
        if self.padding is None:
            return [looked, None]
        index_type = cast(IntegerType, element_type(self.indices.type))
        padding = e.emit(ConstantOp(DenseIntOrFPElementsAttr.from_list(TensorType(index_type, []), [self.padding])))
        kept = e.emit(CompareOp("ne", self.indices, padding))
        column = e.emit(ReshapeOp(kept, [*global_shape(self.indices.type), 1]))
        return [e.emit(MulOp(looked, e.emit(CastOp(column, element_type(g.type))))), None]


def _gather_rule(what: str, data: Shape, indices: Shape, axis: int, index_elem: Attribute) -> None:
    check_axis(axis, len(data))
    if not is_index(index_elem):
        raise ShapeError(f"indices must be i32 or i64, got {index_elem}")
    if len(indices) != len(data) or any(a != b for i, (a, b) in enumerate(zip(data, indices)) if i != axis):
        raise ShapeError(f"indices shape {list(indices)} must be the {what} shape {list(data)} but on axis {axis}")


@op_definition
class GatherOp(LgOp):
    """Elements picked along `axis` by computed indices (PyTorch's `gather`,
    numpy's `take_along_axis`): result[..., j, ...] = input[..., indices[...,
    j, ...], ...], the indices shaped as the input but on `axis`. With the
    input split on `axis` each device picks the elements it holds and zeros
    the others: a partial sum, as a vocabulary-split embedding."""

    KERNEL_KIND: ClassVar[str] = "gather"

    name = "lg.gather"

    input = operand_def(TensorLike)
    indices = operand_def(TensorLike)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$input `,` $indices `axis` $axis attr-dict `:` functional-type(operands, results)"

    def __init__(self, input: SSAValue, indices: SSAValue, axis: int):
        super().__init__(operands=[input, indices], properties={"axis": IntegerAttr(axis, i64)},
                         result_types=[self.infer([input, indices], axis=axis)])

    def params(self):
        return {"axis": self.axis.value.data}

    @classmethod
    def rule(cls, shapes, elems, axis):
        require_value_type("input", elems[0])
        _gather_rule("input", shapes[0], shapes[1], axis, elems[1])
        return shapes[1], elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axis):
        data, indices = in_shapes
        sigs = [((f"S{i}", f"S{i}"), (f"S{i}",)) for i, d in enumerate(indices) if i != axis and split_ok(d, p)]
        if split_ok(indices[axis], p):
            sigs.append((("B", f"S{axis}"), (f"S{axis}",)))
        if split_ok(data[axis], p):
            sigs.append(((f"S{axis}", "B"), ("P",)))
        return sigs + [(("B", "B"), ("B",)), (("P", "B"), ("P",))]

    def gradient(self, g, e):
        if not is_float(element_type(self.input.type)):
            return [None, None]
        size = global_shape(self.input.type)[self.axis.value.data]
        return [e.emit(ScatterAddOp(g, self.indices, self.axis.value.data, size)), None]


@op_definition
class ScatterAddOp(LgOp):
    """Zeros of `size` along `axis`, with each update added where its index
    points (PyTorch's `scatter_add` into zeros): the gradient of lg.gather
    for its input, and PyTorch's `scatter_add` itself; its own gradient
    gathers at the same indices."""

    KERNEL_KIND: ClassVar[str] = "gather"

    name = "lg.scatter_add"

    updates = operand_def(TensorLike)
    indices = operand_def(TensorLike)
    axis = prop_def(IntegerAttr[I64])
    size = prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$updates `,` $indices `axis` $axis `size` $size attr-dict `:` functional-type(operands, results)"
    )

    def __init__(self, updates: SSAValue, indices: SSAValue, axis: int, size: int):
        params = {"axis": axis, "size": size}
        super().__init__(operands=[updates, indices],
                         properties={k: IntegerAttr(v, i64) for k, v in params.items()},
                         result_types=[self.infer([updates, indices], **params)])

    def params(self):
        return {"axis": self.axis.value.data, "size": self.size.value.data}

    @classmethod
    def rule(cls, shapes, elems, axis, size):
        require_float("updates", elems[0])
        _gather_rule("updates", shapes[0], shapes[1], axis, elems[1])
        if size < 0:
            raise ShapeError(f"size must be at least 0, got {size}")
        return tuple(size if i == axis else d for i, d in enumerate(shapes[0])), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axis, size):
        """Split positions along `axis` give partial results (each device adds
        its updates); whole updates and indices may fill a result split on
        `axis` (each device keeps the rows it holds); linear in the updates."""
        updates, indices = in_shapes
        sigs = [((f"S{i}", f"S{i}"), (f"S{i}",)) for i, d in enumerate(indices) if i != axis and split_ok(d, p)]
        if split_ok(indices[axis], p):
            sigs.append(((f"S{axis}", f"S{axis}"), ("P",)))
        if split_ok(size, p):
            sigs.append((("B", "B"), (f"S{axis}",)))
        return sigs + [(("B", "B"), ("B",)), (("P", "B"), ("P",))]

    def gradient(self, g, e):
        # each update went to the element its index names: it reads back the
        # gradient there (PyTorch's scatter_add, differentiated for its source)
        return [e.emit(GatherOp(g, self.indices, self.axis.value.data)), None]


@op_definition
class ScatterOp(LgOp):
    """`input` with each update written where its index points along `axis`
    (PyTorch's `scatter(input, axis, indices, src)` and `index_put`): the
    indices have the updates' shape, the input has it but on `axis`.
    Among updates aimed at one element the last in row-major order wins, as
    PyTorch's CPU loop leaves it (its order on CUDA is unspecified). Floats
    or integers (an inverse permutation). Writing is linear in the input and
    the updates together, so both partial give a partial result; a result
    split on `axis` takes, on each device, the updates aimed at its rows.
    Gradients as PyTorch's: the input's where nothing was written, each
    update's read back where it was aimed."""

    KERNEL_KIND: ClassVar[str] = "gather"

    name = "lg.scatter"

    input = operand_def(TensorLike)
    indices = operand_def(TensorLike)
    updates = operand_def(TensorLike)
    axis = prop_def(IntegerAttr[I64])
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$input `,` $indices `,` $updates `axis` $axis attr-dict `:` functional-type(operands, results)"

    def __init__(self, input: SSAValue, indices: SSAValue, updates: SSAValue, axis: int):
        super().__init__(operands=[input, indices, updates], properties={"axis": IntegerAttr(axis, i64)},
                         result_types=[self.infer([input, indices, updates], axis=axis)])

    def params(self):
        return {"axis": self.axis.value.data}

    @classmethod
    def rule(cls, shapes, elems, axis):
        data, indices, updates = shapes
        require_value_type("input", elems[0])
        if elems[2] != elems[0]:
            raise ShapeError(f"updates must have the input's element type {elems[0]}, got {elems[2]}")
        _gather_rule("input", data, indices, axis, elems[1])
        if tuple(updates) != tuple(indices):
            raise ShapeError(f"updates shape {list(updates)} must be the indices shape {list(indices)}")
        return tuple(data), elems[0]

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, axis):
        data, indices, _ = in_shapes
        sigs = [((f"S{i}",) * 3, (f"S{i}",)) for i, d in enumerate(indices) if i != axis and split_ok(d, p)]
        if split_ok(data[axis], p):
            sigs.append(((f"S{axis}", "B", "B"), (f"S{axis}",)))
        return sigs + [(("B", "B", "B"), ("B",)), (("P", "B", "P"), ("P",))]

    def gradient(self, g, e):
        # the input's gradient where nothing was written; each update's where
        # it was aimed if it was the last aimed there (an update overwritten
        # by a later one changes nothing: PyTorch, defined for distinct
        # indices only, gives it the gradient too). The last writer of each
        # element: the updates' own positions along the axis, scattered.
        axis = self.axis.value.data
        shape = global_shape(self.updates.type)
        untouched = e.emit(ScatterOp(g, self.indices, e.zeros(shape, g), axis))
        index_type = cast(IntegerType, element_type(self.indices.type))  # i32 or i64 (the rule)
        positions = DenseIntOrFPElementsAttr.from_list(
            TensorType(index_type, [n if d == axis else 1 for d, n in enumerate(shape)]), list(range(shape[axis])))
        own = e.emit(BroadcastToOp(e.emit(ConstantOp(positions)), shape))
        nobody = DenseIntOrFPElementsAttr.from_list(TensorType(index_type, []), [-1])
        unwritten = e.emit(BroadcastToOp(e.emit(ConstantOp(nobody)), global_shape(self.input.type)))
        last = e.emit(ScatterOp(unwritten, self.indices, own, axis))
        kept = e.emit(CompareOp("eq", e.emit(GatherOp(last, self.indices, axis)), own))
        return [untouched, None, e.emit(SelectOp(kept, e.emit(GatherOp(g, self.indices, axis)), e.zeros(shape, g)))]
