"""Linear algebra: `lg.matmul`, batched with numpy broadcasting of the batch
dimensions, either operand transposed in its last two axes; the grouped
matmul of a mixture of experts (`lg.grouped_matmul`, rows taken by the
expert their group names, the groups' ends a tensor known at run time) and
its weight gradient."""

from __future__ import annotations

import math
from typing import ClassVar

from xdsl.dialects.builtin import UnitAttr
from xdsl.ir import Attribute, SSAValue
from xdsl.irdl import operand_def, opt_prop_def, result_def, traits_def
from xdsl.traits import Pure

from ..irdl_verify import op_definition
from ..sbp import TensorLike, global_shape
from .base import LgOp, ShapeError, aligned_splits, broadcast_shapes, is_index, same_element_type, split_ok
from .shape import ReshapeOp


@op_definition
class MatmulOp(LgOp):
    """Matrix product of the last two axes; leading (batch) axes broadcast as
    in numpy.matmul. `transpose_lhs`/`transpose_rhs` swap an operand's last two
    axes first."""

    KERNEL_KIND: ClassVar[str] = "gemm"

    name = "lg.matmul"

    lhs = operand_def(TensorLike)
    rhs = operand_def(TensorLike)
    transpose_lhs = opt_prop_def(UnitAttr)
    transpose_rhs = opt_prop_def(UnitAttr)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$lhs `,` $rhs (`transpose_lhs` $transpose_lhs^)? (`transpose_rhs` $transpose_rhs^)? "
        "attr-dict `:` functional-type(operands, results)"
    )

    def __init__(
        self,
        lhs: SSAValue,
        rhs: SSAValue,
        transpose_lhs: bool = False,
        transpose_rhs: bool = False,
        result_type: Attribute | None = None,
    ):
        props = {}
        if transpose_lhs:
            props["transpose_lhs"] = UnitAttr()
        if transpose_rhs:
            props["transpose_rhs"] = UnitAttr()
        result_type = result_type or self.infer(
            [lhs, rhs], transpose_lhs=transpose_lhs, transpose_rhs=transpose_rhs
        )
        super().__init__(operands=[lhs, rhs], properties=props, result_types=[result_type])

    def params(self):
        return {"transpose_lhs": self.transpose_lhs is not None, "transpose_rhs": self.transpose_rhs is not None}

    @classmethod
    def rule(cls, shapes, elems, transpose_lhs=False, transpose_rhs=False):
        a, b = shapes
        if len(a) < 2 or len(b) < 2:
            raise ShapeError(f"operands must have rank >= 2, got {list(a)} and {list(b)}")
        if transpose_lhs:
            a = (*a[:-2], a[-1], a[-2])
        if transpose_rhs:
            b = (*b[:-2], b[-1], b[-2])
        if a[-1] != b[-2]:
            raise ShapeError(f"contracting dimensions differ: {list(a)} @ {list(b)}")
        batch = broadcast_shapes(a[:-2], b[:-2])
        return (*batch, a[-2], b[-1]), same_element_type(elems)

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, transpose_lhs=False, transpose_rhs=False):
        """OneFlow's Table 1 with transposes remapped: (S<m>, B) -> S, (B, S<n>) -> S,
        (S<k>, S<k>) -> P, (P, B) -> P, (B, P) -> P, (B, B) -> B, and the batch
        axes split alike (an operand that broadcasts along one stays B)."""
        a, b = in_shapes
        m_axis, k_axis = (len(a) - 1, len(a) - 2) if transpose_lhs else (len(a) - 2, len(a) - 1)
        kb_axis, n_axis = (len(b) - 1, len(b) - 2) if transpose_rhs else (len(b) - 2, len(b) - 1)
        rank = len(out_shape)
        sigs = aligned_splits([a[:-2], b[:-2]], out_shape[:-2], p)
        if split_ok(a[m_axis], p):
            sigs.append(((f"S{m_axis}", "B"), (f"S{rank - 2}",)))
        if split_ok(b[n_axis], p):
            sigs.append((("B", f"S{n_axis}"), (f"S{rank - 1}",)))
        if split_ok(a[k_axis], p):
            sigs.append(((f"S{k_axis}", f"S{kb_axis}"), ("P",)))
        return sigs + [(("B", "B"), ("B",)), (("P", "B"), ("P",)), (("B", "P"), ("P",))]

    @classmethod
    def flops(cls, in_shapes, out_shape, transpose_lhs=False, transpose_rhs=False):
        a = in_shapes[0]
        k = a[-2] if transpose_lhs else a[-1]
        return 2.0 * math.prod(out_shape) * k

    def gradient(self, g, e):
        a, b = self.lhs, self.rhs
        ta, tb = self.transpose_lhs is not None, self.transpose_rhs is not None
        # C = A' B' with A' = A or A^T, B' = B or B^T: dA' = g B'^T and
        # dB' = A'^T g. A transposed operand's gradient is the transposed
        # product, formed as such ((X Y)^T = Y^T X^T: the operands swapped,
        # their flags flipped) rather than transposed after: a linear
        # layer's weight (x W^T, PyTorch's) gets g^T x in one GEMM, with no
        # transposing copy of the gradient after it.
        if ta:
            da = e.emit(MatmulOp(b, g, transpose_lhs=tb, transpose_rhs=True))  # B' g^T
        else:
            da = e.emit(MatmulOp(g, b, transpose_rhs=not tb))  # g B'^T
        a_shape, g_shape = global_shape(a.type), global_shape(g.type)
        if len(global_shape(b.type)) == 2 and len(a_shape) > 2 and not ta:
            # A weight applied to a batch of matrices (tokens of sequences): its
            # gradient is one GEMM over every row, A and g flattened to
            # [rows, K] and [rows, N], not a batched product summed over the batch.
            rows = math.prod(a_shape[:-1])
            a2 = e.emit(ReshapeOp(a, (rows, a_shape[-1])))
            g2 = e.emit(ReshapeOp(g, (rows, g_shape[-1])))
            db = e.emit(MatmulOp(g2, a2, transpose_lhs=True) if tb else MatmulOp(a2, g2, transpose_lhs=True))
        elif tb:
            db = e.emit(MatmulOp(g, a, transpose_lhs=True, transpose_rhs=ta))  # g^T A'
        else:
            db = e.emit(MatmulOp(a, g, transpose_lhs=not ta))  # A'^T g
        return [e.unbroadcast(da, global_shape(a.type)), e.unbroadcast(db, global_shape(b.type))]


def _group_ends(shapes, elems, experts: int) -> None:
    if len(shapes[2]) != 1 or shapes[2][0] != experts:
        raise ShapeError(f"the group ends must be a vector of {experts} (one per expert), got {list(shapes[2])}")
    if not is_index(elems[2]):
        raise ShapeError(f"the group ends must be i32 or i64, got {elems[2]}")


@op_definition
class GroupedMatmulOp(LgOp):
    """Rows of `lhs` [S, K] grouped by expert: the rows of group g, from
    `ends[g-1]` (0 for the first) up to `ends[g]`, are multiplied by
    `rhs[g]` [K, N] (`transpose_rhs`: rhs is [E, N, K] and rhs[g]^T is
    used); a row in no group (at or past the last end) gives zeros. The
    ends are cumulative counts computed at run time (a router's), so the
    shapes are static and the work follows the data: PyTorch's
    `_grouped_mm(lhs, rhs, offs=ends)` and transformers' grouped experts.
    Splits: rows (S(0), each device finds its rows' groups from the global
    ends), the contraction (partial sums), the columns, and the experts
    (S(0) of rhs: each device computes the rows of its own experts, zeros
    elsewhere, so the results add up, or only those rows, grouped by the
    ends (G) in and out: expert parallelism)."""

    KERNEL_KIND: ClassVar[str] = "gemm"

    name = "lg.grouped_matmul"

    lhs = operand_def(TensorLike)
    rhs = operand_def(TensorLike)
    ends = operand_def(TensorLike)
    transpose_rhs = opt_prop_def(UnitAttr)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = (
        "$lhs `,` $rhs `,` $ends (`transpose_rhs` $transpose_rhs^)? attr-dict `:` functional-type(operands, results)"
    )

    def __init__(self, lhs: SSAValue, rhs: SSAValue, ends: SSAValue, transpose_rhs: bool = False):
        props = {"transpose_rhs": UnitAttr()} if transpose_rhs else {}
        super().__init__(operands=[lhs, rhs, ends], properties=props,
                         result_types=[self.infer([lhs, rhs, ends], transpose_rhs=transpose_rhs)])

    def params(self):
        return {"transpose_rhs": self.transpose_rhs is not None}

    @classmethod
    def rule(cls, shapes, elems, transpose_rhs=False):
        x, w = shapes[0], shapes[1]
        if len(x) != 2 or len(w) != 3:
            raise ShapeError(f"operands must be rows [S, K] and experts [E, K, N], got {list(x)} and {list(w)}")
        k, n = (w[2], w[1]) if transpose_rhs else (w[1], w[2])
        if x[1] != k:
            raise ShapeError(f"contracting dimensions differ: {list(x)} @ {list(w)}"
                             + (" (transposed)" if transpose_rhs else ""))
        _group_ends(shapes, elems, w[0])
        return (x[0], n), same_element_type(elems[:2])

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p, transpose_rhs=False):
        x, w = in_shapes[0], in_shapes[1]
        k_axis, n_axis = (2, 1) if transpose_rhs else (1, 2)
        sigs = []
        if split_ok(x[0], p):
            sigs.append((("S0", "B", "B"), ("S0",)))
        if split_ok(x[1], p):
            sigs.append((("S1", f"S{k_axis}", "B"), ("P",)))
        if split_ok(w[n_axis], p):
            sigs.append((("B", f"S{n_axis}", "B"), ("S1",)))
        if split_ok(w[0], p):
            # expert parallel: each device computes the rows of its own
            # experts, from the whole rows (zeros elsewhere: the results add
            # up) or from those rows alone (grouped by the ends: G)
            sigs += [(("B", "S0", "B"), ("P",)), (("G", "S0", "B"), ("G",))]
        return sigs + [(("B", "B", "B"), ("B",)), (("P", "B", "B"), ("P",)), (("B", "P", "B"), ("P",))]

    @classmethod
    def flops(cls, in_shapes, out_shape, transpose_rhs=False):
        return 2.0 * math.prod(out_shape) * in_shapes[0][1]  # every row in some group: the most it can be

    def gradient(self, g, e):
        transposed = self.transpose_rhs is not None
        dx = e.emit(GroupedMatmulOp(g, self.rhs, self.ends, transpose_rhs=not transposed))
        # d rhs[g] = x_g^T dy_g, or its transpose dy_g^T x_g for a transposed rhs
        dw = e.emit(GroupedMatmulGradWeightOp(g, self.lhs, self.ends) if transposed
                    else GroupedMatmulGradWeightOp(self.lhs, g, self.ends))
        return [dx, dw, None]


@op_definition
class GroupedMatmulGradWeightOp(LgOp):
    """Per expert g, `lhs_g^T rhs_g` [K, N] over the rows of its group
    (lg.grouped_matmul's ends): the experts' weight gradient [E, K, N] of a
    grouped matmul (lhs its input rows, rhs its result's gradient). Split
    rows give partial sums; a result split by experts (S(0)) is computed
    by each device for its own experts from whole rows."""

    KERNEL_KIND: ClassVar[str] = "gemm"

    name = "lg.grouped_matmul_grad_weight"

    lhs = operand_def(TensorLike)
    rhs = operand_def(TensorLike)
    ends = operand_def(TensorLike)
    result = result_def(TensorLike)

    traits = traits_def(Pure())

    assembly_format = "$lhs `,` $rhs `,` $ends attr-dict `:` functional-type(operands, results)"

    def __init__(self, lhs: SSAValue, rhs: SSAValue, ends: SSAValue):
        super().__init__(operands=[lhs, rhs, ends], result_types=[self.infer([lhs, rhs, ends])])

    @classmethod
    def rule(cls, shapes, elems):
        a, b, ends = shapes
        if len(a) != 2 or len(b) != 2 or a[0] != b[0]:
            raise ShapeError(f"operands must be rows [S, K] and [S, N], got {list(a)} and {list(b)}")
        if len(ends) != 1:
            raise ShapeError(f"the group ends must be a vector (one per expert), got {list(ends)}")
        _group_ends(shapes, elems, ends[0])
        return (ends[0], a[1], b[1]), same_element_type(elems[:2])

    @classmethod
    def sbp_rule(cls, in_shapes, out_shape, p):
        a, b, _ = in_shapes
        sigs = []
        if split_ok(a[0], p):
            sigs.append((("S0", "S0", "B"), ("P",)))
        if split_ok(a[1], p):
            sigs.append((("S1", "B", "B"), ("S1",)))
        if split_ok(b[1], p):
            sigs.append((("B", "S1", "B"), ("S2",)))
        if split_ok(out_shape[0], p):
            # each device its own experts' gradients, from the whole rows or
            # from its own rows alone (grouped by the ends: G)
            sigs += [(("B", "B", "B"), ("S0",)), (("G", "G", "B"), ("S0",))]
        return sigs + [(("B", "B", "B"), ("B",)), (("P", "B", "B"), ("P",)), (("B", "P", "B"), ("P",))]

    @classmethod
    def flops(cls, in_shapes, out_shape):
        return 2.0 * in_shapes[0][0] * in_shapes[0][1] * in_shapes[1][1]
