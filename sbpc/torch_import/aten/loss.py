"""Losses: cross_entropy_loss and mse_loss."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sbpc import frontend as fe
from sbpc.torch_import.aten.registry import rule

if TYPE_CHECKING:
    # for the annotations only: the importer loads the rules (through their
    # registry) before it defines _Importer
    from sbpc.torch_import.importer import _Importer


@rule("aten.cross_entropy_loss")
def _cross_entropy(im: _Importer, logits, target, weight=None, reduction=1, ignore_index=-100,
                   label_smoothing=0.0):
    """Megatron's vocabulary-parallel cross-entropy (fe.token_cross_entropy):
    the class axis may be split, and no one-hot of the classes is formed."""
    if weight is not None or label_smoothing:
        raise ValueError("cross_entropy with class weights or label smoothing")
    logits, target = im.lift(logits), im.lift(target)
    if len(logits.shape) < 2:
        raise ValueError(f"cross_entropy of {len(logits.shape)}-D logits (takes (N, C) or (N, C, d1, ...))")
    positions = None
    if len(logits.shape) > 2:
        # (N, C, d1, ...): a class per position (a segmentation map), the
        # class axis moved last and every position a row
        rank = len(logits.shape)
        positions = [logits.shape[0], *logits.shape[2:]]
        logits = fe.reshape(fe.transpose(logits, [0, *range(2, rank), 1]), [-1, logits.shape[1]])
        target = fe.reshape(target, [-1])
    losses = fe.token_cross_entropy(logits, target, ignore_index)
    if reduction == 0:  # 'none': each row's loss, 0 where ignored
        return losses if positions is None else fe.reshape(losses, positions)
    total = fe.reduce_sum(losses, [0])
    if reduction == 2:
        return total
    # PyTorch's mean is over the targets not ignored, a count only the data
    # knows: a reduction of its own (a partial sum when the batch is split)
    counted = fe.compare("ne", target, im.g.constant(np.asarray(ignore_index, fe._numpy_of(target.dtype))))
    return total / fe.reduce_sum(fe.cast(counted, str(logits.dtype)), [0])


@rule("aten.mse_loss")
def _mse(im: _Importer, a, b, reduction=1):
    if reduction != 1:
        raise ValueError("mse_loss with reduction other than 'mean'")
    return fe.mse_loss(im.lift(a), im.lift(b))
