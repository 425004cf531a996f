"""Casts, logical and comparison ops, and masks: masked_fill and where
(a mask known at import time becomes an additive constant)."""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

from sbpc import frontend as fe
from sbpc.dialects import lg
from sbpc.frontend import Tensor
from sbpc.torch_import.aten.elementwise import _compact, _operands
from sbpc.torch_import.aten.registry import rule
from sbpc.torch_import.values import _DTYPES

if TYPE_CHECKING:
    # for the annotations only: the importer loads the rules (through their
    # registry) before it defines _Importer
    from sbpc.torch_import.importer import _Importer


@rule("aten._to_copy", "aten.to.dtype", "aten.to.dtype_layout", "aten.to.device", "aten.type_as")
def _to(im: _Importer, x, *args, **kwargs):
    """`.to(dtype)`, `.to(device, dtype)`, `.type_as(other)`: a cast where the
    dtype changes (lg.cast), the value itself where it does not; the device
    is the placement's business."""
    import torch

    x = im.lift(x)
    wanted = None
    for a in (*args, kwargs.get("dtype")):
        if isinstance(a, Tensor):
            wanted = str(a.dtype)
        elif isinstance(a, torch.dtype):
            if str(a) not in _DTYPES:
                raise ValueError(f"a cast to {a}, which sbpc does not support (supported: {', '.join(_DTYPES)})")
            wanted = _DTYPES[str(a)]
        if wanted is not None:
            break
    return x if wanted is None or wanted == str(x.dtype) else fe.cast(x, wanted)


def _boolean(im: _Importer, value, what: str, truth: bool = False) -> Tensor:
    """An i1 tensor of a value: a computed i1 tensor (or, with `truth`, any
    computed tensor's `!= 0`, as torch.logical_* take it), or a constant's truth."""
    if isinstance(value, Tensor):
        if str(value.dtype) != "i1":
            if truth:
                return fe.cast(value, "i1")
            raise ValueError(f"{what} of a {value.dtype} tensor (sbpc takes bool tensors here)")
        return value
    known = im.known(value)
    if known is None:
        raise TypeError(f"expected a tensor or a number, got {type(value).__name__}")
    return im.g.constant(known.astype(bool))


def _logical_rule(kind: str, truth: bool):
    def lower(im: _Importer, a, b):
        return fe.logical(kind, _boolean(im, a, f"'{kind}'", truth), _boolean(im, b, f"'{kind}'", truth))

    return lower


for _kind in ("and", "or", "xor"):
    # &, |, ^ on bool tensors (on integers they are bitwise, which lg has not);
    # torch.logical_* take any tensor's truth
    rule(f"aten.__{_kind}__.Tensor", f"aten.bitwise_{_kind}.Tensor", f"aten.bitwise_{_kind}.Scalar")(
        _logical_rule(_kind, truth=False))
    rule(f"aten.logical_{_kind}")(_logical_rule(_kind, truth=True))


def _compare_rule(kind: str):
    def lower(im: _Importer, a, b):
        # PyTorch compares in the promoted dtype: an integer tensor against a
        # fractional number, or against a float tensor, compares as floats
        import torch

        traced = [x.meta.get("val") if hasattr(x, "meta") else x for x in im.node.args[:2]]
        dtype = _DTYPES.get(str(torch.result_type(*traced)))
        if dtype is None:
            raise ValueError(f"a comparison in dtype {torch.result_type(*traced)}")
        return fe.compare(kind, *_operands(im, a, b, dtype))

    return lower


for _kind in ("eq", "ne", "lt", "le", "gt", "ge"):
    rule(f"aten.{_kind}.Tensor", f"aten.{_kind}.Scalar")(_compare_rule(_kind))


@rule("aten.bitwise_not")
def _not(im: _Importer, x):
    return fe.logical("xor", _boolean(im, x, "'not'"), im.g.constant(np.asarray(True)))


@rule("aten.logical_not")
def _logical_not(im: _Importer, x):
    return fe.logical("xor", _boolean(im, x, "'not'", truth=True), im.g.constant(np.asarray(True)))


def _additive_mask(im: _Importer, mask: np.ndarray, value: float, like: Tensor) -> Tensor:
    """`value` where `mask` is true, 0 elsewhere: masked_fill as an add (exact
    for finite inputs, and for -inf, softmax's use)."""
    fill = np.where(mask, np.asarray(value, fe._numpy_of(like.dtype)), 0).astype(fe._numpy_of(like.dtype))
    return im.g.constant(_compact(fill, like))


@rule("aten.masked_fill.Scalar", "aten.masked_fill.Tensor")
def _masked_fill(im: _Importer, x, mask, value):
    """A mask known at import time (a causal mask): an additive mask, no
    select; a mask or value computed from the inputs (padding tokens set
    to -100 in shifted labels): a select."""
    mask_value, fill = im.known(mask), im.known(value)
    if mask_value is None or fill is None or not lg.is_float(im.lift(x).dtype):
        return _where(im, mask, value, x)
    x = im.lift(x)
    return x + _additive_mask(im, mask_value.astype(bool), float(fill), x)


@rule("aten.where.self", "aten.where.ScalarOther", "aten.where.ScalarSelf", "aten.where.Scalar")
def _where(im: _Importer, condition, a, b):
    cond = im.known(condition)
    if cond is not None:  # a mask known at import time: an additive mask, no select
        cond = cond.astype(bool)
        for kept, other, choose in ((a, b, ~cond), (b, a, cond)):
            fill = im.known(other)
            if isinstance(kept, Tensor) and fill is not None and fill.size == 1:
                return kept + _additive_mask(im, choose, float(fill), kept) if choose.any() else kept
    dtype = _DTYPES.get(str(im.node.meta["val"].dtype)) if "val" in im.node.meta else None
    if dtype is None:
        raise ValueError("where whose result dtype is not known")
    values = [v if isinstance(v, Tensor) else im.g.constant(np.asarray(im.known(v), fe._numpy_of(
        fe.element(dtype)))) for v in (a, b)]
    values = [v if str(v.dtype) == dtype else fe.cast(v, dtype) for v in values]
    return fe.where(_boolean(im, condition, "where's condition"), *values)
