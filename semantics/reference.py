"""The reference interpreter: evaluates an `lg` graph with numpy.

It defines the semantics every later level must preserve. It evaluates global
values, so it also runs graphs whose values carry distributions: an
`sbp.annotate` or a collective is the identity on the global tensor.

    outputs = evaluate(module, {"x": x})                 # params from initializers
    outputs = evaluate(module, {"x": x}, params={"w": w})
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Attribute, Operation

from sbpc.dialects import lg, sbp
from sbpc.dialects.backends import Backend
from sbpc.dialects.dtypes import is_float_dtype, is_half, numpy_dtype
from sbpc.dialects.sbp import element_type, global_shape


class EvaluationError(Exception):
    """A graph cannot be evaluated with the given feeds and parameters."""


def initial_value(param: lg.ParamOp) -> np.ndarray:
    """The first value of a parameter, from its initializer.

    The random stream is seeded by the seed and the parameter's name, so two
    parameters with the default seed still differ, and every process that
    evaluates the same parameter gets the same global tensor.
    """
    return initialize(
        param.init, param.seed.value.data, param.key.data, global_shape(param.result.type),
        numpy_dtype(element_type(param.result.type)),
    )


def initialize(init: Attribute, seed: int, key: str, shape, dtype) -> np.ndarray:
    """A parameter's global initial value (see initial_value)."""
    rng = np.random.default_rng([seed % 2**64, zlib.crc32(key.encode())])
    if isinstance(init, lg.ZerosInitAttr):
        value = np.zeros(shape)
    elif isinstance(init, lg.OnesInitAttr):
        value = np.ones(shape)
    elif isinstance(init, lg.FillInitAttr):
        value = np.full(shape, init.value.data)
    elif isinstance(init, lg.NormalInitAttr):
        value = rng.normal(init.mean.data, init.std.data, shape)
    elif isinstance(init, lg.UniformInitAttr):
        value = rng.uniform(init.low.data, init.high.data, shape)
    else:
        raise EvaluationError(f'"{key}": unknown initializer {init}')
    return np.asarray(value, dtype=dtype)


def widened(x: np.ndarray) -> np.ndarray:
    """A half-type (f16, bf16) value in float32, what ops on it compute in; others as they are."""
    return x.astype(np.float32) if is_half(x.dtype) else x


def constant_value(value) -> np.ndarray:
    """The global value of a dense<...> literal."""
    flat = np.asarray(value.get_values(), dtype=numpy_dtype(value.get_element_type()))
    shape = tuple(value.get_shape())
    # a splat literal (dense<1.0> : tensor<4xf32>) stores one value
    return np.full(shape, flat.reshape(-1)[0], flat.dtype) if flat.size == 1 else flat.reshape(shape)


def find_graph(module: ModuleOp | lg.GraphOp, name: str | None = None) -> lg.GraphOp:
    """The graph called `name`, or the only graph of the module."""
    if isinstance(module, lg.GraphOp):
        return module
    graphs = lg.graphs(module)
    if name is not None:
        graphs = [g for g in graphs if g.sym_name.data == name]
        if not graphs:
            raise EvaluationError(f"no lg.graph @{name} in the module")
    if len(graphs) != 1:
        raise EvaluationError(f"the module holds {len(graphs)} graphs; name the one to evaluate")
    return graphs[0]


# --------------------------------------------------------------------------
# Kernels: one numpy function per op kind, on global values:
# kernel(op, *operands) -> result
# --------------------------------------------------------------------------

Kernel = Callable[..., np.ndarray]

REFERENCE: Backend[Kernel] = Backend("the reference interpreter")


def check_range(op: Operation | str, what: str, values: np.ndarray, limit: int) -> None:
    """Indices and labels must lie in [0, limit): an error names the op (or
    the op name given)."""
    if values.size:
        lo, hi = values.min(), values.max()
        if lo < 0 or hi >= limit:
            name = op if isinstance(op, str) else op.name
            raise EvaluationError(f"'{name}': {what} out of range [0, {limit}): min {lo}, max {hi}")


def erf(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """The error function, elementwise. scipy is imported on the first call:
    it is a fifth of a rank's start-up (0.15 s), and few graphs have erf."""
    import scipy.special

    return scipy.special.erf(x, out=out)


def _gelu(x: np.ndarray) -> np.ndarray:
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * (x * x * x))))


def _log_softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    e = np.exp(x - np.max(x, axis=axis, keepdims=True))
    return e / np.sum(e, axis=axis, keepdims=True)


REFERENCE.register(lg.NegOp, lambda op, x: -x)
REFERENCE.register(lg.ReluOp, lambda op, x: np.maximum(x, 0))
REFERENCE.register(lg.GeluOp, lambda op, x: _gelu(x))
REFERENCE.register(lg.TanhOp, lambda op, x: np.tanh(x))
REFERENCE.register(lg.ErfOp, lambda op, x: erf(x))
REFERENCE.register(lg.ExpOp, lambda op, x: np.exp(x))
REFERENCE.register(lg.SqrtOp, lambda op, x: np.sqrt(x))
REFERENCE.register(lg.RsqrtOp, lambda op, x: 1.0 / np.sqrt(x))
REFERENCE.register(lg.StepOp, lambda op, x: (x > 0).astype(x.dtype))
REFERENCE.register(lg.StopGradientOp, lambda op, x: x.copy())
for _op, _ufunc in ((lg.LogOp, np.log), (lg.SinOp, np.sin), (lg.CosOp, np.cos), (lg.AtanOp, np.arctan),
                    (lg.FloorOp, np.floor), (lg.CeilOp, np.ceil), (lg.RoundOp, np.rint), (lg.TruncOp, np.trunc)):
    REFERENCE.register(_op, lambda op, x, f=_ufunc: f(x))
REFERENCE.register(lg.AddOp, lambda op, a, b: a + b)
REFERENCE.register(lg.SubOp, lambda op, a, b: a - b)
REFERENCE.register(lg.MulOp, lambda op, a, b: a * b)
REFERENCE.register(lg.DivOp, lambda op, a, b: a / b)


def floor_divide(a: np.ndarray, b: np.ndarray, out: np.ndarray | None = None,
                 zero: np.ndarray | None = None) -> np.ndarray:
    """lg.floordiv: integer division rounded down, 0 where the divisor is
    0. Each element is read before it is written, so `out` may be `a` or
    `b` (an in-place chain); `zero`: scratch of b's shape for the mask."""
    if out is None:
        out = np.empty(np.broadcast_shapes(a.shape, b.shape), np.result_type(a, b))
    mask = np.not_equal(b, 0, out=zero) if zero is not None else np.asarray(b != 0)
    np.floor_divide(a, b, out=out, where=mask)
    np.logical_not(mask, out=mask)
    np.copyto(out, 0, where=mask)
    return out


REFERENCE.register(lg.FloorDivOp, lambda op, a, b: floor_divide(a, b))
REFERENCE.register(lg.SoftmaxOp, lambda op, x: _softmax(x, op.axis.value.data))
REFERENCE.register(lg.LogSoftmaxOp, lambda op, x: _log_softmax(x, op.axis.value.data))
REFERENCE.register(lg.ReshapeOp, lambda op, x: np.reshape(x, global_shape(op.result.type)))
REFERENCE.register(lg.BroadcastToOp, lambda op, x: np.broadcast_to(x, global_shape(op.result.type)))
REFERENCE.register(lg.TransposeOp, lambda op, x: np.transpose(x, tuple(op.perm.get_values())))
REFERENCE.register(lg.ConcatOp, lambda op, *xs: np.concatenate(xs, axis=op.axis.value.data))
REFERENCE.register(lg.MseLossOp, lambda op, a, b: np.mean((a - b) ** 2))


@REFERENCE.impl(lg.LayerNormOp)
def _layernorm(op: lg.LayerNormOp, x: np.ndarray, *affine: np.ndarray) -> np.ndarray:
    axes = tuple(range(op.axis.value.data, x.ndim))
    mean = np.mean(x, axis=axes, keepdims=True)
    var = np.mean((x - mean) ** 2, axis=axes, keepdims=True)
    y = (x - mean) / np.sqrt(var + op.epsilon.value.data)
    if affine:
        y = y * affine[0] + affine[1]
    return y


def expert_groups(ends: np.ndarray, rows: int, row0: int = 0) -> list[tuple[int, int, int]]:
    """(expert, first row, end row) of every group with rows among
    [row0, row0 + rows), the rows counted from row0 (lg.grouped_matmul):
    group g runs from the previous group's end (0 for the first) to
    ends[g]; an end below the one before makes an empty group."""
    groups = []
    start = 0
    for g, end in enumerate(ends.tolist()):
        lo, hi = max(start, row0), min(end, row0 + rows)
        if lo < hi:
            groups.append((g, lo - row0, hi - row0))
        start = max(start, end)
    return groups


def grouped_matmul_piece(x: np.ndarray, w: np.ndarray, ends: np.ndarray, transpose: bool, out: np.ndarray,
                         row0: int = 0, expert0: int = 0) -> np.ndarray:
    """lg.grouped_matmul on a piece: rows from global row `row0`, the
    experts from `expert0` on (an expert split: the others' rows stay 0)."""
    out.fill(0)
    for g, lo, hi in expert_groups(ends, x.shape[0], row0):
        if expert0 <= g < expert0 + w.shape[0]:
            weight = w[g - expert0]
            np.matmul(x[lo:hi], weight.T if transpose else weight, out=out[lo:hi])
    return out


def grouped_matmul_grad_weight_piece(a: np.ndarray, b: np.ndarray, ends: np.ndarray, out: np.ndarray,
                                     row0: int = 0, expert0: int = 0) -> np.ndarray:
    """lg.grouped_matmul_grad_weight on a piece: rows from global row
    `row0`, the result's experts from `expert0` on."""
    out.fill(0)
    for g, lo, hi in expert_groups(ends, a.shape[0], row0):
        if expert0 <= g < expert0 + out.shape[0]:
            np.matmul(a[lo:hi].T, b[lo:hi], out=out[g - expert0])
    return out


@REFERENCE.impl(lg.GroupedMatmulOp)
def _grouped_matmul(op: lg.GroupedMatmulOp, x: np.ndarray, w: np.ndarray, ends: np.ndarray) -> np.ndarray:
    transpose = op.transpose_rhs is not None
    out = np.empty((x.shape[0], w.shape[1] if transpose else w.shape[2]), np.result_type(x, w))
    return grouped_matmul_piece(x, w, ends, transpose, out)


@REFERENCE.impl(lg.GroupedMatmulGradWeightOp)
def _grouped_matmul_grad_weight(op, a: np.ndarray, b: np.ndarray, ends: np.ndarray) -> np.ndarray:
    return grouped_matmul_grad_weight_piece(a, b, ends, np.empty((ends.shape[0], a.shape[1], b.shape[1]),
                                                                  np.result_type(a, b)))


@REFERENCE.impl(lg.LayerNormGradOp)
def _layernorm_grad(op: lg.LayerNormGradOp, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    axes = tuple(range(op.axis.value.data, x.ndim))
    xc = x - np.mean(x, axis=axes, keepdims=True)
    rstd = 1 / np.sqrt(np.mean(xc * xc, axis=axes, keepdims=True) + op.epsilon.value.data)
    xhat = xc * rstd
    return rstd * ((g - np.mean(g, axis=axes, keepdims=True)) - xhat * np.mean(g * xhat, axis=axes, keepdims=True))


@REFERENCE.impl(lg.MatmulOp)
def _matmul(op: lg.MatmulOp, a: np.ndarray, b: np.ndarray) -> np.ndarray:
    if op.transpose_lhs is not None:
        a = np.swapaxes(a, -1, -2)
    if op.transpose_rhs is not None:
        b = np.swapaxes(b, -1, -2)
    return np.matmul(a, b)


def _reduce(fn: Callable[..., np.ndarray]) -> Kernel:
    def kernel(op: lg.ReduceOp, x: np.ndarray) -> np.ndarray:
        return fn(x, axis=tuple(op.axes.get_values()), keepdims=op.keepdims is not None)

    return kernel


def max_with_identity(x: np.ndarray, **kw) -> np.ndarray:
    """np.max whose maximum of nothing is the lowest value (the identity of
    max, as MLIR's and PyTorch's reductions define it): the piece of a
    Pmax value on a device that holds no elements of the reduced axis."""
    lowest = -np.inf if np.issubdtype(x.dtype, np.floating) else np.iinfo(x.dtype).min
    return np.max(x, initial=lowest, **kw)


REFERENCE.register(lg.ReduceSumOp, _reduce(np.sum))
REFERENCE.register(lg.ReduceMeanOp, _reduce(np.mean))
REFERENCE.register(lg.ReduceMaxOp, _reduce(max_with_identity))


@REFERENCE.impl(lg.SliceOp)
def _slice(op: lg.SliceOp, x: np.ndarray) -> np.ndarray:
    p = op.params()
    return x[tuple(slice(lo, hi, st) for lo, hi, st in zip(p["starts"], p["limits"], p["strides"]))]


@REFERENCE.impl(lg.PadOp)
def _pad(op: lg.PadOp, x: np.ndarray) -> np.ndarray:
    p = op.params()
    return np.pad(x, list(zip(p["low"], p["high"])), constant_values=np.asarray(p["value"]).astype(x.dtype))


def cumsum_piece(x: np.ndarray, axis: int, reverse: bool, piece: slice, length: int, out: np.ndarray) -> np.ndarray:
    """What elements `piece` of the scanned axis (of `length`) add to every
    position of a running sum (the whole scan where the piece is the whole
    axis), written into `out` (the whole axis long)."""
    def along(part: slice) -> tuple[slice, ...]:
        return (slice(None),) * axis + (part,)

    inside, head, tail = along(slice(piece.start, piece.stop)), along(slice(0, piece.start)), along(
        slice(piece.stop, length))
    if reverse:
        np.cumsum(np.flip(x, axis), axis=axis, out=np.flip(out[inside], axis))
        out[head] = out[along(slice(piece.start, piece.start + 1))] if x.shape[axis] else 0
        out[tail] = 0
    else:
        np.cumsum(x, axis=axis, out=out[inside])
        out[head] = 0
        out[tail] = out[along(slice(piece.stop - 1, piece.stop))] if x.shape[axis] else 0
    return out


@REFERENCE.impl(lg.CumsumOp)
def _cumsum(op: lg.CumsumOp, x: np.ndarray) -> np.ndarray:
    p = op.params()
    length = x.shape[p["axis"]]
    return cumsum_piece(x, p["axis"], p["reverse"], slice(0, length), length, np.empty_like(x))


@REFERENCE.impl(lg.ArgmaxOp)
def _argmax(op: lg.ArgmaxOp, x: np.ndarray) -> np.ndarray:
    return np.argmax(x, axis=op.params()["axis"]).astype(np.int64)


def topk_indices(x: np.ndarray, k: int, axis: int, smallest: bool) -> np.ndarray:
    """lg.topk: the indices of the k largest (smallest) elements along
    `axis`, in order, the lower index first among equals and NaN larger than
    any number (PyTorch's topk and sort). A stable sort on two keys: NaN
    or not, then the value (its bitwise complement for a signed integer
    descending, which overflows nowhere, unlike its negation)."""
    keys: tuple[np.ndarray, ...]
    if is_float_dtype(x.dtype):
        nan = np.isnan(x)
        value = np.where(nan, 0, x)
        keys = (value, nan) if smallest else (-value, ~nan)
    elif x.dtype == np.bool_:
        keys = (x,) if smallest else (~x,)
    elif np.issubdtype(x.dtype, np.signedinteger):
        keys = (x,) if smallest else (np.invert(x),)
    else:
        keys = (x,) if smallest else (np.iinfo(x.dtype).max - x,)
    # np.lexsort sorts by its last key first and keeps the order of ties
    order = np.lexsort(tuple(np.moveaxis(key, axis, -1) for key in keys), axis=-1)
    return np.moveaxis(order[..., :k], -1, axis).astype(np.int64)


@REFERENCE.impl(lg.TopkOp)
def _topk(op: lg.TopkOp, x: np.ndarray) -> np.ndarray:
    p = op.params()
    return topk_indices(x, p["k"], p["axis"], p["smallest"])


@REFERENCE.impl(lg.DropoutOp)
def _dropout(op: lg.DropoutOp, x: np.ndarray, seed: np.ndarray, step: np.ndarray) -> np.ndarray:
    from sbpc.semantics.philox import dropout_piece

    p = op.params()
    return dropout_piece(x, seed, step, x.shape, tuple(slice(0, d) for d in x.shape), p["rate"], p["stream"],
                         p["micro_batch"])


@REFERENCE.impl(lg.UniformOp)
def _uniform(op: lg.UniformOp, seed: np.ndarray, step: np.ndarray) -> np.ndarray:
    from sbpc.dialects.dtypes import numpy_dtype
    from sbpc.semantics.philox import UniformDraws

    p = op.params()
    draws = UniformDraws(p["shape"], tuple(slice(0, d) for d in p["shape"]), p["stream"])
    return draws.values(int(seed), int(step), numpy_dtype(p["elem"]))


@REFERENCE.impl(lg.EmbeddingOp)
def _embedding(op: lg.EmbeddingOp, table: np.ndarray, indices: np.ndarray) -> np.ndarray:
    check_range(op, "index", indices, table.shape[0])
    return table[indices]


@REFERENCE.impl(lg.CrossEntropyOp)
def _cross_entropy(op: lg.CrossEntropyOp, logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    check_range(op, "label", labels, logits.shape[-1])
    logp = _log_softmax(logits, -1)
    picked = np.take_along_axis(logp, labels[..., None].astype(np.int64), axis=-1)
    return -np.mean(picked)


@REFERENCE.impl(lg.OneHotOp)
def _one_hot(op: lg.OneHotOp, labels: np.ndarray) -> np.ndarray:
    classes = op.classes.value.data
    kept = np.ones(labels.shape, bool) if op.ignored is None else labels != op.ignored
    check_range(op, "label", labels[kept], classes)
    return np.eye(classes)[np.where(kept, labels, 0)] * kept[..., None]


@REFERENCE.impl(lg.CastOp)
def _cast(op: lg.CastOp, x: np.ndarray) -> np.ndarray:
    return x.astype(numpy_dtype(element_type(op.result.type)))


LOGICAL = {"and": np.logical_and, "or": np.logical_or, "xor": np.logical_xor}
"""lg.logical's kinds as numpy ufuncs."""

REFERENCE.register(lg.LogicalOp, lambda op, a, b: LOGICAL[op.kind.data](a, b))
REFERENCE.register(lg.SelectOp, lambda op, c, a, b: np.asarray(np.where(c, a, b)))


COMPARE = {"eq": np.equal, "ne": np.not_equal, "lt": np.less, "le": np.less_equal, "gt": np.greater,
           "ge": np.greater_equal}
"""lg.compare's kinds as numpy ufuncs."""

REFERENCE.register(lg.CompareOp, lambda op, a, b: COMPARE[op.kind.data](a, b))


@REFERENCE.impl(lg.SumExpOp)
def _sum_exp(op: lg.SumExpOp, x: np.ndarray, shift: np.ndarray) -> np.ndarray:
    return np.exp(x - shift[..., None]).sum(axis=-1).astype(x.dtype)


def owned_labels(op, labels: np.ndarray, classes: slice, total: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For lg.token_cross_entropy(_grad) on logits holding `classes` of
    `total`: the rows counted (label not ignored), the rows whose label this
    piece holds, and those labels' columns in the piece (0 elsewhere).
    A counted label outside [0, total) is an error."""
    counted = np.ones(labels.shape, bool) if op.ignored is None else labels != op.ignored
    check_range(op, "label", labels[counted], total)
    owned = counted & (labels >= classes.start) & (labels < classes.stop)
    return counted, owned, np.where(owned, labels - classes.start, 0).astype(np.int64)


def token_cross_entropy(op, logits, labels, row_max, sum_exp, classes: slice, total: int) -> np.ndarray:
    """The loss rows a piece of the logits holding `classes` contributes."""
    counted, owned, columns = owned_labels(op, labels, classes, total)
    picked = np.take_along_axis(logits, columns[..., None], axis=-1)[..., 0] if logits.shape[-1] else 0.0
    base = np.log(sum_exp) + row_max if classes.start == 0 else 0.0
    return np.where(counted, base - np.where(owned, picked, 0.0), 0.0).astype(logits.dtype)


def token_cross_entropy_grad(op, logits, labels, row_max, sum_exp, grad, classes: slice, total: int) -> np.ndarray:
    """The gradient columns `classes` of lg.token_cross_entropy_grad."""
    counted, owned, columns = owned_labels(op, labels, classes, total)
    scale = np.where(counted, grad, 0.0)
    out = np.exp(logits - row_max[..., None]) * (scale / sum_exp)[..., None]
    if logits.shape[-1]:
        hot = np.zeros_like(out)
        np.put_along_axis(hot, columns[..., None], np.where(owned, scale, 0.0)[..., None], axis=-1)
        out -= hot
    return out.astype(logits.dtype)


@REFERENCE.impl(lg.TokenCrossEntropyOp)
def _token_cross_entropy(op, logits, labels, row_max, sum_exp):
    classes = logits.shape[-1]
    return token_cross_entropy(op, logits, labels, row_max, sum_exp, slice(0, classes), classes)


@REFERENCE.impl(lg.TokenCrossEntropyGradOp)
def _token_cross_entropy_grad(op, logits, labels, row_max, sum_exp, grad):
    classes = logits.shape[-1]
    return token_cross_entropy_grad(op, logits, labels, row_max, sum_exp, grad, slice(0, classes), classes)


def gather_piece(op, x: np.ndarray, indices: np.ndarray, axis: int, rows: slice, total: int) -> np.ndarray:
    """lg.gather from a piece of the input holding `rows` of `total` along
    `axis`: the elements it holds, 0 for the others."""
    check_range(op, "index", indices, total)
    inside = (indices >= rows.start) & (indices < rows.stop)
    if not x.shape[axis]:
        return np.zeros(indices.shape, x.dtype)
    picked = np.take_along_axis(x, np.where(inside, indices - rows.start, 0).astype(np.int64), axis=axis)
    return np.where(inside, picked, np.zeros((), x.dtype))


def scatter_add_piece(op, updates: np.ndarray, indices: np.ndarray, axis: int, rows: slice, total: int,
                      shape) -> np.ndarray:
    """lg.scatter_add into a piece of the result holding `rows` of `total`
    along `axis` (of local `shape`): the updates whose index it holds."""
    check_range(op, "index", indices, total)
    out = np.zeros(shape, updates.dtype)
    if not out.size:
        return out
    inside = (indices >= rows.start) & (indices < rows.stop)
    grid: list[np.ndarray] = list(np.indices(indices.shape, sparse=True))
    grid[axis] = np.where(inside, indices - rows.start, 0).astype(np.int64)
    np.add.at(out, tuple(grid), np.where(inside, updates, np.zeros((), updates.dtype)))
    return out


def scatter_piece(op, x: np.ndarray, indices: np.ndarray, updates: np.ndarray, axis: int, rows: slice,
                  total: int) -> np.ndarray:
    """lg.scatter into a piece of the input holding `rows` of `total` along
    `axis`: a copy with the updates whose index it holds written, the last
    of those aimed at one element winning."""
    check_range(op, "index", indices, total)
    out = x.copy()
    if not out.size:
        return out
    inside = (indices >= rows.start) & (indices < rows.stop)
    coords: tuple[np.ndarray, ...] = np.indices(indices.shape, sparse=True)
    grid = [np.broadcast_to(c, indices.shape) for c in coords]
    grid[axis] = indices - rows.start
    # numpy's assignment through repeated indices keeps the last value
    out[tuple(c[inside] for c in grid)] = updates[inside]
    return out


@REFERENCE.impl(lg.GatherOp)
def _gather(op: lg.GatherOp, x: np.ndarray, indices: np.ndarray) -> np.ndarray:
    axis = op.axis.value.data
    return gather_piece(op, x, indices, axis, slice(0, x.shape[axis]), x.shape[axis])


@REFERENCE.impl(lg.ScatterOp)
def _scatter(op: lg.ScatterOp, x: np.ndarray, indices: np.ndarray, updates: np.ndarray) -> np.ndarray:
    axis = op.axis.value.data
    return scatter_piece(op, x, indices, updates, axis, slice(0, x.shape[axis]), x.shape[axis])


@REFERENCE.impl(lg.ScatterAddOp)
def _scatter_add(op: lg.ScatterAddOp, updates: np.ndarray, indices: np.ndarray) -> np.ndarray:
    axis, size = op.axis.value.data, op.size.value.data
    shape = tuple(size if i == axis else d for i, d in enumerate(updates.shape))
    return scatter_add_piece(op, updates, indices, axis, slice(0, size), size, shape)


def conv_windows(x: np.ndarray, kernel, stride, padding, dilation, groups: int) -> np.ndarray:
    """The windows a convolution reads of the NCHW images `x`, zero-padded:
    a view (N, groups, C/groups, Ho, Wo, kh, kw)."""
    (ph, pw) = padding
    padded = np.pad(x, ((0, 0), (0, 0), (ph, ph), (pw, pw)))
    return windows_of(padded, x.shape, kernel, stride, padding, dilation, groups)


def windows_of(padded: np.ndarray, shape, kernel, stride, padding, dilation, groups: int) -> np.ndarray:
    """The window view of already padded NCHW images of unpadded `shape`."""
    n, c, h, w = shape
    (kh, kw), (sh, sw), (dh, dw) = kernel, stride, dilation
    ho = (h + 2 * padding[0] - dh * (kh - 1) - 1) // sh + 1
    wo = (w + 2 * padding[1] - dw * (kw - 1) - 1) // sw + 1
    s = padded.strides
    return np.lib.stride_tricks.as_strided(
        padded, (n, groups, c // groups, ho, wo, kh, kw),
        (s[0], s[1] * (c // groups), s[1], s[2] * sh, s[3] * sw, s[2] * dh, s[3] * dw), writeable=False)


def _conv_params(op) -> tuple:
    p = op.params()
    return p["stride"], p["padding"], p["dilation"], p["groups"]


@REFERENCE.impl(lg.Conv2dOp)
def _conv2d(op: lg.Conv2dOp, x: np.ndarray, w: np.ndarray) -> np.ndarray:
    stride, padding, dilation, groups = _conv_params(op)
    win = conv_windows(x, w.shape[2:], stride, padding, dilation, groups)
    kernel = w.reshape(groups, w.shape[0] // groups, *w.shape[1:])
    out = np.einsum("ngchwij,gocij->ngohw", win, kernel, optimize=True)
    return out.reshape(x.shape[0], w.shape[0], *out.shape[3:]).astype(x.dtype)


@REFERENCE.impl(lg.Conv2dGradWeightOp)
def _conv2d_grad_weight(op: lg.Conv2dGradWeightOp, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    stride, padding, dilation, groups = _conv_params(op)
    kernel = op.params()["kernel"]
    win = conv_windows(x, kernel, stride, padding, dilation, groups)
    grad = g.reshape(g.shape[0], groups, g.shape[1] // groups, *g.shape[2:])
    out = np.einsum("ngohw,ngchwij->gocij", grad, win, optimize=True)
    return out.reshape(g.shape[1], x.shape[1] // groups, *kernel).astype(x.dtype)


@REFERENCE.impl(lg.Conv2dGradInputOp)
def _conv2d_grad_input(op: lg.Conv2dGradInputOp, g: np.ndarray, w: np.ndarray) -> np.ndarray:
    stride, padding, dilation, groups = _conv_params(op)
    h, wd = op.params()["size"]
    n, c = g.shape[0], w.shape[1] * groups
    kernel = w.reshape(groups, w.shape[0] // groups, *w.shape[1:])
    grad = g.reshape(n, groups, g.shape[1] // groups, *g.shape[2:])
    pieces = np.einsum("ngohw,gocij->ngchwij", grad, kernel, optimize=True)  # each window's share
    padded = np.zeros((n, c, h + 2 * padding[0], wd + 2 * padding[1]), g.dtype)
    add_windows(padded, pieces, stride, dilation, groups)
    return padded[:, :, padding[0]:padding[0] + h, padding[1]:padding[1] + wd]


def add_windows(padded: np.ndarray, pieces: np.ndarray, stride, dilation, groups: int,
                scratch: np.ndarray | None = None) -> None:
    """Adds each window's share (N, groups, C/groups, Ho, Wo, kh, kw) back
    where the window read the padded images (the transpose of reading).
    With `scratch` (N, groups, C/groups, Ho, Wo), each kernel offset's sum
    is formed there, contiguous, and copied back: numpy adds into a strided
    view through buffers it allocates, and copies into one without."""
    n, g, cg, ho, wo, kh, kw = pieces.shape
    images = padded.reshape(n, g, cg, *padded.shape[2:])
    for i in range(kh):
        for j in range(kw):
            rows = slice(i * dilation[0], i * dilation[0] + stride[0] * (ho - 1) + 1, stride[0])
            cols = slice(j * dilation[1], j * dilation[1] + stride[1] * (wo - 1) + 1, stride[1])
            target = images[:, :, :, rows, cols]
            if scratch is None:
                np.add(target, pieces[..., i, j], out=target)
                continue
            np.copyto(scratch, target)
            np.add(scratch, pieces[..., i, j], out=scratch)
            np.copyto(target, scratch)


def pool_windows(x: np.ndarray, kernel, stride, padding) -> np.ndarray:
    """The windows max pooling reads of NCHW images, padded with -inf:
    contiguous (N, C, Ho, Wo, kh*kw)."""
    padded = np.pad(x, ((0, 0), (0, 0), (padding[0],) * 2, (padding[1],) * 2), constant_values=-np.inf)
    win = windows_of(padded, x.shape, kernel, stride, padding, (1, 1), 1)[:, 0]
    return np.ascontiguousarray(win).reshape(*win.shape[:4], kernel[0] * kernel[1])


@REFERENCE.impl(lg.MaxPool2dOp)
def _max_pool2d(op: lg.MaxPool2dOp, x: np.ndarray) -> np.ndarray:
    p = op.params()
    return pool_windows(x, p["kernel"], p["stride"], p["padding"]).max(axis=-1)


@REFERENCE.impl(lg.MaxPool2dGradOp)
def _max_pool2d_grad(op: lg.MaxPool2dGradOp, x: np.ndarray, g: np.ndarray) -> np.ndarray:
    p = op.params()
    win = pool_windows(x, p["kernel"], p["stride"], p["padding"])
    shares = np.zeros(win.shape, g.dtype)
    np.put_along_axis(shares, win.argmax(axis=-1)[..., None], g[..., None], axis=-1)  # the first maximum
    n, c, h, w = x.shape
    padded = np.zeros((n, c, h + 2 * p["padding"][0], w + 2 * p["padding"][1]), g.dtype)
    add_windows(padded, shares.reshape(n, 1, c, *win.shape[2:4], *p["kernel"]), p["stride"], (1, 1), 1)
    return padded[:, :, p["padding"][0]:p["padding"][0] + h, p["padding"][1]:p["padding"][1] + w]


@REFERENCE.impl(lg.EmbeddingGradOp)
def _embedding_grad(op: lg.EmbeddingGradOp, grad: np.ndarray, indices: np.ndarray) -> np.ndarray:
    rows = op.rows.value.data
    check_range(op, "index", indices, rows)
    table = np.zeros((rows, grad.shape[-1]), grad.dtype)
    np.add.at(table, indices.reshape(-1), grad.reshape(-1, grad.shape[-1]))
    if op.padding is not None:
        table[op.padding] = 0
    return table


@REFERENCE.impl(sbp.AnnotateOp, *sbp.COLLECTIVE_OPS)
def _identity(op: Operation, x: np.ndarray, *group_ends: np.ndarray) -> np.ndarray:
    """Distributions and boxing change how a value lies, not its global value
    (the group ends a collective of grouped rows reads say only who holds
    which rows)."""
    return x


# --------------------------------------------------------------------------
# The interpreter
# --------------------------------------------------------------------------


def _check_value(op: Operation, what: str, value: Any, type: Attribute) -> np.ndarray:
    shape, dtype = global_shape(type), numpy_dtype(element_type(type))
    array = np.asarray(value)
    if array.shape != shape:
        raise EvaluationError(f"'{op.name}' {what}: expected shape {list(shape)}, got {list(array.shape)}")
    if array.dtype.kind != dtype.kind and not (is_float_dtype(array.dtype) and is_float_dtype(dtype)):
        raise EvaluationError(f"'{op.name}' {what}: expected {dtype} values, got {array.dtype}")
    return array.astype(dtype, copy=False)


def evaluate(
    module: ModuleOp | lg.GraphOp,
    feeds: Mapping[str, Any],
    params: Mapping[str, Any] | None = None,
    graph: str | None = None,
    trace: dict[Any, np.ndarray] | None = None,
) -> dict[str, np.ndarray]:
    """Runs a graph on global numpy values; returns its outputs by name.

    Parameters missing from `params` take their initial value. Every result
    is cast to its IR element type, so the arithmetic is that of the graph's
    dtypes, not numpy's promotions. `trace`, if given, receives every value
    of the graph (keyed by SSA value).
    """
    graph_op = find_graph(module, graph)
    params = params or {}
    known = {op.key.data for op in graph_op.body.ops if isinstance(op, lg.InputOp | lg.ParamOp)}
    unknown = (set(feeds) | set(params)) - known
    if unknown:
        raise EvaluationError(f"graph @{graph_op.sym_name.data} has no input or parameter named {sorted(unknown)}")
    values: dict[Any, np.ndarray] = {} if trace is None else trace
    for op in graph_op.body.ops:
        if isinstance(op, lg.OutputOp):
            return {name.data: values[v] for name, v in zip(op.names.data, op.values)}
        if isinstance(op, lg.InputOp):
            key = op.key.data
            if key not in feeds:
                raise EvaluationError(f"'{op.name}' \"{key}\": no feed given")
            result = _check_value(op, f'"{key}"', feeds[key], op.result.type)
        elif isinstance(op, lg.ParamOp):
            key = op.key.data
            given = params.get(key)
            result = initial_value(op) if given is None else _check_value(op, f'"{key}"', given, op.result.type)
        elif isinstance(op, lg.ConstantOp):
            result = constant_value(op.value)
        else:
            kernel = REFERENCE.get(type(op))
            if kernel is None:
                raise EvaluationError(f"'{op.name}': the reference interpreter has no kernel for this op")
            with np.errstate(all="ignore"):  # half types computed in float32, the result rounded once
                result = kernel(op, *(widened(values[o]) for o in op.operands))
            result = np.asarray(result, dtype=numpy_dtype(element_type(op.results[0].type)))
        values[op.results[0]] = result
    raise EvaluationError(f"graph @{graph_op.sym_name.data} has no lg.output")
