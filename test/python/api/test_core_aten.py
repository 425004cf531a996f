"""Every Core ATen op sbpc imports, from PyTorch's own list (the overloads
tagged `torch.Tag.core`, `sbpc.torch_import.core_aten.coverage`: by a rule,
through PyTorch's decomposition, or computed at import), against PyTorch
on tiny inputs: the forward, and the gradient (where the op is
differentiable) against PyTorch autograd.

Each op runs alone in a module: its float tensor arguments are parameters
(so that the op is computed in the graph, not folded as a constant, and
one SGD step with lr 1 gives its gradient), its integer and bool tensors
are inputs, and the loss is the output weighted by a random tensor.
`make test` runs every fourth op; `make test-all` runs every one."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

import sbpc
from sbpc.torch_import.core_aten import coverage

aten = torch.ops.aten


def _floats(*shape, seed=0, positive=False):
    g = torch.Generator().manual_seed(seed + 17 * len(shape))
    x = torch.randn(*shape, generator=g)
    return x.abs() + 0.5 if positive else x


A, B = _floats(3, 4), _floats(3, 4, seed=1)
SQ = _floats(4, 4, seed=2)
IMG = _floats(1, 2, 4, 4, seed=3)
IDX = torch.tensor([2, 0, 1])
MASK = torch.tensor([[True, False, True, False]] * 3)
TINY = A * 1e-5  # where log1p and expm1 are not log(1 + x) and exp(x) - 1
UNIT = torch.tanh(A) * 0.9  # inside (-1, 1)
RUNNING = (_floats(2, seed=6), _floats(2, seed=7, positive=True))  # a batch-norm's mean and variance
VOLUME = _floats(1, 2, 3, 4, 4, seed=10)
VOLUME[0, 1, 0, 0, 1] = VOLUME[0, 1, 0, 0, 0] = VOLUME[0, 1].max() + 1  # a tie in a window
POOLED = torch.cat([_floats(1, 1, 5, 5, seed=8), -_floats(1, 1, 5, 5, seed=9, positive=True)], 1)
POOLED[0, 0, 0, 1] = POOLED[0, 0, 0, 0] = POOLED[0, 0].max() + 1  # a tie in the first window

# name -> (arguments, the call): tensors among the arguments are what the
# op reads from the graph; everything else is a constant of the call
SAMPLES = {
    "aten._adaptive_avg_pool2d": ([IMG], lambda x: aten._adaptive_avg_pool2d(x, [2, 2])),
    "aten._log_softmax": ([A], lambda x: aten._log_softmax(x, 1, False)),
    "aten._softmax": ([A], lambda x: aten._softmax(x, 1, False)),
    "aten._to_copy": ([A], lambda x: aten._to_copy(x, dtype=torch.float64)),
    "aten.abs": ([A], aten.abs),
    # (out= takes no gradient in PyTorch)
    "aten.atan2.out": ([A, B], lambda y, x: aten.atan2.out(y.detach(), x.detach(), out=torch.empty(3, 4)) + 0 * y),
    # p = 2, 1, 3 and inf; pdist's pairs i < j
    "aten._cdist_forward": ([_floats(2, 3, 4), _floats(2, 5, 4, seed=1)],
                            lambda a, b: aten._cdist_forward(a, b, 2.0, None) + aten._cdist_forward(a, b, 1.0, None)
                            + aten._cdist_forward(a, b, 3.0, None) + aten._cdist_forward(a, b, float("inf"), None)),
    "aten._pdist_forward": ([_floats(4, 3)], lambda x: aten._pdist_forward(x, 2.0) + aten._pdist_forward(x, 0.5)),
    # a zero factor: its gradient is the product of the others; an odd count along axis 0
    "aten.prod": ([torch.tensor([[1.5, 0.0, -2.0], [0.5, 3.0, 1.2]])], lambda x: aten.prod(x) + aten.prod(x * 2)),
    "aten.prod.dim_int": ([A], lambda x: aten.prod.dim_int(x, 0) * aten.prod.dim_int(x, 1, True)),
    "aten.add.Scalar": ([A], lambda x: aten.add.Scalar(x, 1.5)),
    "aten.add.Tensor": ([A, B], lambda x, y: aten.add.Tensor(x, y, alpha=2)),
    "aten.addmm": ([_floats(4), A, SQ], lambda b, x, w: aten.addmm(b, x, w, beta=0.5, alpha=2.0)),
    "aten.alias": ([A], lambda x: aten.alias(x) * 1.0),
    "aten.amax": ([torch.tensor([[1.0, 3.0, 3.0, 0.5], [2.0, -1.0, 0.0, 1.0], [4.0, 4.0, 4.0, 4.0]])],
                  lambda x: aten.amax(x, [1])),  # ties share the gradient, as in PyTorch
    "aten.argmax": ([A], lambda x: aten.argmax(x, 1)),
    "aten.avg_pool2d": ([IMG], lambda x: aten.avg_pool2d(x, [2, 2], [2, 2])),
    # shrunk in place: the first 10 of 12 elements, in a new shape (PyTorch
    # resizes nothing that takes a gradient)
    "aten.resize_": ([A], lambda x: aten.resize_(x.detach() * 1.0, [2, 5]) * 2.0 + (x * 0.0).sum()),
    # points inside, on the edge and outside the image (x, y in [-1.3, 1.3]):
    # bilinear with zeros, with corners aligned and the border, and nearest
    "aten.grid_sampler_2d": (
        [IMG, torch.tanh(_floats(1, 3, 5, 2, seed=13)) * 1.3],
        lambda x, g: aten.grid_sampler_2d(x, g, 0, 0, False) + aten.grid_sampler_2d(x, g, 0, 1, True)
        + aten.grid_sampler_2d(x, g.detach(), 1, 0, False)),
    # four bags of a 6-row table, the third empty, an index repeated: summed
    # (with per-sample weights, the padding row 4 in no bag) and averaged
    "aten._embedding_bag": (
        [_floats(6, 3, seed=11), torch.tensor([1, 4, 1, 5, 0, 2]), torch.tensor([0, 2, 4, 4]),
         _floats(6, seed=12)],
        lambda w, i, o, p: aten._embedding_bag(w, i, o, False, 0, False, p, False, 4)[0]
        + aten._embedding_bag(w, i, o, False, 1)[0] * 2),
    # two channels of overlapping 2x2 patches, strided, dilated and padded, folded back
    "aten.col2im": ([_floats(1, 8, 9)], lambda x: aten.col2im(x, [4, 5], [2, 2], [1, 2], [1, 0], [2, 1])),
    # overlapping windows over padding, uneven along the three axes
    "aten.avg_pool3d": ([VOLUME], lambda x: aten.avg_pool3d(x, [2, 3, 2], [1, 2, 2], [1, 1, 0])),
    "aten._adaptive_avg_pool3d": ([VOLUME], lambda x: aten._adaptive_avg_pool3d(x, [3, 2, 1])),
    "aten.max_pool3d_with_indices": ([VOLUME], lambda x: (lambda v, i: v * (i + 1))(
        *aten.max_pool3d_with_indices(x, [2, 3, 2], [2, 1, 2], [1, 1, 0]))),
    # a strided, padded, grouped convolution's three gradients, each checked
    # (their own gradients too, against PyTorch's double backward)
    "aten.convolution_backward": (
        [_floats(1, 4, 2, 2, seed=8), _floats(1, 2, 4, 4, seed=3), _floats(4, 1, 3, 3, seed=4)],
        lambda g, x, w: (lambda dx, dw, db: dx.sum((0, 1)).reshape(1, 1, 4, 4) * dw.sum() + db.reshape(1, 4, 1, 1))(
            *aten.convolution_backward(g, x, w, [4], [2, 2], [1, 1], [1, 1], False, [0, 0], 2, [True, True, True]))),
    # a repeated index sums its rows; the padding row (0) takes nothing
    "aten.embedding_dense_backward": ([_floats(4, 4), torch.tensor([2, 0, 2, 1])],
                                      lambda g, i: aten.embedding_dense_backward(g, i, 5, 0, False)
                                      + aten.embedding_dense_backward(g, i, 5, -1, False)),
    "aten.avg_pool2d_backward": ([_floats(1, 2, 3, 3, seed=8), IMG],  # overlapping windows over padding
                                 lambda g, x: aten.avg_pool2d_backward(g, x, [2, 2], [2, 2], [1, 1], False, True,
                                                                       None)),
    "aten._adaptive_avg_pool2d_backward": ([_floats(1, 2, 2, 2, seed=8), IMG],
                                           lambda g, x: aten._adaptive_avg_pool2d_backward(g, x)),
    # overlapping windows over padding, a tie (the first in row-major order
    # wins), and a window whose elements are all negative: the maxima times
    # their indices + 1, both outputs checked, the maxima's gradient too
    "aten.max_pool2d_with_indices": (
        [POOLED], lambda x: (lambda v, i: v * (i + 1))(*aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1]))),
    "aten.max_pool2d_with_indices_backward": (
        [_floats(1, 2, 3, 3, seed=8), POOLED],
        lambda g, x: aten.max_pool2d_with_indices_backward(
            g, x, [3, 3], [2, 2], [1, 1], [1, 1], False, aten.max_pool2d_with_indices(x, [3, 3], [2, 2], [1, 1])[1])),
    # the values times their indices + 1: both outputs checked, the values' gradient too
    "aten.topk": ([A], lambda x: (lambda v, i: v * (i + 1))(*aten.topk(x, 2, 1))),
    "aten.sort": ([A], lambda x: (lambda v, i: v * (i + 1))(*aten.sort(x, 0, True))),
    "aten.scatter_add": ([A, torch.tensor([[0, 2, 1, 0], [2, 2, 0, 1]]), _floats(2, 4, seed=4)],
                         lambda x, i, s: aten.scatter_add(x, 0, i, s)),
    # (distinct indices: PyTorch leaves repeated ones undefined, and gives an
    # overwritten update a gradient; lg.scatter's last write wins, alone)
    "aten.scatter.src": ([A, torch.tensor([[0, 2, 1, 0], [2, 1, 0, 1]]), _floats(2, 4, seed=4)],
                         lambda x, i, s: aten.scatter.src(x, 0, i, s)),
    "aten.scatter.value": ([A, torch.tensor([[0, 2], [1, 1], [3, 0]])], lambda x, i: aten.scatter.value(x, 1, i, 2.5)),
    # rows 2, 0 and -2 (the second last) of x replaced, and the same rows accumulated into
    # the running count of the mask picks the source's elements in order
    "aten.masked_scatter": ([A, MASK, _floats(7, seed=9)], lambda x, m, s: aten.masked_scatter(x, m, s)),
    # sum into x, mean without x; an element no index points to keeps x's value
    "aten.scatter_reduce.two": ([A, torch.tensor([[0, 2, 0, 0], [2, 2, 0, 0]]), _floats(2, 4, seed=4)],
                                lambda x, i, s: aten.scatter_reduce.two(x, 0, i, s, "sum")
                                + aten.scatter_reduce.two(x, 0, i, s, "mean", include_self=False) * 2),
    "aten.index_put": ([A, torch.tensor([2, 0, -2]), _floats(3, 4, seed=8)],
                       lambda x, i, v: aten.index_put(x, [i], v) + aten.index_put(x, [i], v * 2, True)),
    "aten.bitwise_and.Tensor": ([MASK, ~MASK], aten.bitwise_and.Tensor),
    "aten.bitwise_not": ([MASK], aten.bitwise_not),
    "aten.bitwise_or.Tensor": ([MASK, MASK.flip(1)], aten.bitwise_or.Tensor),
    "aten.bitwise_xor.Tensor": ([MASK, MASK.flip(1)], aten.bitwise_xor.Tensor),
    "aten.bmm": ([_floats(2, 3, 4), _floats(2, 4, 2, seed=1)], aten.bmm),
    "aten.cat": ([A, B], lambda x, y: aten.cat([x, y], 1)),
    "aten.clone": ([A], aten.clone),
    "aten.constant_pad_nd": ([A], lambda x: aten.constant_pad_nd(x, [1, 2], 0.5)),
    "aten.cumsum": ([A], lambda x: aten.cumsum(x, 1)),
    "aten.div.Scalar": ([A], lambda x: aten.div.Scalar(x, 3.0)),
    "aten.div.Tensor": ([A, _floats(3, 4, seed=1, positive=True)], aten.div.Tensor),
    "aten.div.Tensor_mode": ([A, _floats(3, 4, seed=1, positive=True)],
                             lambda x, y: aten.div.Tensor_mode(x, y, rounding_mode=None)),
    "aten.embedding": ([SQ, IDX], aten.embedding),
    "aten.eq.Scalar": ([IDX], lambda i: aten.eq.Scalar(i, 1)),
    "aten.eq.Tensor": ([IDX, IDX.flip(0)], aten.eq.Tensor),
    "aten.exp": ([A], aten.exp),
    "aten.expand": ([_floats(3, 1)], lambda x: aten.expand(x, [3, 4])),
    "aten.gather": ([A, torch.tensor([[0, 3], [1, 1], [2, 0]])], lambda x, i: aten.gather(x, 1, i)),
    "aten.ge.Scalar": ([A], lambda x: aten.ge.Scalar(x, 0.1)),
    "aten.ge.Tensor": ([A, B], aten.ge.Tensor),
    "aten.gelu": ([A], aten.gelu),
    "aten.gt.Scalar": ([A], lambda x: aten.gt.Scalar(x, 0.1)),
    "aten.gt.Tensor": ([A, B], aten.gt.Tensor),
    "aten.index.Tensor": ([A, IDX], lambda x, i: aten.index.Tensor(x, [i])),
    "aten.index_select": ([A, IDX], lambda x, i: aten.index_select(x, 1, i)),
    "aten.le.Scalar": ([A], lambda x: aten.le.Scalar(x, 0.1)),
    "aten.le.Tensor": ([A, B], aten.le.Tensor),
    "aten.logical_and": ([MASK, ~MASK], aten.logical_and),
    "aten.logical_not": ([MASK], aten.logical_not),
    "aten.logical_or": ([MASK, MASK.flip(1)], aten.logical_or),
    "aten.logical_xor": ([MASK, MASK.flip(1)], aten.logical_xor),
    "aten.lt.Scalar": ([A], lambda x: aten.lt.Scalar(x, 0.1)),
    "aten.lt.Tensor": ([A, B], aten.lt.Tensor),
    "aten.mean": ([A], aten.mean),
    "aten.mean.dim": ([A], lambda x: aten.mean.dim(x, [0], True)),
    "aten.mm": ([A, SQ], aten.mm),
    "aten.mul.Scalar": ([A], lambda x: aten.mul.Scalar(x, -2.5)),
    "aten.mul.Tensor": ([A, B], aten.mul.Tensor),
    "aten.ne.Scalar": ([IDX], lambda i: aten.ne.Scalar(i, 1)),
    "aten.ne.Tensor": ([A, B], aten.ne.Tensor),
    "aten.neg": ([A], aten.neg),
    "aten.permute": ([_floats(2, 3, 4)], lambda x: aten.permute(x, [2, 0, 1])),
    "aten.pow.Tensor_Scalar": ([A], lambda x: aten.pow.Tensor_Scalar(x, 3)),
    "aten.relu": ([A], aten.relu),
    "aten.rsqrt": ([_floats(3, 4, positive=True)], aten.rsqrt),
    "aten.select.int": ([A], lambda x: aten.select.int(x, 1, 2)),
    "aten.sigmoid": ([A], aten.sigmoid),
    "aten.slice.Tensor": ([A], lambda x: aten.slice.Tensor(x, 1, 1, 4, 2)),
    "aten.split_with_sizes": ([A], lambda x: aten.split_with_sizes(x, [1, 3], 1)[1]),
    "aten.sqrt": ([_floats(3, 4, positive=True)], aten.sqrt),
    "aten.squeeze.dim": ([_floats(3, 1, 4)], lambda x: aten.squeeze.dim(x, 1)),
    "aten.squeeze.dims": ([_floats(3, 1, 4, 1)], lambda x: aten.squeeze.dims(x, [1, 3])),
    "aten.sub.Scalar": ([A], lambda x: aten.sub.Scalar(x, 0.5)),
    "aten.sub.Tensor": ([A, B], lambda x, y: aten.sub.Tensor(x, y, alpha=3)),
    "aten.sum.dim_IntList": ([A], lambda x: aten.sum.dim_IntList(x, [1])),
    "aten.tanh": ([A], aten.tanh),
    "aten.unsqueeze": ([A], lambda x: aten.unsqueeze(x, 1)),
    "aten.view": ([A], lambda x: aten.view(x, [2, 6])),
    "aten.where.self": ([MASK, A, B], aten.where.self),
    "aten.erf": ([A], aten.erf),
    "aten.reciprocal": ([_floats(3, 4, positive=True)], aten.reciprocal),
    "aten.clamp": ([A], lambda x: aten.clamp(x, -0.5, 0.6)),
    "aten.clamp.Tensor": ([A, _floats(3, 4, seed=1) - 0.5, _floats(1, 4, seed=2, positive=True)],
                          lambda x, lo, hi: aten.clamp.Tensor(x, lo, hi)),
    "aten.hardtanh": ([A], lambda x: aten.hardtanh(x, -0.5, 0.6)),
    "aten.leaky_relu": ([A], lambda x: aten.leaky_relu(x, 0.2)),
    "aten.elu": ([A], lambda x: aten.elu(x, 1.5)),
    "aten.sign": ([A], lambda x: aten.sign(x) * x),
    "aten.maximum": ([A, B], aten.maximum),
    "aten.minimum": ([A, B], aten.minimum),
    "aten.isnan": ([A], lambda x: aten.isnan(aten.sqrt(x))),
    "aten.isinf": ([A], lambda x: aten.isinf(aten.reciprocal(x - x[0, 0]))),
    "aten.amin": ([torch.tensor([[1.0, -3.0, -3.0, 0.5], [2.0, -1.0, 0.0, 1.0], [4.0, 4.0, 4.0, 4.0]])],
                  lambda x: aten.amin(x, [1])),
    "aten.argmin": ([A], lambda x: aten.argmin(x, 1)),
    "aten.max.dim": ([A], lambda x: aten.max.dim(x, 1)[0]),
    "aten.min.dim": ([A], lambda x: aten.min.dim(x, 0, True)[0] + aten.min.dim(x, 0, True)[1]),
    "aten.var.correction": ([A], lambda x: aten.var.correction(x, [1], correction=1)),
    "aten.var.dim": ([A], lambda x: aten.var.dim(x, [0], False)),
    "aten.any": ([MASK], aten.any),
    "aten.any.dim": ([A], lambda x: aten.any.dim(aten.gt.Scalar(x, 1.0), 1)),
    "aten.any.dims": ([MASK], lambda m: aten.any.dims(m, [0])),
    "aten.bitwise_and.Scalar": ([MASK], lambda m: aten.bitwise_and.Scalar(m, True)),
    "aten.bitwise_or.Scalar": ([MASK], lambda m: aten.bitwise_or.Scalar(m, False)),
    "aten.bitwise_xor.Scalar": ([MASK], lambda m: aten.bitwise_xor.Scalar(m, True)),
    "aten.repeat": ([A], lambda x: aten.repeat(x, [2, 1, 3])),
    "aten.flip": ([A], lambda x: aten.flip(x, [0, 1])),
    "aten.slice_scatter": ([A, _floats(3, 2, seed=4)], lambda x, s: aten.slice_scatter(x, s, 1, 1, 3)),
    "aten.select_scatter": ([A, _floats(4, seed=4)], lambda x, s: aten.select_scatter(x, s, 0, -1)),
    "aten.copy": ([torch.zeros(3, 4, dtype=torch.int64), A * 3], aten.copy),  # (PyTorch has no gradient of it)
    "aten.fill.Scalar": ([A], lambda x: aten.fill.Scalar(x, 2.5) * x),
    "aten.full_like": ([A], lambda x: aten.full_like(x, 3.0) + x),
    "aten.native_layer_norm": ([A, _floats(4, seed=4), _floats(4, seed=5)],
                               lambda x, w, b: aten.native_layer_norm(x, [4], w, b, 1e-5)[0]),
    "aten.convolution": ([IMG, _floats(3, 2, 3, 3, seed=4), _floats(3, seed=5)],
                         lambda x, w, b: aten.convolution(x, w, b, [1, 1], [1, 1], [1, 1], False, [0, 0], 1)),
    "aten.upsample_nearest2d.vec": ([IMG], lambda x: aten.upsample_nearest2d.vec(x, None, [2.0, 3.0])),
    "aten.log": ([_floats(3, 4, positive=True)], aten.log),
    "aten.log2": ([_floats(3, 4, positive=True)], aten.log2),
    "aten.log10": ([_floats(3, 4, positive=True)], aten.log10),
    "aten.log1p": ([TINY], aten.log1p),
    "aten.expm1": ([TINY], aten.expm1),
    "aten.sin": ([A], aten.sin),
    "aten.cos": ([A], aten.cos),
    "aten.tan": ([A], aten.tan),
    "aten.atan": ([A], aten.atan),
    "aten.asin": ([UNIT], aten.asin),
    "aten.acos": ([UNIT], aten.acos),
    "aten.atanh": ([UNIT], aten.atanh),
    "aten.sinh": ([TINY], aten.sinh),
    "aten.cosh": ([A], aten.cosh),
    "aten.asinh": ([TINY], aten.asinh),
    "aten.acosh": ([A.abs() + 1.0001], aten.acosh),
    "aten.atan2": ([A, B], aten.atan2),
    "aten.floor": ([A * 3], aten.floor),
    "aten.ceil": ([A * 3], aten.ceil),
    "aten.round": ([torch.tensor([[0.5, 1.5, 2.5, -0.5], [-1.5, 0.49, 2.51, -2.5], [3.7, -3.7, 0.0, 1.0]])],
                   aten.round),  # halves to even, as PyTorch
    "aten.trunc": ([A * 3], aten.trunc),
    "aten.pow.Tensor_Tensor": ([_floats(3, 4, positive=True), B], aten.pow.Tensor_Tensor),
    "aten.pow.Scalar": ([A], lambda x: aten.pow.Scalar(2.0, x)),
    "aten.div.Scalar_mode": ([A * 3], lambda x: aten.div.Scalar_mode(x, 0.7, rounding_mode="floor")),
    "aten.fmod.Tensor": ([A * 3, _floats(3, 4, seed=1, positive=True)], aten.fmod.Tensor),
    "aten.fmod.Scalar": ([A * 3], lambda x: aten.fmod.Scalar(x, 0.7)),
    "aten.remainder.Tensor": ([A * 3, _floats(3, 4, seed=1, positive=True)], aten.remainder.Tensor),
    "aten.remainder.Scalar": ([A * 3], lambda x: aten.remainder.Scalar(x, 0.7)),
    # sizes and strides are static
    "aten.sym_size.int": ([A], lambda x: x * aten.sym_size.int(x, 1)),
    "aten.sym_numel": ([A], lambda x: x * aten.sym_numel(x)),
    "aten.sym_stride.int": ([A], lambda x: x * aten.sym_stride.int(x, 0)),
    "aten.sym_storage_offset": ([A], lambda x: x + aten.sym_storage_offset(x)),
    "aten.sym_is_contiguous": ([A], lambda x: x * float(aten.sym_is_contiguous(x))),
    "aten.avg_pool1d": ([_floats(2, 3, 8)], lambda x: aten.avg_pool1d(x, [2], [2])),
    "aten.adaptive_avg_pool1d": ([_floats(2, 3, 8)], lambda x: aten.adaptive_avg_pool1d(x, [4])),
    "aten.reflection_pad1d": ([_floats(2, 3, 5)], lambda x: aten.reflection_pad1d(x, [2, 3])),
    "aten.reflection_pad2d": ([IMG], lambda x: aten.reflection_pad2d(x, [1, 2, 3, 1])),
    "aten.reflection_pad3d": ([_floats(1, 2, 3, 4, 4)], lambda x: aten.reflection_pad3d(x, [1, 1, 2, 0, 1, 2])),
    "aten.replication_pad2d": ([IMG], lambda x: aten.replication_pad2d(x, [2, 1, 0, 3])),
    "aten.replication_pad3d": ([_floats(1, 2, 3, 4, 4)], lambda x: aten.replication_pad3d(x, [1, 2, 0, 1, 3, 0])),
    "aten.diagonal": ([_floats(3, 4, 5)], lambda x: aten.diagonal(x, 1, 1, 2)),
    "aten.as_strided": ([A], lambda x: aten.as_strided(x, [3, 3], [3, 1], 1)),  # overlapping rows
    "aten.native_group_norm": ([IMG, _floats(2, seed=4), _floats(2, seed=5)],
                               lambda x, w, b: aten.native_group_norm(x, w, b, 1, 2, 16, 2, 1e-5)[0]),
    "aten._native_batch_norm_legit.no_stats": (
        [IMG, _floats(2, seed=4), _floats(2, seed=5)],
        lambda x, w, b: aten._native_batch_norm_legit.no_stats(x, w, b, True, 0.1, 1e-5)[0]),
    # training with running statistics: the outputs of the batch's own (the
    # running ones, made in the call here, are updated as state where they
    # are buffers: test_hf_models' ResNet)
    "aten._native_batch_norm_legit": (
        [IMG, _floats(2, seed=4), _floats(2, seed=5)],
        lambda x, w, b: (lambda y, mean, rstd: y * 2 + mean.reshape(1, 2, 1, 1) * rstd.reshape(1, 2, 1, 1))(
            *aten._native_batch_norm_legit(x, w, b, torch.zeros(2), torch.ones(2), True, 0.1, 1e-5))),
    "aten._native_batch_norm_legit_no_training": (  # the running statistics: constants, not trained
        [IMG, _floats(2, seed=4), _floats(2, seed=5)],
        lambda x, w, b: aten._native_batch_norm_legit_no_training(x, w, b, *RUNNING, 0.1, 1e-5)[0]),
    # complex results as their parts (view_as_real): one-sided and full,
    # over one axis and two, each normalization; the inverse to an even and
    # an odd length (the Nyquist frequency's weight, and its imaginary part
    # dropped as PyTorch drops it)
    "aten._fft_r2c": ([A], lambda x: torch.cat([
        aten.view_as_real(aten._fft_r2c(x, [1], 0, True)).flatten(),
        aten.view_as_real(aten._fft_r2c(x, [0, 1], 1, False)).flatten(),
        aten.view_as_real(aten._fft_r2c(x, [1, 0], 2, True)).flatten()])),
    "aten._fft_c2r": ([_floats(3, 3, 2, seed=11)], lambda z: torch.cat([
        aten._fft_c2r(aten.view_as_complex(z), [1], 0, 4).flatten(),
        aten._fft_c2r(aten.view_as_complex(z), [0, 1], 1, 5).flatten(),
        aten._fft_c2r(aten.view_as_complex(z), [1], 2, 5).flatten()])),
    # no rule: imported through PyTorch's decomposition
    "aten.upsample_bilinear2d.vec": ([IMG], lambda x: aten.upsample_bilinear2d.vec(x, [6, 7], False, None)),
    "aten.native_layer_norm_backward": (
        [A, B, _floats(4, seed=4)],
        lambda g, x, w: aten.native_layer_norm_backward(g, x, [4], x.mean(1, keepdim=True),
                                                        (x.var(1, unbiased=False, keepdim=True) + 1e-5).rsqrt(), w,
                                                        None, [True, False, False])[0]),
    "aten.native_group_norm_backward": (
        [IMG, _floats(1, 2, 4, 4, seed=6)],
        lambda g, x: aten.native_group_norm_backward(
            g, x, x.reshape(1, 2, -1).mean(2), (x.reshape(1, 2, -1).var(2, unbiased=False) + 1e-5).rsqrt(),
            None, 1, 2, 16, 2, [True, False, False])[0]),
    # no tensor operand: PyTorch computes them at import
    "aten.full": ([A], lambda x: x * aten.full([3, 4], 2.5)),
    "aten.arange.start_step": ([A], lambda x: x * aten.arange.start_step(1, 9, 2)),
    "aten.scalar_tensor": ([A], lambda x: x * aten.scalar_tensor(3.0)),
    # (zeroed, as sbpc folds them: PyTorch's eager reference would add
    # whatever the allocator left there, 0 * nan now and then)
    "aten.empty.memory_format": ([A], lambda x: x + aten.empty.memory_format([3, 4]).zero_()),
    "aten.empty_strided": ([A], lambda x: x + aten.empty_strided([3, 4], [4, 1]).zero_()),
}

COVERAGE = coverage()
RULED = [n for kind in ("rule", "decomposition", "computed at import") for n in COVERAGE[kind]]
"""The Core ATen ops sbpc imports: by its own rule, through PyTorch's
decomposition, or computed by PyTorch at import (no tensor operand)."""


def test_every_core_aten_op_imported_has_a_sample():
    assert set(RULED) == set(SAMPLES), (sorted(set(RULED) - set(SAMPLES)), sorted(set(SAMPLES) - set(RULED)))


class OneOp(nn.Module):
    """The op alone: float arguments as parameters, the others as inputs."""

    def __init__(self, args, call):
        super().__init__()
        self.call = call
        self.kinds = ["param" if a.is_floating_point() else "input" for a in args]
        self.params = nn.ParameterList([nn.Parameter(a.clone()) for a in args if a.is_floating_point()])

    def forward(self, weight, *inputs):
        params, fed = iter(self.params), iter(inputs)
        y = self.call(*[next(params) if kind == "param" else next(fed) for kind in self.kinds])
        if not y.is_floating_point():
            return {"y": y, "loss": (weight * 0).sum()}
        return {"y": y, "loss": (y.to(weight.dtype) * weight).sum()}


@pytest.mark.parametrize("name", [pytest.param(n, marks=() if i % 4 == 0 else pytest.mark.full)
                                  for i, n in enumerate(RULED)])
def test_a_core_aten_op_computes_and_differentiates_as_pytorch(name):
    args, call = SAMPLES[name]
    model = OneOp(args, call)
    inputs = [a for a in args if not a.is_floating_point()]
    with torch.no_grad():
        out = model(torch.ones(()), *inputs)["y"].detach()
    weight = (_floats(*out.shape, seed=5) if out.dim() else torch.tensor(0.7)) if out.is_floating_point() \
        else torch.zeros(out.shape)
    names = ["weight"] + [f"inputs_{i}" for i in range(len(inputs))]
    graph = sbpc.from_torch(model, (weight, *inputs), placement=sbpc.placement("cpu", 1))
    params = list(model.params)
    exe = sbpc.compile(graph, optimizer=sbpc.optim.SGD(lr=1.0) if params and out.is_floating_point() else None,
                       mode="interpret")
    feeds = {n: t.numpy() for n, t in zip(names, (weight, *inputs))}
    if not (params and out.is_floating_point()):
        got = exe.run(feeds)["y"]
        np.testing.assert_array_equal(got, out.numpy()) if not out.is_floating_point() else \
            np.testing.assert_allclose(got, out.numpy(), rtol=1e-5, atol=1e-6)
        return
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    got = exe.train_step(feeds, outputs=["y", "loss"])
    np.testing.assert_allclose(got["y"], out.numpy(), rtol=1e-5, atol=1e-6)
    loss = model(weight, *inputs)["loss"]
    try:
        grads = torch.autograd.grad(loss, params, allow_unused=True)
    except (NotImplementedError, RuntimeError) as error:
        # PyTorch has no derivative of it (the backward ops): the forward is the check
        assert "not implemented" in str(error), error
        return
    state = exe.state_dict()
    for (key, value), grad in zip(((k, v) for k, v in before.items()), grads):
        want = value - (grad if grad is not None else torch.zeros_like(value))
        np.testing.assert_allclose(state[key].detach().numpy(), want.numpy(), rtol=1e-5, atol=1e-5, err_msg=key)
