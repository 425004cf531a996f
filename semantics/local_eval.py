"""What one device computes: its piece of a global tensor under an nd-SBP,
and an op's local kernel under a signature.

These are the SBP semantics that every distributed level must implement and
that the tests check SBP rules against: distribute the global operands by a
signature, run each device's local kernel, combine the local results by the
result's nd-SBP, and compare with the reference interpreter.

Pieces are sbpc.dialects.pieces's. A partial nd-SBP holds, on each device,
a summand (P) or a candidate (Pmax) of the global value; one nd-SBP never
mixes P and Pmax.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from xdsl.ir import Operation

from sbpc.dialects import lg
from sbpc.dialects.backends import Backend
from sbpc.dialects.dtypes import is_float_dtype, is_half, numpy_dtype
from sbpc.dialects.pieces import Coord, coords, mesh_coord, owned_rows, partial_kind, piece
from sbpc.dialects.plain_sbp import plain_nd
from sbpc.dialects.sbp import PlainNd, Sbp, element_type, nd_to_plain
from sbpc.semantics.philox import UniformDraws, dropout_piece
from sbpc.semantics.reference import (
    REFERENCE,
    check_range,
    cumsum_piece,
    gather_piece,
    grouped_matmul_grad_weight_piece,
    grouped_matmul_piece,
    scatter_add_piece,
    scatter_piece,
    token_cross_entropy,
    token_cross_entropy_grad,
    widened,
)


def distribute(
    value: np.ndarray, nd: PlainNd, mesh: Sequence[int], rng: np.random.Generator, ends: np.ndarray | None = None,
    index: np.ndarray | None = None,
) -> dict[Coord, np.ndarray]:
    """Every device's local piece of `value`. Partial pieces are random: P
    summands that add up to the value, Pmax candidates at most the value with
    one device holding it exactly. B axes hold identical copies. Rows
    grouped by expert (G, by the group `ends`) or gathered by an index (I,
    by `index`) are stored whole with other rows' values in the rows a
    device does not own: a kernel that read them would show."""
    nd = plain_nd(nd)
    kind = partial_kind(nd)
    partial_axes = [a for a, s in enumerate(nd) if s.is_partial]
    broadcast_axes = [a for a, s in enumerate(nd) if s == Sbp.B]
    out: dict[Coord, np.ndarray] = {}
    for c in coords(mesh):
        # the representative holds B axes at 0; copies are filled in below
        if any(c[a] for a in broadcast_axes):
            continue
        out[c] = np.array(value[piece(value.shape, nd, mesh, c)])
    if kind is not None:
        groups: dict[Coord, list[Coord]] = {}
        for c in out:
            groups.setdefault(tuple(0 if a in partial_axes else x for a, x in enumerate(c)), []).append(c)
        for members in groups.values():
            base = out[members[0]]
            if kind == Sbp.P and base.dtype.kind in "iu":
                # integer summands: random ones on all devices but the last, which holds the rest
                summands = rng.integers(-9, 10, size=(len(members) - 1, *base.shape)).astype(base.dtype)
                for c, n in zip(members, summands):
                    out[c] = n
                out[members[-1]] = base - summands.sum(axis=0, dtype=base.dtype)
            elif kind == Sbp.P:
                noise = rng.normal(size=(len(members), *base.shape)).astype(base.dtype)
                noise -= noise.mean(axis=0)
                for c, n in zip(members, noise):
                    out[c] = base / len(members) + n
            else:
                exact = rng.integers(len(members))
                for i, c in enumerate(members):
                    if i != exact:
                        lower = np.abs(rng.normal(size=base.shape)) if base.dtype.kind == "f" else \
                            rng.integers(0, 10, size=base.shape)
                        out[c] = base - lower.astype(base.dtype)
    for c in coords(mesh):
        if c not in out:
            out[c] = out[tuple(0 if a in broadcast_axes else x for a, x in enumerate(c))].copy()
    for c, own in _owned_rows(nd, mesh, value.shape, ends, index).items():
        # other rows' values where a device does not own the rows: in the
        # op's domain (an index in range), but not the rows' own
        shifted = np.roll(out[c], int(rng.integers(1, max(2, len(out[c])))), axis=0)
        shifted[own] = out[c][own]
        out[c] = shifted
    return out


def _owned_rows(nd: PlainNd, mesh: Sequence[int], shape: Sequence[int], ends: np.ndarray | None,
                index: np.ndarray | None) -> dict[Coord, Any]:
    """Where rows are owned at run time (G or I): each device's own rows."""
    if not any(s.is_grouped or s.is_indexed for s in nd):
        return {}
    return {c: owned_rows(nd, mesh, c, shape[0], ends, index) for c in coords(mesh)}


def combine(
    pieces: dict[Coord, np.ndarray], nd: PlainNd, mesh: Sequence[int], shape: Sequence[int], dtype,
    ends: np.ndarray | None = None, index: np.ndarray | None = None,
) -> np.ndarray:
    """The global tensor that local `pieces` stand for under `nd`. Copies on B
    axes must agree (checked); P pieces are summed, Pmax pieces maxed; of
    rows grouped by expert (G, by the group `ends`) or gathered by an index
    (I, by `index`), each device's own."""
    nd = plain_nd(nd)
    owned = _owned_rows(nd, mesh, shape, ends, index)
    kind = partial_kind(nd)
    broadcast_axes = [a for a, s in enumerate(nd) if s == Sbp.B]
    result_dtype = np.dtype(np.float64 if is_float_dtype(dtype) else dtype)
    lowest = -np.inf if result_dtype.kind == "f" else np.iinfo(result_dtype).min if result_dtype.kind in "iu" else False
    result = np.full(shape, lowest if kind == Sbp.PMAX else 0, dtype=result_dtype)
    for c in coords(mesh):
        region = piece(shape, nd, mesh, c)
        local = pieces[c]
        expected_shape = tuple(s.stop - s.start for s in region)
        if local.shape != expected_shape:
            raise AssertionError(f"device {c}: local piece has shape {local.shape}, expected {expected_shape}")
        if any(c[a] for a in broadcast_axes):
            twin = tuple(0 if a in broadcast_axes else x for a, x in enumerate(c))
            np.testing.assert_allclose(local, pieces[twin], rtol=1e-5, atol=1e-6, err_msg=f"B copies differ at {c}")
            continue
        if c in owned:  # its own rows of the whole it stores
            region, local = (owned[c], *region[1:]), local[owned[c]]
        if kind == Sbp.P:
            result[region] += local
        elif kind == Sbp.PMAX:
            result[region] = np.maximum(result[region], local)
        else:
            result[region] = local
    return result.astype(dtype)


# --------------------------------------------------------------------------
# Local kernels
# --------------------------------------------------------------------------


@dataclass(frozen=True)
class LocalContext:
    """What a local kernel may know beyond its local operands."""

    in_shapes: tuple[tuple[int, ...], ...]  # global
    out_shape: tuple[int, ...]  # global
    in_pieces: tuple[tuple[slice, ...], ...]
    out_piece: tuple[slice, ...]
    out_nd: PlainNd

    @property
    def out_piece_shape(self) -> tuple[int, ...]:
        return tuple(s.stop - s.start for s in self.out_piece)


LocalKernel = Callable[..., np.ndarray]
"""kernel(op, ctx: LocalContext, *local operands) -> local result"""

LOCAL: Backend[LocalKernel] = Backend("SBP-local evaluation")
"""Ops whose local kernel is not their global (reference) kernel applied to
local pieces; every other op runs its reference kernel."""


def _global_count_scaled(
    ctx: LocalContext, local: Callable[[], np.ndarray], local_n: int, global_n: int, dtype: np.dtype
) -> np.ndarray:
    # A mean over a split axis: each device sums its part and divides by the
    # global count, so the pieces add up to the global mean. An empty piece
    # (more devices than elements) adds nothing, where numpy's mean of
    # nothing is NaN; a mean over no elements at all is NaN, as numpy's
    # and PyTorch's.
    if global_n == 0:
        return np.full(ctx.out_piece_shape, np.nan, dtype)
    if local_n == 0:
        return np.zeros(ctx.out_piece_shape, dtype)
    return local() * (local_n / global_n) if global_n else local()


@LOCAL.impl(lg.ReduceMeanOp)
def _reduce_mean(op: lg.ReduceMeanOp, ctx: LocalContext, x: np.ndarray) -> np.ndarray:
    axes = tuple(op.axes.get_values())
    local_n = int(np.prod([x.shape[a] for a in axes]))
    global_n = int(np.prod([ctx.in_shapes[0][a] for a in axes]))
    return _global_count_scaled(ctx, lambda: REFERENCE[lg.ReduceMeanOp](op, x), local_n, global_n, x.dtype)


@LOCAL.impl(lg.GroupedMatmulOp)
def _grouped_matmul(op: lg.GroupedMatmulOp, ctx: LocalContext, x: np.ndarray, w: np.ndarray,
                    ends: np.ndarray) -> np.ndarray:
    # split rows find their groups from where they start; split experts
    # compute their own experts' rows (reference.grouped_matmul_piece)
    transpose = op.transpose_rhs is not None
    out = np.empty((x.shape[0], w.shape[1] if transpose else w.shape[2]), np.result_type(x, w))
    return grouped_matmul_piece(x, w, ends, transpose, out, ctx.in_pieces[0][0].start, ctx.in_pieces[1][0].start)


@LOCAL.impl(lg.GroupedMatmulGradWeightOp)
def _grouped_matmul_grad_weight(op, ctx: LocalContext, a: np.ndarray, b: np.ndarray, ends: np.ndarray) -> np.ndarray:
    out = np.empty((ctx.out_piece_shape[0], a.shape[1], b.shape[1]), np.result_type(a, b))
    return grouped_matmul_grad_weight_piece(a, b, ends, out, ctx.in_pieces[0][0].start, ctx.out_piece[0].start)


@LOCAL.impl(lg.CrossEntropyOp)
def _cross_entropy(op: lg.CrossEntropyOp, ctx: LocalContext, logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    return _global_count_scaled(
        ctx, lambda: REFERENCE[lg.CrossEntropyOp](op, logits, labels), labels.size, int(np.prod(ctx.in_shapes[1])),
        logits.dtype,
    )


@LOCAL.impl(lg.MseLossOp)
def _mse(op: lg.MseLossOp, ctx: LocalContext, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return _global_count_scaled(
        ctx, lambda: REFERENCE[lg.MseLossOp](op, a, b), a.size, int(np.prod(ctx.in_shapes[0])), a.dtype
    )


@LOCAL.impl(lg.EmbeddingOp)
def _embedding(op: lg.EmbeddingOp, ctx: LocalContext, table: np.ndarray, indices: np.ndarray) -> np.ndarray:
    # A table split by rows holds rows [lo, hi): gather those, zero the rest.
    # An index outside the whole table is an error, as in the reference.
    check_range(op, "index", indices, ctx.in_shapes[0][0])
    rows = ctx.in_pieces[0][0]
    inside = (indices >= rows.start) & (indices < rows.stop)
    gathered = table[np.where(inside, indices - rows.start, 0)] if table.shape[0] else np.zeros(
        (*indices.shape, table.shape[1]), table.dtype
    )
    return np.where(inside[..., None], gathered, 0)


@LOCAL.impl(lg.EmbeddingGradOp)
def _embedding_grad(op: lg.EmbeddingGradOp, ctx: LocalContext, grad: np.ndarray, indices: np.ndarray) -> np.ndarray:
    # a table split by rows (from rows gathered by the index, I) adds up
    # only its own rows: the rows whose index falls elsewhere land there
    return REFERENCE[lg.EmbeddingGradOp](op, grad, indices)[ctx.out_piece[0]]


@LOCAL.impl(lg.TokenCrossEntropyOp)
def _token_cross_entropy(op: lg.TokenCrossEntropyOp, ctx: LocalContext, logits: np.ndarray, labels: np.ndarray,
                         row_max: np.ndarray, sum_exp: np.ndarray) -> np.ndarray:
    # logits split by classes: the piece holding a row's label subtracts its
    # logit, the piece holding class 0 adds the row's log-sum-exp
    return token_cross_entropy(op, logits, labels, row_max, sum_exp, ctx.in_pieces[0][-1], ctx.in_shapes[0][-1])


@LOCAL.impl(lg.TokenCrossEntropyGradOp)
def _token_cross_entropy_grad(op: lg.TokenCrossEntropyGradOp, ctx: LocalContext, logits: np.ndarray,
                              labels: np.ndarray, row_max: np.ndarray, sum_exp: np.ndarray,
                              grad: np.ndarray) -> np.ndarray:
    return token_cross_entropy_grad(op, logits, labels, row_max, sum_exp, grad, ctx.in_pieces[0][-1],
                                    ctx.in_shapes[0][-1])


@LOCAL.impl(lg.CumsumOp)
def _cumsum(op: lg.CumsumOp, ctx: LocalContext, x: np.ndarray) -> np.ndarray:
    # a split scanned axis: this piece's contribution to the whole axis (P)
    axis, reverse = op.params()["axis"], op.params()["reverse"]
    out = np.empty(ctx.out_piece_shape, x.dtype)
    return cumsum_piece(x, axis, reverse, ctx.in_pieces[0][axis], ctx.in_shapes[0][axis], out)


@LOCAL.impl(lg.DropoutOp)
def _dropout(op: lg.DropoutOp, ctx: LocalContext, x: np.ndarray, seed: np.ndarray, step: np.ndarray) -> np.ndarray:
    # the piece's elements drawn by their indices in the whole tensor
    p = op.params()
    return dropout_piece(x, seed, step, ctx.in_shapes[0], ctx.in_pieces[0], p["rate"], p["stream"], p["micro_batch"])


@LOCAL.impl(lg.UniformOp)
def _uniform(op: lg.UniformOp, ctx: LocalContext, seed: np.ndarray, step: np.ndarray) -> np.ndarray:
    # the piece's elements drawn by their indices in the whole tensor
    p = op.params()
    return UniformDraws(ctx.out_shape, ctx.out_piece, p["stream"]).values(int(seed), int(step),
                                                                          numpy_dtype(p["elem"]))


@LOCAL.impl(lg.GatherOp)
def _gather(op: lg.GatherOp, ctx: LocalContext, x: np.ndarray, indices: np.ndarray) -> np.ndarray:
    # an input split along the gathered axis: the elements this piece holds (P)
    axis = op.axis.value.data
    return gather_piece(op, x, indices, axis, ctx.in_pieces[0][axis], ctx.in_shapes[0][axis])


@LOCAL.impl(lg.ScatterOp)
def _scatter(op: lg.ScatterOp, ctx: LocalContext, x: np.ndarray, indices: np.ndarray,
             updates: np.ndarray) -> np.ndarray:
    axis = op.axis.value.data
    return scatter_piece(op, x, indices, updates, axis, ctx.in_pieces[0][axis], ctx.in_shapes[0][axis])


@LOCAL.impl(lg.ScatterAddOp)
def _scatter_add(op: lg.ScatterAddOp, ctx: LocalContext, updates: np.ndarray, indices: np.ndarray) -> np.ndarray:
    axis = op.axis.value.data
    return scatter_add_piece(op, updates, indices, axis, ctx.out_piece[axis], ctx.out_shape[axis],
                             ctx.out_piece_shape)


def _to_local_shape(kernel: Callable) -> Callable:
    def local(op, ctx: LocalContext, x: np.ndarray) -> np.ndarray:
        return kernel(x, ctx.out_piece_shape)

    return local


@LOCAL.impl(lg.SliceOp)
def _slice(op: lg.SliceOp, ctx: LocalContext, x: np.ndarray) -> np.ndarray:
    # Only axes the slice keeps whole are split; those stay whole locally.
    p = op.params()
    full = ctx.in_shapes[0]
    return x[
        tuple(
            slice(None) if (lo, hi, st) == (0, d, 1) else slice(lo, hi, st)
            for lo, hi, st, d in zip(p["starts"], p["limits"], p["strides"], full)
        )
    ]


@dataclass(frozen=True)
class Fused:
    """A `plan.fused` actor's kernel: elementwise lg ops (typed with their
    local results), each with the indices of its arguments among the
    actor's inputs followed by the earlier steps' results. Elementwise ops
    compute the same locally as globally, so each step runs its global
    kernel."""

    steps: tuple[tuple[Operation, tuple[int, ...]], ...]
    name = "plan.fused"


@LOCAL.impl(Fused)
def _fused(op: Fused, ctx: LocalContext, *inputs: np.ndarray) -> np.ndarray:
    values = list(inputs)
    for step, args in op.steps:
        values.append(np.asarray(REFERENCE[type(step)](step, *(values[a] for a in args))))
    return values[-1]


LOCAL.register(lg.ReshapeOp, _to_local_shape(np.reshape))
LOCAL.register(lg.BroadcastToOp, _to_local_shape(np.broadcast_to))


def local_kernel(op: Operation, ctx: LocalContext, *inputs: np.ndarray) -> np.ndarray:
    special = LOCAL.get(type(op))
    # half types (f16, bf16) computed in float32, the result rounded once, as in the reference
    wide = [widened(x) for x in inputs]
    with np.errstate(all="ignore"):
        result = np.asarray(special(op, ctx, *wide) if special is not None else REFERENCE[type(op)](op, *wide))
    last = op.steps[-1][0] if isinstance(op, Fused) else op
    dtype = numpy_dtype(element_type(last.results[0].type)) if last.results else None
    return result.astype(dtype) if dtype is not None and is_half(dtype) else result


def run_distributed(
    op: Operation,
    in_nds: Sequence[PlainNd],
    out_nd: PlainNd,
    mesh: Sequence[int],
    global_inputs: Sequence[np.ndarray],
    out_shape: Sequence[int],
    out_dtype,
    rng: np.random.Generator,
    ends: np.ndarray | None = None,
) -> np.ndarray:
    """Evaluates `op` on every device of `mesh` under the signature
    (in_nds -> out_nd) and returns the combined global result. Rows grouped
    by expert (G) are grouped by `ends`: by default a grouped matmul's own,
    or for any other op random ones (an op that may group its rows computes
    each row from the same rows, whoever owns them). Rows gathered by an
    index (I) are an embedding's (or its gradient's) by its indices."""
    in_nds, out_nd = [plain_nd(nd) for nd in in_nds], plain_nd(out_nd)
    in_shapes = tuple(tuple(x.shape) for x in global_inputs)
    index = global_inputs[1].reshape(-1) if isinstance(op, lg.EmbeddingOp | lg.EmbeddingGradOp) else None
    if ends is None and any(Sbp.G in nd for nd in (*in_nds, out_nd)):
        if isinstance(op, lg.GroupedMatmulOp | lg.GroupedMatmulGradWeightOp):
            ends = global_inputs[2]
        else:
            grouped = next(i for i, nd in enumerate(in_nds) if Sbp.G in nd) if Sbp.G not in out_nd else None
            rows = out_shape[0] if grouped is None else in_shapes[grouped][0]
            ends = np.sort(rng.integers(0, rows + 1, size=2 * max(mesh)))
    per_input = [distribute(x, nd, mesh, rng, ends, index) for x, nd in zip(global_inputs, in_nds)]
    results = {}
    for c in coords(mesh):
        ctx = LocalContext(
            in_shapes,
            tuple(out_shape),
            tuple(piece(s, nd, mesh, c) for s, nd in zip(in_shapes, in_nds)),
            piece(out_shape, out_nd, mesh, c),
            tuple(out_nd),
        )
        results[c] = local_kernel(op, ctx, *(pieces[c] for pieces in per_input)).astype(out_dtype)
    return combine(results, out_nd, mesh, out_shape, out_dtype, ends, index)


def assemble(t, mesh, pieces_by_rank: dict[int, np.ndarray], dtype) -> np.ndarray:
    """The global value of dtensor type `t` from the pieces its placement's
    ranks hold (ranks outside the placement are ignored)."""
    by_coord = {}
    for rank, local in pieces_by_rank.items():
        if rank in mesh.ranks:
            by_coord[mesh_coord(mesh, rank)] = local
    return combine(by_coord, nd_to_plain(t.nd_sbp), mesh.shape, t.get_shape(), dtype)
