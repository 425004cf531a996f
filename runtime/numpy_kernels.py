"""The numpy backend's kernels: every one writes straight into its output
register (`out=`), so the memory plan is what runs and a steady-state step
allocates no arrays.

A kernel is bound once, at load time, to its op, its SBP-local context and
the shapes of its registers (`bind`); binding preallocates the little
scratch a kernel needs for intermediates (a softmax's row maxima, a
layernorm's centred copy, an embedding's in-range mask), so firing reuses
it. The semantics are sbpc.semantics.local_eval's local kernels exactly, including a
split mean's division by the global count and a row-split table's masked
gather; tests compare the two.

Aliasing: the memory plan lets an elementwise output overwrite a dying
input of the same type (`in_place`); elementwise kernels are written so
that is safe (they read an element before writing it, and intermediates go
to scratch). Any other kernel that finds its output sharing bytes with an
input computes into a scratch output (allocated on first need, then
reused) and copies.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

import numpy as np
from xdsl.ir import Operation

from sbpc.dialects import lg, plan
from sbpc.dialects.backends import Backend
from sbpc.dialects.dtypes import is_half, numpy_dtype
from sbpc.dialects.sbp import element_type, global_shape
from sbpc.semantics.local_eval import Fused, LocalContext
from sbpc.semantics.philox import DropoutMask, UniformDraws
from sbpc.semantics.reference import (
    COMPARE,
    LOGICAL,
    EvaluationError,
    check_range,
    cumsum_piece,
    erf,
    floor_divide,
    grouped_matmul_grad_weight_piece,
    grouped_matmul_piece,
    max_with_identity,
    topk_indices,
)

from . import numpy_window_kernels
from .numpy_binding import Binder, Fire, scratch

NUMPY: Backend[Binder] = Backend("the runtime's numpy kernels")



def _kept(shape, axes) -> tuple[int, ...]:
    """`shape` with `axes` reduced to 1 (a keepdims reduction's shape)."""
    return tuple(1 if d in axes else n for d, n in enumerate(shape))


# -- elementwise -------------------------------------------------------------


def _unary(fn: Callable[[np.ndarray, np.ndarray], object]) -> Binder:  # numpy ufuncs return their out=
    def bind(op, local, ins, out):
        return lambda xs, o: fn(xs[0], o)

    return bind


def _binary(ufunc) -> Binder:
    def bind(op, local, ins, out):
        return lambda xs, o: ufunc(xs[0], xs[1], out=o)

    return bind


GELU_C = math.sqrt(2.0 / math.pi)


@NUMPY.impl(lg.GeluOp)
def _bind_gelu(op, local, ins, out) -> Fire:
    # 0.5 * x * (1 + tanh(c * (x + 0.044715 * x*x*x))), as the reference
    # (x*x*x, not np.power: float32 power is ~1000x slower); the chain runs in
    # scratch so `out` may be `x` (in place).
    t = scratch(out.shape, out.dtype)

    def fire(xs, o):
        x = xs[0]
        np.multiply(x, x, out=t)
        np.multiply(t, x, out=t)
        np.multiply(t, 0.044715, out=t)
        np.add(x, t, out=t)
        np.multiply(t, GELU_C, out=t)
        np.tanh(t, out=t)
        np.add(t, 1.0, out=t)
        np.multiply(t, x, out=t)
        np.multiply(t, 0.5, out=o)

    return fire


def _rsqrt(x, o):
    np.sqrt(x, out=o)
    np.divide(1.0, o, out=o)


# -- matmul ---------------------------------------------------------------------


def gemm_operands(a: np.ndarray, b: np.ndarray, o: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """a @ b -> o as one GEMM where it is one: a stack of row blocks times
    one matrix (a linear layer on [batch, seq, features]) becomes all the
    rows times the matrix. numpy would call BLAS once per leading index:
    16 GEMMs of 64 rows ran 1.15-1.5x slower than one of 1024 (the GPT's
    linear layers, and their input gradients)."""
    if b.ndim == 2 and a.ndim > 2 and a.flags.c_contiguous and o.flags.c_contiguous:
        return a.reshape(-1, a.shape[-1]), b, o.reshape(-1, o.shape[-1])
    return a, b, o


@NUMPY.impl(lg.MatmulOp)
def _bind_matmul(op: lg.MatmulOp, local, ins, out) -> Fire:
    ta, tb = op.transpose_lhs is not None, op.transpose_rhs is not None

    def fire(xs, o):
        a, b = xs
        a, b, o = gemm_operands(np.swapaxes(a, -1, -2) if ta else a, np.swapaxes(b, -1, -2) if tb else b, o)
        np.matmul(a, b, out=o)

    return fire


@NUMPY.impl(lg.GroupedMatmulOp)
def _bind_grouped_matmul(op: lg.GroupedMatmulOp, local, ins, out) -> Fire:
    transpose = op.transpose_rhs is not None
    row0, expert0 = local.in_pieces[0][0].start, local.in_pieces[1][0].start

    def fire(xs, o):
        grouped_matmul_piece(xs[0], xs[1], xs[2], transpose, o, row0, expert0)

    return fire


@NUMPY.impl(lg.GroupedMatmulGradWeightOp)
def _bind_grouped_matmul_grad_weight(op, local, ins, out) -> Fire:
    row0, expert0 = local.in_pieces[0][0].start, local.out_piece[0].start

    def fire(xs, o):
        grouped_matmul_grad_weight_piece(xs[0], xs[1], xs[2], o, row0, expert0)

    return fire


def _widened(op: Operation, local: LocalContext, ins: Sequence[np.ndarray], out: np.ndarray) -> Fire:
    """The kernel of an op on 16-bit floats: its float32 kernel on float32
    copies of the half inputs, the result rounded once into `out` (the
    reference's semantics)."""
    wide_ins = [np.empty(x.shape, np.float32) if is_half(x.dtype) else None for x in ins]
    wide_out = np.empty(out.shape, np.float32) if is_half(out.dtype) else None
    inner = bind(op, local, [w if w is not None else x for w, x in zip(wide_ins, ins)],
                 wide_out if wide_out is not None else out)

    def fire(xs, o):
        args = []
        for x, w in zip(xs, wide_ins):
            if w is not None:
                np.copyto(w, x)
            args.append(x if w is None else w)
        if wide_out is None:
            inner(args, o)
        else:
            inner(args, wide_out)
            np.copyto(o, wide_out)

    return fire


def bind_parts(op: Operation, ins: Sequence[np.ndarray], out: np.ndarray):
    """For a matmul long enough to split: parts(xs, o), a generator that
    computes `o` one block of output columns at a time and yields after
    each; None for anything else. The blocks write disjoint columns of the
    output, each a strided view BLAS takes as is."""
    if not isinstance(op, lg.MatmulOp) or out.ndim < 2 or is_half(out.dtype):
        return None
    ta, tb = op.transpose_lhs is not None, op.transpose_rhs is not None
    k = ins[0].shape[-2] if ta else ins[0].shape[-1]
    columns = out.shape[-1]
    flops = 2.0 * math.prod(out.shape) * k
    count = plan.matmul_blocks(flops, columns)
    if count < 2:
        return None
    width = -(-columns // count)

    def parts(xs, o):
        a, b = xs
        a, b, o = gemm_operands(np.swapaxes(a, -1, -2) if ta else a, np.swapaxes(b, -1, -2) if tb else b, o)
        for j in range(0, columns, width):
            np.matmul(a, b[..., j:j + width], out=o[..., j:j + width])
            yield

    return parts


# -- softmax, layernorm -------------------------------------------------------------


@NUMPY.impl(lg.SoftmaxOp)
def _bind_softmax(op: lg.SoftmaxOp, local, ins, out) -> Fire:
    axis = op.axis.value.data
    m = scratch(_kept(out.shape, {axis}), out.dtype)

    def fire(xs, o):
        np.max(xs[0], axis=axis, keepdims=True, out=m)
        np.subtract(xs[0], m, out=o)
        np.exp(o, out=o)
        np.sum(o, axis=axis, keepdims=True, out=m)
        np.divide(o, m, out=o)

    return fire


@NUMPY.impl(lg.LogSoftmaxOp)
def _bind_log_softmax(op: lg.LogSoftmaxOp, local, ins, out) -> Fire:
    axis = op.axis.value.data
    m = scratch(_kept(out.shape, {axis}), out.dtype)
    e = scratch(out.shape, out.dtype)

    def fire(xs, o):
        np.max(xs[0], axis=axis, keepdims=True, out=m)
        np.subtract(xs[0], m, out=o)  # shifted
        np.exp(o, out=e)
        np.sum(e, axis=axis, keepdims=True, out=m)
        np.log(m, out=m)
        np.subtract(o, m, out=o)

    return fire


MIN_GEMV_REDUCE = 16
"""A sum over at least this many trailing elements runs as a GEMV."""


def _summer(shape: Sequence[int], axes: Sequence[int], keepdims: bool, dtype):
    """sum(x, o): the sum of x over `axes` into o. Over the trailing axes of
    a float array (layernorm's statistics, softmax-like reductions) it is one
    GEMV, x as rows times a vector of ones, several times faster than
    numpy's reduction loop; over trailing axes and leading ones (batch
    normalization's statistics of NCHW images: axes 0, 2, 3) a GEMV over the
    trailing ones, then np.sum over the leading ones of what is left (3-6x
    np.sum over all of them); elsewhere np.sum. (The order of additions
    differs from np.sum's pairwise one, by float32 rounding.)"""
    n = len(shape)
    axes = tuple(sorted(a % n for a in axes)) if n else ()
    trailing = 0
    while trailing < len(axes) and axes[len(axes) - 1 - trailing] == n - 1 - trailing:
        trailing += 1
    k = math.prod(shape[n - trailing:])
    if np.dtype(dtype).kind != "f" or not trailing or k < MIN_GEMV_REDUCE:
        return lambda x, o: np.sum(x, axis=axes, keepdims=keepdims, out=o)
    rows = math.prod(shape) // k
    ones = np.ones((k, 1), dtype)
    if trailing == len(axes):
        def gemv(x, o):
            np.matmul(x.reshape(rows, k), ones, out=o.reshape(rows, 1))

        return gemv
    leading = axes[:len(axes) - trailing]
    left = scratch(shape[:n - trailing], dtype)  # the sums over the trailing axes
    kept = _kept(left.shape, set(leading))

    def gemv_then_sum(x, o):
        np.matmul(x.reshape(rows, k), ones, out=left.reshape(rows, 1))
        np.sum(left, axis=leading, keepdims=True, out=o.reshape(kept))

    return gemv_then_sum


def _mean_into(x: np.ndarray, o: np.ndarray, factor: float | None = None, summer=None, **axes) -> None:
    # np.mean with out= still allocates an input-sized temporary; a sum
    # divided by the count is what it computes.
    if summer is None:
        np.sum(x, out=o, **axes)
    else:
        summer(x, o)
    count = x.size // max(o.size, 1)
    if count:  # an empty piece of a split mean sums to 0 and adds nothing
        np.divide(o, count, out=o)
    if factor is not None:
        np.multiply(o, factor, out=o)


def _deviations_into(x, centred, squares, std, eps: float, summer) -> None:
    """Layernorm's statistics of x's rows: `centred` = x - mean, `std` =
    sqrt(variance + eps) (the variance two-pass, as the reference's);
    `squares` is scratch of x's shape."""
    _mean_into(x, std, summer=summer)
    np.subtract(x, std, out=centred)
    np.multiply(centred, centred, out=squares)
    _mean_into(squares, std, summer=summer)
    np.add(std, eps, out=std)
    np.sqrt(std, out=std)


@NUMPY.impl(lg.LayerNormOp)
def _bind_layernorm(op: lg.LayerNormOp, local, ins, out) -> Fire:
    axes = tuple(range(op.axis.value.data, out.ndim))
    eps = op.epsilon.value.data
    stat = scratch(_kept(out.shape, set(axes)), out.dtype)
    sq = scratch(out.shape, out.dtype)
    summer = _summer(out.shape, axes, True, out.dtype)

    def fire(xs, o):
        _deviations_into(xs[0], o, sq, stat, eps, summer)
        np.divide(o, stat, out=o)
        if len(xs) == 3:
            np.multiply(o, xs[1], out=o)
            np.add(o, xs[2], out=o)

    return fire


@NUMPY.impl(lg.LayerNormGradOp)
def _bind_layernorm_grad(op: lg.LayerNormGradOp, local, ins, out) -> Fire:
    axes = tuple(range(op.axis.value.data, out.ndim))
    eps = op.epsilon.value.data
    kept = _kept(out.shape, set(axes))
    rstd, m1, m2 = (scratch(kept, out.dtype) for _ in range(3))
    xhat = scratch(out.shape, out.dtype)
    summer = _summer(out.shape, axes, True, out.dtype)

    def fire(xs, o):  # o (never an input's bytes: not an in-place kernel) holds the products
        x, g = xs
        _deviations_into(x, xhat, o, rstd, eps, summer)
        np.divide(1, rstd, out=rstd)
        np.multiply(xhat, rstd, out=xhat)
        _mean_into(g, m1, summer=summer)
        np.multiply(g, xhat, out=o)
        _mean_into(o, m2, summer=summer)
        np.multiply(xhat, m2, out=xhat)
        np.subtract(g, m1, out=o)
        np.subtract(o, xhat, out=o)
        np.multiply(o, rstd, out=o)

    return fire


# -- reductions ----------------------------------------------------------------------


def _bind_reduce(fn) -> Binder:
    def bind(op: lg.ReduceOp, local, ins, out):
        axes = tuple(op.axes.get_values())
        keep = op.keepdims is not None

        def fire(xs, o):
            fn(xs[0], axis=axes, keepdims=keep, out=o)

        return fire

    return bind


@NUMPY.impl(lg.ReduceSumOp)
def _bind_reduce_sum(op: lg.ReduceSumOp, local, ins, out) -> Fire:
    summer = _summer(ins[0].shape, tuple(op.axes.get_values()), op.keepdims is not None, out.dtype)
    return lambda xs, o: summer(xs[0], o)


def _scale(local_n: int, global_n: int) -> float | None:
    """A split mean's factor (local count / global count), as
    local_eval._global_count_scaled; None where it is 1; NaN for a mean
    over no elements at all (numpy's and PyTorch's mean of nothing)."""
    if global_n == 0:
        return math.nan
    return local_n / global_n if local_n != global_n else None


@NUMPY.impl(lg.ReduceMeanOp)
def _bind_reduce_mean(op: lg.ReduceMeanOp, local: LocalContext, ins, out) -> Fire:
    axes = tuple(op.axes.get_values())
    keep = op.keepdims is not None
    factor = _scale(math.prod(ins[0].shape[a] for a in axes), math.prod(local.in_shapes[0][a] for a in axes))
    summer = _summer(ins[0].shape, axes, keep, out.dtype)

    def fire(xs, o):
        _mean_into(xs[0], o, factor, summer)

    return fire


# -- losses ---------------------------------------------------------------------------


@NUMPY.impl(lg.CrossEntropyOp)
def _bind_cross_entropy(op: lg.CrossEntropyOp, local: LocalContext, ins, out) -> Fire:
    # -mean over rows of (x[r, label] - max_r) - log(sum exp(x[r] - max_r)):
    # the reference's log_softmax, evaluated only where it is picked.
    logits, labels = ins
    classes = logits.shape[-1]
    rows = labels.size
    m = scratch((*logits.shape[:-1], 1), logits.dtype)
    e = scratch(logits.shape, logits.dtype)
    base = np.arange(rows, dtype=np.int64) * classes
    flat = scratch((rows,), np.int64)
    picked = scratch((rows,), logits.dtype)
    factor = _scale(labels.size, math.prod(local.in_shapes[1]))

    def fire(xs, o):
        x, lab = xs
        check_range(op, "label", lab, classes)
        np.max(x, axis=-1, keepdims=True, out=m)
        np.subtract(x, m, out=e)
        np.exp(e, out=e)
        np.add(base, lab.reshape(-1), out=flat)
        np.take(x.reshape(-1), flat, out=picked, mode="clip")
        np.subtract(picked, m.reshape(-1), out=picked)
        np.sum(e, axis=-1, keepdims=True, out=m)
        np.log(m, out=m)
        np.subtract(picked, m.reshape(-1), out=picked)
        np.negative(picked, out=picked)
        _mean_into(picked, o, factor)

    return fire


# -- the vocabulary-parallel cross-entropy ------------------------------------------------

ROW_BLOCK_ELEMENTS = 1 << 20
"""lg.sum_exp works through rows in blocks of about this many elements, so
its scratch stays at 4 MiB of float32 beside a vocabulary's logits."""


@NUMPY.impl(lg.SumExpOp)
def _bind_sum_exp(op: lg.SumExpOp, local, ins, out) -> Fire:
    classes = ins[0].shape[-1]
    rows = math.prod(ins[0].shape[:-1])
    block = max(1, min(rows, ROW_BLOCK_ELEMENTS // max(classes, 1)))
    e = scratch((block, classes), ins[0].dtype)

    def fire(xs, o):
        x, shift, total = xs[0].reshape(rows, classes), xs[1].reshape(rows, 1), o.reshape(rows)
        for r in range(0, rows, block):
            n = min(block, rows - r)
            np.subtract(x[r:r + n], shift[r:r + n], out=e[:n])
            np.exp(e[:n], out=e[:n])
            np.sum(e[:n], axis=1, out=total[r:r + n])

    return fire


class _LabelRows:
    """Per-row scratch of the token cross-entropy kernels, for logits holding
    classes `piece` of `total`: which rows count, and for each row the flat
    index of its label in the local logits (its row's first element where
    another device holds the label). Filled without allocating."""

    def __init__(self, op, local: LocalContext, rows: int, columns: int):
        self.op, self.ignored = op, op.ignored
        self.piece, self.total = local.in_pieces[0][-1], local.in_shapes[0][-1]
        self.counted, self.skipped = scratch((rows,), np.bool_), scratch((rows,), np.bool_)
        self.owned, self.elsewhere = scratch((rows,), np.bool_), scratch((rows,), np.bool_)
        self.flat = scratch((rows,), np.int64)
        self.base = np.arange(rows, dtype=np.int64) * columns

    def fill(self, labels: np.ndarray) -> None:
        flat, owned, elsewhere = self.flat, self.owned, self.elsewhere
        if self.ignored is None:
            self.counted.fill(True)
            self.skipped.fill(False)
            check_range(self.op, "label", labels, self.total)
        else:
            np.not_equal(labels, self.ignored, out=self.counted)
            np.logical_not(self.counted, out=self.skipped)
            np.copyto(flat, labels, casting="unsafe")
            np.copyto(flat, 0, where=self.skipped)  # an ignored label may be any value
            check_range(self.op, "label", flat, self.total)
        np.greater_equal(labels, self.piece.start, out=owned)
        np.less(labels, self.piece.stop, out=elsewhere)
        np.logical_and(owned, elsewhere, out=owned)
        np.logical_and(owned, self.counted, out=owned)
        np.logical_not(owned, out=elsewhere)
        np.subtract(labels, self.piece.start, out=flat, casting="unsafe")
        np.copyto(flat, 0, where=elsewhere)
        np.add(flat, self.base, out=flat)


@NUMPY.impl(lg.TokenCrossEntropyOp)
def _bind_token_cross_entropy(op: lg.TokenCrossEntropyOp, local, ins, out) -> Fire:
    # the row's log-sum-exp where this device holds class 0, minus the
    # label's logit where it holds the label (reference.token_cross_entropy)
    rows, columns = ins[1].size, ins[0].shape[-1]
    labels = _LabelRows(op, local, rows, columns)
    first = labels.piece.start == 0
    picked = scratch((rows,), out.dtype)

    def fire(xs, o):
        x, lab, row_max, sum_exp = xs
        res = o.reshape(rows)
        labels.fill(lab.reshape(rows))
        if columns:
            np.take(x.reshape(-1), labels.flat, out=picked, mode="clip")
            np.copyto(picked, 0, where=labels.elsewhere)
        else:
            picked.fill(0)
        if first:
            np.log(sum_exp.reshape(rows), out=res)
            np.add(res, row_max.reshape(rows), out=res)
            np.subtract(res, picked, out=res)
        else:
            np.negative(picked, out=res)
        np.copyto(res, 0, where=labels.skipped)

    return fire


@NUMPY.impl(lg.TokenCrossEntropyGradOp)
def _bind_token_cross_entropy_grad(op: lg.TokenCrossEntropyGradOp, local, ins, out) -> Fire:
    # written into the output: exp(x - max) * (grad / sum_exp), then the
    # label's column less grad (reference.token_cross_entropy_grad)
    rows, columns = ins[1].size, ins[0].shape[-1]
    labels = _LabelRows(op, local, rows, columns)
    scale = scratch((rows, 1), out.dtype)
    picked = scratch((rows,), out.dtype)

    def fire(xs, o):
        x, lab, row_max, sum_exp, grad = xs
        labels.fill(lab.reshape(rows))
        grid = o.reshape(rows, columns)
        np.subtract(x.reshape(rows, columns), row_max.reshape(rows, 1), out=grid)
        np.exp(grid, out=grid)
        np.divide(grad.reshape(rows, 1), sum_exp.reshape(rows, 1), out=scale)
        np.copyto(scale[:, 0], 0, where=labels.skipped)
        np.multiply(grid, scale, out=grid)
        if columns:
            flat = o.reshape(-1)
            np.take(flat, labels.flat, out=picked, mode="clip")
            np.copyto(scale[:, 0], grad.reshape(rows), where=labels.owned)
            np.copyto(scale[:, 0], 0, where=labels.elsewhere)
            np.subtract(picked, scale[:, 0], out=picked)
            np.put(flat, labels.flat, picked, mode="clip")

    return fire


@NUMPY.impl(lg.MseLossOp)
def _bind_mse(op: lg.MseLossOp, local: LocalContext, ins, out) -> Fire:
    d = scratch(np.broadcast_shapes(ins[0].shape, ins[1].shape), out.dtype)
    factor = _scale(ins[0].size, math.prod(local.in_shapes[0]))

    def fire(xs, o):
        np.subtract(xs[0], xs[1], out=d)
        np.square(d, out=d)
        _mean_into(d, o, factor)

    return fire


# -- gathers and scatters ---------------------------------------------------------------


@NUMPY.impl(lg.PadOp)
def _bind_pad(op: lg.PadOp, local, ins, out) -> Fire:
    p = op.params()
    inside = tuple(slice(lo, lo + d) for lo, d in zip(p["low"], ins[0].shape))
    fill = np.asarray(p["value"]).astype(out.dtype)

    def fire(xs, o):
        o.fill(fill)
        o[inside] = xs[0]

    return fire


@NUMPY.impl(lg.CumsumOp)
def _bind_cumsum(op: lg.CumsumOp, local: LocalContext, ins, out) -> Fire:
    axis, reverse = op.params()["axis"], op.params()["reverse"]
    piece, length = local.in_pieces[0][axis], local.in_shapes[0][axis]

    def fire(xs, o):
        cumsum_piece(xs[0], axis, reverse, piece, length, o)

    return fire


@NUMPY.impl(lg.ArgmaxOp)
def _bind_argmax(op: lg.ArgmaxOp, local: LocalContext, ins, out) -> Fire:
    axis = op.params()["axis"]

    def fire(xs, o):
        np.argmax(xs[0], axis=axis, out=o)

    return fire


TOPK_BLOCK = 1024
"""Elements a top-k firing sorts at once: a sort allocates its keys and
order (about 25 bytes an element), so a block's temporaries stay within a
steady step's allocation bound; a line longer than this is one block."""


@NUMPY.impl(lg.TopkOp)
def _bind_topk(op: lg.TopkOp, local: LocalContext, ins, out) -> Fire:
    p = op.params()
    k, axis, smallest = p["k"], p["axis"], p["smallest"]
    shape = tuple(s.stop - s.start for s in local.in_pieces[0])  # this device's piece (the axis whole)
    outer, n, inner = math.prod(shape[:axis]), shape[axis], math.prod(shape[axis + 1:])
    if n * inner <= TOPK_BLOCK:  # whole planes of (n, inner), several at once
        rows = TOPK_BLOCK // max(1, n * inner)
        blocks = [(slice(a, a + rows), slice(None)) for a in range(0, outer, rows)]
    else:  # part of one plane: some of its lines across the inner axes
        step = max(1, TOPK_BLOCK // max(1, n))
        blocks = [(slice(a, a + 1), slice(b, b + step)) for a in range(outer) for b in range(0, inner, step)]

    def fire(xs, o):
        lines, picked = xs[0].reshape(outer, n, inner), o.reshape(outer, k, inner)
        for rows, columns in blocks:
            picked[rows, :, columns] = topk_indices(lines[rows, :, columns], k, 1, smallest)

    return fire


@NUMPY.impl(lg.DropoutOp)
def _bind_dropout(op: lg.DropoutOp, local: LocalContext, ins, out) -> Fire:
    # the piece's counters found once; each firing draws them for its seed and step
    p = op.params()
    mask = DropoutMask(local.in_shapes[0], local.in_pieces[0], p["rate"], p["stream"], p["micro_batch"])
    kept = scratch(out.shape, np.bool_)
    factors = scratch(out.shape, out.dtype)

    def fire(xs, o):
        mask.factors(int(xs[1]), int(xs[2]), o.dtype, factors, kept)
        np.multiply(xs[0], factors, out=o)

    return fire


@NUMPY.impl(lg.UniformOp)
def _bind_uniform(op: lg.UniformOp, local: LocalContext, ins, out) -> Fire:
    # the piece's counters found once; each firing draws them for its seed and step
    draws = UniformDraws(local.out_shape, local.out_piece, op.params()["stream"])

    def fire(xs, o):
        draws.values(int(xs[0]), int(xs[1]), o.dtype, o)

    return fire


class _AlongAxis:
    """Flat indices into a contiguous array of local `shape` for positions
    of the local `index_shape`, with the coordinate on `axis` taken from an
    index tensor, for those indices `rows` holds (of `total` along the
    axis); the others are marked and point at offset 0. Filled without
    allocating."""

    def __init__(self, op, shape, index_shape, axis: int, rows: slice, total: int):
        self.op, self.axis, self.rows, self.total = op, axis, rows, total
        stride = strides_of(shape)
        coords = np.indices(index_shape, sparse=True)
        self.base = sum((c * stride[d] for d, c in enumerate(coords) if d != axis), np.zeros(index_shape, np.int64))
        self.base = np.ascontiguousarray(np.broadcast_to(self.base, index_shape), dtype=np.int64)
        self.stride = stride[axis]
        self.flat = scratch(index_shape, np.int64)
        self.outside, self.below = scratch(index_shape, np.bool_), scratch(index_shape, np.bool_)

    def fill(self, indices: np.ndarray) -> None:
        check_range(self.op, "index", indices, self.total)
        np.subtract(indices, self.rows.start, out=self.flat, casting="unsafe")
        np.less(self.flat, 0, out=self.below)
        np.greater_equal(self.flat, self.rows.stop - self.rows.start, out=self.outside)
        np.logical_or(self.outside, self.below, out=self.outside)
        np.copyto(self.flat, 0, where=self.outside)
        np.multiply(self.flat, self.stride, out=self.flat)
        np.add(self.flat, self.base, out=self.flat)


def strides_of(shape) -> list[int]:
    """Element strides of a contiguous array of `shape`."""
    out, acc = [], 1
    for d in reversed(shape):
        out.append(acc)
        acc *= d
    return out[::-1]


@NUMPY.impl(lg.GatherOp)
def _bind_gather(op: lg.GatherOp, local: LocalContext, ins, out) -> Fire:
    # the elements the local input holds, 0 for the others (local_eval._gather)
    axis = op.axis.value.data
    at = _AlongAxis(op, ins[0].shape, ins[1].shape, axis, local.in_pieces[0][axis], local.in_shapes[0][axis])
    empty = ins[0].shape[axis] == 0

    def fire(xs, o):
        at.fill(xs[1])
        if empty:
            o.fill(0)
            return
        np.take(xs[0].reshape(-1), at.flat, out=o, mode="clip")
        np.copyto(o, 0, where=at.outside)

    return fire


@NUMPY.impl(lg.ScatterOp)
def _bind_scatter(op: lg.ScatterOp, local: LocalContext, ins, out) -> Fire:
    # the input copied into a buffer one element longer, the updates put in
    # order (the last aimed at an element wins) with those aimed at rows
    # another device holds sent to the extra element, then copied out:
    # nothing allocated per firing
    axis = op.axis.value.data
    at = _AlongAxis(op, out.shape, ins[1].shape, axis, local.in_pieces[0][axis], local.in_shapes[0][axis])
    buffer = scratch((out.size + 1,), out.dtype)

    def fire(xs, o):
        at.fill(xs[1])
        np.copyto(at.flat, out.size, where=at.outside)
        np.copyto(buffer[:-1].reshape(o.shape), xs[0])
        np.put(buffer, at.flat, xs[2])
        np.copyto(o, buffer[:-1].reshape(o.shape))

    return fire


@NUMPY.impl(lg.ScatterAddOp)
def _bind_scatter_add(op: lg.ScatterAddOp, local: LocalContext, ins, out) -> Fire:
    axis = op.axis.value.data
    at = _AlongAxis(op, out.shape, ins[1].shape, axis, local.out_piece[axis], local.out_shape[axis])
    kept = scratch(ins[0].shape, out.dtype)

    def fire(xs, o):
        at.fill(xs[1])
        np.copyto(kept, xs[0])
        np.copyto(kept, 0, where=at.outside)
        o.fill(0)
        if o.size:
            np.add.at(o.reshape(-1), at.flat.reshape(-1), kept.reshape(-1))

    return fire


def _bind_embedding_grad_rows(op: lg.EmbeddingGradOp, piece: slice, rows: int, padding) -> Fire:
    """The table rows [lo, hi) of an embedding's gradient (S(0), from rows
    gathered by the index, I): the gradient rows whose index falls there."""
    lo, hi = piece.start, piece.stop

    def fire(xs, o):
        grad, ind = xs
        ind = ind.reshape(-1)
        check_range(op, "index", ind, rows)
        here = (ind >= lo) & (ind < hi)
        o.fill(0)
        np.add.at(o, ind[here] - lo, grad.reshape(len(ind), -1)[here])
        if padding is not None and lo <= padding < hi:
            o[padding - lo] = 0

    return fire


@NUMPY.impl(lg.EmbeddingOp)
def _bind_embedding(op: lg.EmbeddingOp, local: LocalContext, ins, out) -> Fire:
    # A table split by rows holds rows [lo, hi): gather those, zero the rest
    # (local_eval._embedding); an index outside the whole table is an error.
    table, indices = ins
    total = local.in_shapes[0][0]
    rows = local.in_pieces[0][0]
    lo, hi = rows.start, rows.stop
    whole = (lo, hi) == (0, total)
    idx = scratch(indices.shape, np.int64)
    outside = scratch((*indices.shape, 1), np.bool_)
    below = scratch(indices.shape, np.bool_)

    def fire(xs, o):
        t, ind = xs
        check_range(op, "index", ind, total)
        if whole:
            np.take(t, ind, axis=0, out=o, mode="clip")
            return
        if t.shape[0] == 0:
            o.fill(0)
            return
        np.subtract(ind, lo, out=idx)
        np.less(idx, 0, out=below)
        np.greater_equal(idx, hi - lo, out=outside[..., 0])
        np.logical_or(outside[..., 0], below, out=outside[..., 0])
        np.copyto(idx, 0, where=outside[..., 0])
        np.take(t, idx, axis=0, out=o, mode="clip")
        np.copyto(o, 0, where=outside)

    return fire


@NUMPY.impl(lg.OneHotOp)
def _bind_one_hot(op: lg.OneHotOp, local, ins, out) -> Fire:
    classes = op.classes.value.data
    rows = ins[0].size
    base = np.arange(rows, dtype=np.int64) * classes
    flat = scratch((rows,), np.int64)

    ignored = op.ignored

    def fire(xs, o):
        labels = xs[0].reshape(-1)
        o.fill(0)
        if ignored is not None:
            kept = labels != ignored
            check_range(op, "label", labels[kept], classes)
            o.reshape(rows, classes)[np.flatnonzero(kept), labels[kept]] = 1
            return
        check_range(op, "label", labels, classes)
        np.add(base, labels, out=flat)
        np.put(o, flat, 1, mode="clip")

    return fire


@NUMPY.impl(lg.CastOp)
def _bind_cast(op: lg.CastOp, local, ins, out) -> Fire:
    def fire(xs, o):
        np.copyto(o, xs[0], casting="unsafe")  # to bool: != 0; float to int: toward zero

    return fire


def _kinded(ufuncs: dict) -> Binder:
    """lg.logical and lg.compare: the ufunc of the op's kind."""

    def bind(op, local, ins, out):
        ufunc = ufuncs[op.kind.data]
        return lambda xs, o: ufunc(xs[0], xs[1], out=o)

    return bind


NUMPY.register(lg.LogicalOp, _kinded(LOGICAL))
NUMPY.register(lg.CompareOp, _kinded(COMPARE))


@NUMPY.impl(lg.SelectOp)
def _bind_select(op: lg.SelectOp, local, ins, out) -> Fire:
    def fire(xs, o):
        condition, if_true, if_false = xs
        np.copyto(o, if_false)
        np.copyto(o, if_true, where=condition)

    return fire


ONE_HOT_ELEMENTS = 1 << 22
"""An embedding gradient whose one-hot matrix (indices x table rows) has at
most this many elements is one GEMM, one_hot^T @ grad; a larger table (a
real vocabulary) scatters with np.add.at, which is slower per index but
needs no scratch."""


@NUMPY.impl(lg.EmbeddingGradOp)
def _bind_embedding_grad(op: lg.EmbeddingGradOp, local, ins, out) -> Fire:
    rows, padding = op.rows.value.data, op.padding
    count = ins[1].size
    piece = local.out_piece[0]
    if (piece.start, piece.stop) != (0, rows):
        return _bind_embedding_grad_rows(op, piece, rows, padding)
    if rows * count <= ONE_HOT_ELEMENTS:
        hot = scratch((count, rows), out.dtype)
        positions = np.arange(count)

        def fire(xs, o):
            grad, ind = xs
            check_range(op, "index", ind, rows)
            hot.fill(0)
            hot[positions, ind.reshape(-1)] = 1
            if padding is not None:
                hot[:, padding] = 0
            np.matmul(hot.T, grad.reshape(count, grad.shape[-1]), out=o)

        return fire

    def scatter(xs, o):
        grad, ind = xs
        check_range(op, "index", ind, rows)
        o.fill(0)
        np.add.at(o, ind.reshape(-1), grad.reshape(-1, grad.shape[-1]))
        if padding is not None:
            o[padding] = 0

    return scatter


# -- data movement -----------------------------------------------------------------


@NUMPY.impl(lg.ReshapeOp)
def _bind_reshape(op, local, ins, out) -> Fire:
    def fire(xs, o):
        if xs[0].ctypes.data != o.ctypes.data:  # written in place: the bytes are already there
            np.copyto(o, xs[0].reshape(o.shape))

    return fire


@NUMPY.impl(lg.BroadcastToOp)
def _bind_broadcast(op, local, ins, out) -> Fire:
    return lambda xs, o: np.copyto(o, xs[0])


@NUMPY.impl(lg.TransposeOp)
def _bind_transpose(op: lg.TransposeOp, local, ins, out) -> Fire:
    perm = tuple(op.perm.get_values())
    return lambda xs, o: np.copyto(o, xs[0].transpose(perm))


@NUMPY.impl(lg.ConcatOp)
def _bind_concat(op: lg.ConcatOp, local, ins, out) -> Fire:
    axis = op.axis.value.data
    places, start = [], 0
    for x in ins:
        index = [slice(None)] * out.ndim
        index[axis] = slice(start, start + x.shape[axis])
        places.append(tuple(index))
        start += x.shape[axis]

    def fire(xs, o):
        for x, place in zip(xs, places):
            np.copyto(o[place], x)

    return fire


@NUMPY.impl(lg.SliceOp)
def _bind_slice(op: lg.SliceOp, local: LocalContext, ins, out) -> Fire:
    # only axes the slice keeps whole are split; those stay whole locally
    p = op.params()
    index = tuple(
        slice(None) if (lo, hi, st) == (0, d, 1) else slice(lo, hi, st)
        for lo, hi, st, d in zip(p["starts"], p["limits"], p["strides"], local.in_shapes[0])
    )
    return lambda xs, o: np.copyto(o, xs[0][index])


FUSED_TILE_ELEMENTS = 1 << 18
"""A fused chain over a larger output runs on blocks of rows of about this
many elements (1 MiB of float32), so its intermediates stay in cache: the
chain reads and writes memory once instead of once per step."""


@NUMPY.impl(Fused)
def _bind_fused(op: Fused, local, ins, out) -> Fire:
    tiled = _bind_fused_rows(op, local, ins, out)
    return tiled if tiled is not None else _bind_fused_whole(op, local, ins, out)


def _row_tiled(shape: Sequence[int], out_shape: Sequence[int]) -> bool | None:
    """Whether a value of `shape` in a chain with output `out_shape` is cut
    into the same blocks of rows (axis 0) as the output (True), used whole
    because it broadcasts along axis 0 (False), or neither (None)."""
    if len(shape) == len(out_shape) and shape[0] == out_shape[0]:
        return True
    if len(shape) < len(out_shape) or shape[0] == 1:
        return False
    return None


def _bind_fused_rows(op: Fused, local, ins, out) -> Fire | None:
    """The chain run block of rows by block of rows (see
    FUSED_TILE_ELEMENTS), when every input and intermediate either has the
    output's rows or broadcasts along them; None otherwise. Each block reads
    its rows of every input before writing its rows of the output, so an
    output written in place over an input stays correct."""
    if out.ndim == 0 or out.size <= FUSED_TILE_ELEMENTS:
        return None
    shapes = [x.shape for x in ins] + [tuple(global_shape(step.results[0].type)) for step, _ in op.steps]
    cut = [_row_tiled(shape, out.shape) for shape in shapes]
    if None in cut or not cut[-1]:
        return None
    rows = max(1, FUSED_TILE_ELEMENTS // (out.size // out.shape[0]))
    if rows >= out.shape[0]:
        return None
    cut_inputs = cut[: len(ins)]

    def block(xs, count):
        return [x[:count] if c else x for x, c in zip(xs, cut_inputs)]

    full = _bind_fused_whole(op, local, block(ins, rows), out[:rows], rows)
    rest = out.shape[0] % rows
    last = _bind_fused_whole(op, local, block(ins, rest), out[:rest], rest) if rest else None

    def fire(xs, o):
        total = o.shape[0]
        for r0 in range(0, total, rows):
            r1 = min(total, r0 + rows)
            part = [x[r0:r1] if c else x for x, c in zip(xs, cut_inputs)]
            (full if r1 - r0 == rows else last)(part, o[r0:r1])

    return fire


def _bind_fused_whole(op: Fused, local, ins, out, rows: int | None = None) -> Fire:
    # Intermediates go to scratch, reused once dead (same shape and dtype;
    # every step is elementwise, so a step may write over an argument that
    # dies there); the last step writes `out`. With `rows`, the chain is
    # bound for a block of that many of the output's rows.
    n = len(ins)
    last_use = {a: j for j, (_, args) in enumerate(op.steps) for a in args}
    values: list[np.ndarray] = list(ins)
    free: list[np.ndarray] = []
    program = []
    for j, (step, args) in enumerate(op.steps):
        for a in set(args):
            if a >= n and last_use[a] == j:
                free.append(values[a])
        if j == len(op.steps) - 1:
            dest = None
        else:
            shape, dtype = tuple(global_shape(step.results[0].type)), numpy_dtype(element_type(step.results[0].type))
            if rows is not None and _row_tiled(shape, global_shape(op.steps[-1][0].results[0].type)):
                shape = (rows, *shape[1:])
            dest = next((f for f in free if f.shape == shape and f.dtype == dtype), None)
            if dest is None:
                dest = scratch(shape, dtype)
            else:
                free = [f for f in free if f is not dest]
        bound = NUMPY[type(step)](step, local, [values[a] for a in args], out if dest is None else dest)
        values.append(out if dest is None else dest)
        program.append((bound, args, dest))

    def fire(xs, o):
        vals = list(xs) + [None] * len(program)
        for j, (step_fire, args, dest) in enumerate(program):
            target = o if dest is None else dest
            step_fire([vals[a] for a in args], target)
            vals[n + j] = target

    return fire


NUMPY.register(lg.NegOp, _unary(lambda x, o: np.negative(x, out=o)))
NUMPY.register(lg.ReluOp, _unary(lambda x, o: np.maximum(x, 0, out=o)))
NUMPY.register(lg.TanhOp, _unary(lambda x, o: np.tanh(x, out=o)))
NUMPY.register(lg.ErfOp, _unary(lambda x, o: erf(x, out=o)))
NUMPY.register(lg.ExpOp, _unary(lambda x, o: np.exp(x, out=o)))
NUMPY.register(lg.SqrtOp, _unary(lambda x, o: np.sqrt(x, out=o)))
NUMPY.register(lg.RsqrtOp, _unary(_rsqrt))
NUMPY.register(lg.StepOp, _unary(lambda x, o: np.greater(x, 0, out=o)))
NUMPY.register(lg.StopGradientOp, _unary(lambda x, o: np.copyto(o, x)))
def _ufunc_kernel(ufunc: np.ufunc) -> Callable:
    return _unary(lambda x, o: ufunc(x, out=o))


for _op, _ufunc in ((lg.LogOp, np.log), (lg.SinOp, np.sin), (lg.CosOp, np.cos), (lg.AtanOp, np.arctan),
                    (lg.FloorOp, np.floor), (lg.CeilOp, np.ceil), (lg.RoundOp, np.rint), (lg.TruncOp, np.trunc)):
    NUMPY.register(_op, _ufunc_kernel(_ufunc))
NUMPY.register(lg.AddOp, _binary(np.add))
NUMPY.register(lg.SubOp, _binary(np.subtract))
NUMPY.register(lg.MulOp, _binary(np.multiply))
NUMPY.register(lg.DivOp, _binary(np.divide))


@NUMPY.impl(lg.FloorDivOp)
def _bind_floor_divide(op, local, ins, out) -> Fire:
    zero = scratch(ins[1].shape, np.bool_)

    def fire(xs, o):
        floor_divide(xs[0], xs[1], o, zero)

    return fire
NUMPY.register(lg.ReduceMaxOp, _bind_reduce(max_with_identity))


def _alias_safe(op: type) -> bool:
    """Kernels that may write over an input of their output's type:
    elementwise ones and fused chains of them (they read an element before
    writing it) and byte-preserving ones (a reshape over its input)."""
    return op is Fused or lg.may_run_in_place(op)


def bind(op: Operation, local: LocalContext, ins: Sequence[np.ndarray], out: np.ndarray) -> Fire:
    """The out= kernel of `op` bound to registers shaped like `ins`/`out`."""
    if any(is_half(x.dtype) for x in (*ins, out)):
        return _widened(op, local, ins, out)
    binder = NUMPY.get(type(op))
    if binder is None:
        raise EvaluationError(f"no numpy kernel for {op.name}")
    fire = binder(op, local, ins, out)
    if _alias_safe(type(op)):
        return fire
    spare: list[np.ndarray] = []

    def guarded(xs, o):
        if any(np.may_share_memory(x, o) for x in xs):
            if not spare:
                spare.append(np.empty_like(o))  # once: aliasing is fixed by the plan
            fire(xs, spare[0])
            np.copyto(o, spare[0])
        else:
            fire(xs, o)

    return guarded


# The kernels over windows (numpy_window_kernels.py), registered with the rest.
NUMPY.impl(lg.Conv2dOp)(numpy_window_kernels.bind_conv2d)
NUMPY.impl(lg.Conv2dGradWeightOp)(numpy_window_kernels.bind_conv2d_grad_weight)
NUMPY.impl(lg.Conv2dGradInputOp)(numpy_window_kernels.bind_conv2d_grad_input)
NUMPY.impl(lg.MaxPool2dOp)(numpy_window_kernels.bind_max_pool2d)
NUMPY.impl(lg.MaxPool2dGradOp)(numpy_window_kernels.bind_max_pool2d_grad)
