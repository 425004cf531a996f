"""Matrix products: linear, matmul, addmm, and scaled-dot-product
attention built from them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from sbpc import frontend as fe
from sbpc.dialects import lg
from sbpc.frontend import Tensor
from sbpc.torch_import.aten.elementwise import _result_dtype
from sbpc.torch_import.aten.mask import _additive_mask
from sbpc.torch_import.aten.registry import rule
from sbpc.torch_import.precision import _HALVES

if TYPE_CHECKING:
    # for the annotations only: the importer loads the rules (through their
    # registry) before it defines _Importer
    from sbpc.torch_import.importer import _Importer


@rule("aten.linear")
def _linear(im: _Importer, x, weight, bias=None):
    # (16-bit operands arrive widened: _Importer._call rounds the sum with the bias once)
    y = fe.matmul(im.lift(x), im.lift(weight), transpose_b=True)
    return y if bias is None else y + im.lift(bias)


@rule("aten.matmul", "aten.mm", "aten.bmm")
def _matmul(im: _Importer, a, b):
    a, b = im.lift(a), im.lift(b)
    if len(a.shape) < 2 or len(b.shape) < 2:
        raise ValueError("matmul of a vector: reshape it to a matrix first")
    return fe.matmul(a, b)


@rule("aten._grouped_mm", "transformers.grouped_mm_fallback")
def _grouped_mm(im: _Importer, x, experts, offs=None, bias=None, out_dtype=None):
    """Rows [S, K] grouped by expert times the experts [E, K, N], the
    groups' cumulative ends `offs` computed at run time (lg.grouped_matmul):
    PyTorch's `_grouped_mm` with 2-D and 3-D operands, and transformers'
    own form of it (`grouped_mm_fallback`). Experts transposed in their last
    two axes just before (transformers' [E, N, K] weights) are read as they
    are stored, with the op's transpose flag, instead of copied."""
    if offs is None or bias is not None or (out_dtype is not None and str(out_dtype) != str(getattr(
            im.node.meta.get("val"), "dtype", out_dtype))):
        raise ValueError("a grouped matmul without offsets, with a bias or another output dtype")
    x, experts, ends = im.lift(x), im.lift(experts), im.lift(offs)
    if len(x.shape) != 2 or len(experts.shape) != 3:
        raise ValueError(f"a grouped matmul of {list(x.shape)} and {list(experts.shape)} (supported: rows [S, K] "
                         "and experts [E, K, N])")
    owner = experts.value.owner
    if isinstance(owner, lg.TransposeOp) and tuple(owner.perm.get_values()) == (0, 2, 1):
        return fe.grouped_matmul(x, Tensor(x.graph, owner.input), ends, transpose_experts=True)
    return fe.grouped_matmul(x, experts, ends)


@rule("aten.addmm")
def _addmm(im: _Importer, bias, a, b, beta=1, alpha=1):
    """beta * bias + alpha * (a @ b); a factor of 1 is left out."""
    product = fe.matmul(im.lift(a), im.lift(b))
    if alpha != 1:
        product = product * float(alpha)
    if beta == 0:  # PyTorch ignores the bias then, NaNs included
        return product
    bias = im.lift(bias)
    return product + (bias if beta == 1 else bias * float(beta))


@rule("aten.scaled_dot_product_attention")
def _sdpa(im: _Importer, q, k, v, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """softmax(q kᵀ * scale + masks) v. Of 16-bit floats without dropout,
    as PyTorch's CPU flash attention computes it (what it runs there): the
    scores, their maximum, exponentials and sum in float32 (the importer
    widened the operands), the exponentials rounded to the 16-bit type for
    their product with v (accumulated in float32), divided by the sum, and
    the result rounded once. Step by step in 16 bits
    the first loss of GPT-2 under autocast left PyTorch's by 3e-6, and all
    in float32 too. (Its
    exponential is an approximation of its own: the two agree to a unit in
    the last place of the result, not to the bit.)"""
    if enable_gqa:
        raise ValueError("grouped-query attention (enable_gqa): repeat the key and value heads instead")
    q, k, v = im.lift(q), im.lift(k), im.lift(v)  # (16-bit ones widened to float32 by the importer: `_call`)
    traced = _result_dtype(im)
    half = traced if traced in _HALVES and not dropout_p else None
    length, source = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = fe.matmul(q, k, transpose_b=True) * scale
    if is_causal:
        scores = scores + _additive_mask(im, ~np.tril(np.ones((length, source), bool)), -math.inf, scores)
    if attn_mask is not None:
        mask = im.known(attn_mask)
        if mask is None and lg.is_bool(im.lift(attn_mask).dtype):  # computed from the inputs: True takes part
            scores = fe.where(im.lift(attn_mask), scores, im.lift(-math.inf, scores))
        elif mask is None:
            scores = scores + im.lift(attn_mask)
        elif mask.dtype == np.bool_:
            scores = scores + _additive_mask(im, ~mask, -math.inf, scores)
        else:
            scores = scores + im.lift(attn_mask)
    last = len(scores.shape) - 1
    if half is None:
        return fe.matmul(fe.dropout(fe.softmax(scores, last), float(dropout_p)), v)
    exps = fe.exp(scores - fe.stop_gradient(fe.reduce_max(scores, [last], keepdims=True)))
    weighted = fe.matmul(fe.cast(fe.cast(exps, half), "f32"), v)
    return weighted / fe.reduce_sum(exps, [last], keepdims=True)  # (rounded to `half` by the importer)


def _distances(im: _Importer, a: Tensor, b: Tensor, p: float) -> Tensor:
    """The p-norm distance between each row of `a` [..., P, M] and each row
    of `b` [..., R, M]: [..., P, R], from the differences of every pair.
    p = 0 counts the coordinates that differ, p = inf takes the largest;
    a root is taken only of a positive sum, so a zero distance has the
    gradient 0, as PyTorch's."""
    *lead, rows, width = a.shape
    other = b.shape[-2]
    pairs = [*lead, rows, other, width]
    diff = (fe.broadcast_to(fe.reshape(a, [*lead, rows, 1, width]), pairs)
            - fe.broadcast_to(fe.reshape(b, [*lead, 1, other, width]), pairs))
    size = fe.relu(diff) + fe.relu(-diff)
    last = len(pairs) - 1
    zero = im.lift(0.0, a)
    if p == 0:
        return fe.reduce_sum(fe.cast(fe.compare("ne", size, zero), str(a.dtype)), [last])
    if math.isinf(p):
        return fe.reduce_max(size, [last])
    if p == 1:
        return fe.reduce_sum(size, [last])
    if p == 2:
        powered = size * size
    else:
        positive = fe.compare("gt", size, zero)
        powered = fe.where(positive, fe.exp(fe.log(fe.where(positive, size, im.lift(1.0, a))) * float(p)), zero)
    total = fe.reduce_sum(powered, [last])
    positive = fe.compare("gt", total, zero)
    safe = fe.where(positive, total, im.lift(1.0, a))
    root = fe.sqrt(safe) if p == 2 else fe.exp(fe.log(safe) * (1.0 / p))
    return fe.where(positive, root, zero)


@rule("aten._cdist_forward")
def _cdist(im: _Importer, a, b, p, compute_mode=None):
    """torch.cdist: the p-norm distances between the rows of two batches of
    row sets (`_distances`)."""
    a, b = im.lift(a), im.lift(b)
    if p < 0:
        raise ValueError(f"cdist with p={p} (p must be non-negative)")
    return _distances(im, a, b, float(p))


@rule("aten._pdist_forward")
def _pdist(im: _Importer, x, p=2.0):
    """torch.pdist: the p-norm distances between the rows of `x` [N, M], for
    each pair i < j in row-major order: the upper triangle of `cdist(x, x)`."""
    x = im.lift(x)
    if p < 0:
        raise ValueError(f"pdist with p={p} (p must be non-negative)")
    n = x.shape[0]
    upper = np.array([i * n + j for i in range(n) for j in range(i + 1, n)], dtype=np.int64)
    flat = fe.reshape(_distances(im, x, x, float(p)), [n * n])
    return fe.gather(flat, im.g.constant(upper), 0) if upper.size else fe.slice(flat, [0], [0])
