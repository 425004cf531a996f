"""Normalizations: softmax and log_softmax, layer_norm, rms_norm, and
batch_norm (whose running statistics are state the forward updates)."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from sbpc import frontend as fe
from sbpc.frontend import Tensor
from sbpc.torch_import.aten.registry import _axis, rule
from sbpc.torch_import.values import _Const

if TYPE_CHECKING:
    # for the annotations only: the importer loads the rules (through their
    # registry) before it defines _Importer
    from sbpc.torch_import.importer import _Importer


@rule("aten.softmax.int", "aten._softmax")
def _softmax(im: _Importer, x, dim, dtype_or_half=None):
    x = im.lift(x)
    return fe.softmax(x, _axis(dim, len(x.shape)))


@rule("aten.log_softmax.int", "aten._log_softmax")
def _log_softmax(im: _Importer, x, dim, dtype_or_half=None):
    x = im.lift(x)
    return fe.log_softmax(x, _axis(dim, len(x.shape)))


@rule("aten.layer_norm")
def _layer_norm(im: _Importer, x, normalized_shape, weight=None, bias=None, eps=1e-5, cudnn_enable=True):
    if len(normalized_shape) != 1:
        raise ValueError(f"layer_norm over {len(normalized_shape)} axes (sbpc normalizes one, the last)")
    x = im.lift(x)
    if weight is not None and bias is not None:
        return fe.layernorm(x, im.lift(weight), im.lift(bias), axis=len(x.shape) - 1, eps=eps)
    # lg.layernorm is plain or affine with both; LayerNorm(bias=False) scales after
    y = fe.layernorm(x, axis=len(x.shape) - 1, eps=eps)
    y = y if weight is None else y * im.lift(weight)
    return y if bias is None else y + im.lift(bias)


@rule("aten.rms_norm")
def _rms_norm(im: _Importer, x, normalized_shape, weight=None, eps=None):
    if len(normalized_shape) != 1:
        raise ValueError(f"rms_norm over {len(normalized_shape)} axes (sbpc normalizes one, the last)")
    x = im.lift(x)
    eps = float(np.finfo(fe._numpy_of(x.dtype)).eps) if eps is None else eps
    y = x * fe.rsqrt(fe.reduce_mean(x * x, [len(x.shape) - 1], True) + eps)
    return y if weight is None else y * im.lift(weight)


@rule("aten.batch_norm")
def _batch_norm(im: _Importer, x, weight, bias, running_mean, running_var, training, momentum, eps,
                cudnn_enabled=True):
    """Training: the statistics of the whole logical batch (reductions over
    the batch and the spatial axes: partial sums across a split batch, so
    every plan computes what one device does, as SyncBatchNorm), and the
    running statistics updated as state (the unbiased variance, as PyTorch).
    Evaluation: the running statistics."""
    x = im.lift(x)
    rank = len(x.shape)
    if rank < 2:
        raise ValueError(f"batch_norm of a {rank}-D input")
    channels = x.shape[1]
    per_channel = [1, channels, *[1] * (rank - 2)]
    if training:
        mean, centered, var = _training_statistics(im, x, momentum)
    else:
        if running_mean is None or running_var is None:
            raise ValueError("batch_norm in evaluation without running statistics")
        mean, var = (fe.reshape(im.lift(v, x), per_channel) for v in (running_mean, running_var))
        centered = x - mean
    return _per_channel(im, centered * fe.rsqrt(var + float(eps)), weight, bias)


def _training_statistics(im: _Importer, x: Tensor, momentum) -> tuple[Tensor, Tensor, Tensor]:
    """_batch_statistics of `x`, the running statistics (the call's operands
    3 and 4, where they are the module's buffers) updated as state."""
    if momentum is None:
        raise ValueError("batch_norm with momentum=None (a cumulative average)")
    mean, centered, var = _batch_statistics(x)
    channels = x.shape[1]
    count = math.prod(x.shape[a] for a in [0, *range(2, len(x.shape))])
    for node, stat, scale in ((im.node.args[3], mean, 1.0), (im.node.args[4], var, count / max(count - 1, 1))):
        running = im.env.get(node) if getattr(node, "op", None) == "placeholder" else None
        if isinstance(running, Tensor):  # track_running_stats=False has none
            im.update(node, running * (1.0 - momentum) + fe.reshape(stat, [channels]) * (momentum * scale))
    return mean, centered, var


@rule("aten._native_batch_norm_legit")
def _batch_norm_legit(im: _Importer, x, weight, bias, running_mean, running_var, training, momentum, eps):
    """Batch-norm with running statistics, as aten.batch_norm: in training
    (output, the batch mean, 1 / its standard deviation), the running
    statistics updated as state; in evaluation, as
    _native_batch_norm_legit_no_training. The two statistics are saved for
    the backward and carry no gradient, as in PyTorch."""
    if not training:
        return _batch_norm_evaluation(im, x, weight, bias, running_mean, running_var, momentum, eps)
    x = im.lift(x)
    mean, centered, var = _training_statistics(im, x, momentum)
    rstd = fe.rsqrt(var + float(eps))
    y = _per_channel(im, centered * rstd, weight, bias)
    return [y, *(fe.stop_gradient(fe.reshape(s, [x.shape[1]])) for s in (mean, rstd))]


def _per_channel(im: _Importer, y: Tensor, weight, bias) -> Tensor:
    """`y` (N, C, ...) scaled and shifted per channel, where given."""
    per_channel = [1, y.shape[1], *[1] * (len(y.shape) - 2)]
    if weight is not None:
        y = y * fe.reshape(im.lift(weight, y), per_channel)
    if bias is not None:
        y = y + fe.reshape(im.lift(bias, y), per_channel)
    return y


def _batch_statistics(x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(mean, x - mean, biased variance) over the batch and spatial axes,
    kept as 1: the whole logical batch's, partial sums across a split batch."""
    axes = [0, *range(2, len(x.shape))]
    mean = fe.reduce_mean(x, axes, keepdims=True)
    centered = x - mean
    return mean, centered, fe.reduce_mean(centered * centered, axes, keepdims=True)


@rule("aten.native_layer_norm")
def _native_layer_norm(im: _Importer, x, normalized_shape, weight=None, bias=None, eps=1e-5):
    """(output, mean, 1 / standard deviation) over the normalized axes, the
    statistics with those axes kept as 1."""
    out = _layer_norm(im, x, normalized_shape, weight, bias, eps)
    x = im.lift(x)
    axes = list(range(len(x.shape) - len(normalized_shape), len(x.shape)))
    mean = fe.reduce_mean(x, axes, True)
    centred = x - mean
    return [out, mean, fe.rsqrt(fe.reduce_mean(centred * centred, axes, True) + float(eps))]


@rule("aten.native_group_norm")
def _native_group_norm(im: _Importer, x, weight, bias, n, c, hw, group, eps):
    """(output, mean, 1 / standard deviation): each example's channels in
    `group` groups normalized together (the statistics of shape (N, group))."""
    x = im.lift(x)
    shape = list(x.shape)
    grouped = fe.reshape(x, [shape[0], int(group), -1])
    mean = fe.reduce_mean(grouped, [2], True)
    centred = grouped - mean
    rstd = fe.rsqrt(fe.reduce_mean(centred * centred, [2], True) + float(eps))
    y = _per_channel(im, fe.reshape(centred * rstd, shape), weight, bias)
    return [y, fe.reshape(mean, [shape[0], int(group)]), fe.reshape(rstd, [shape[0], int(group)])]


@rule("aten._native_batch_norm_legit_no_training")
def _batch_norm_evaluation(im: _Importer, x, weight, bias, running_mean, running_var, momentum, eps):
    """Batch-norm in evaluation: (output by the running statistics, and the
    two empty tensors PyTorch returns in place of saved statistics)."""
    x = im.lift(x)
    per_channel = [1, x.shape[1], *[1] * (len(x.shape) - 2)]
    mean, var = (fe.reshape(im.lift(v, x), per_channel) for v in (running_mean, running_var))
    y = _per_channel(im, (x - mean) * fe.rsqrt(var + float(eps)), weight, bias)
    empty = _Const(np.zeros(0, np.float32))
    return [y, empty, empty]


@rule("aten._native_batch_norm_legit.no_stats")
def _batch_norm_no_stats(im: _Importer, x, weight, bias, training, momentum, eps):
    """Batch-norm in training without running statistics: (output, the
    batch mean, 1 / its standard deviation), per channel."""
    x = im.lift(x)
    mean, centered, var = _batch_statistics(x)
    rstd = fe.rsqrt(var + float(eps))
    y = _per_channel(im, centered * rstd, weight, bias)
    return [y, fe.reshape(mean, [x.shape[1]]), fe.reshape(rstd, [x.shape[1]])]
