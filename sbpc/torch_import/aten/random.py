"""Random ops: dropout, and uniform and normal draws and permutations, each
sbpc's own draw (from `compile(seed=...)`): new at every step, the same
under every plan, not PyTorch's generator's."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from sbpc import frontend as fe
from sbpc.dialects import lg
from sbpc.torch_import.aten.registry import RULES, rule
from sbpc.torch_import.values import _DTYPES

if TYPE_CHECKING:
    # for the annotations only: the importer loads the rules (through their
    # registry) before it defines _Importer
    from sbpc.torch_import.importer import _Importer


@rule("aten.dropout")
def _dropout(im: _Importer, x, p, train):
    """lg.dropout: its mask is sbpc's own draw (from `compile(seed=...)`),
    the same under every plan, not PyTorch's generator's."""
    if not train or p == 0:
        return x
    return fe.dropout(im.lift(x), float(p))


@rule("aten.native_dropout")
def _native_dropout(im: _Importer, x, p, train):
    """The dropped values and the mask kept (True where kept): an element is
    kept where sbpc's uniform draw is at least p, as lg.dropout of that
    draw keeps it, and scaled by 1 / (1 - p); out of training, or at p =
    0, the values and a mask of every element."""
    x = im.lift(x)
    if not lg.is_float(x.dtype):
        raise ValueError(f"native_dropout of {x.dtype} values")
    if not 0.0 <= p <= 1.0:
        raise ValueError(f"dropout probability {p} (it must be in [0, 1])")
    if not train or p == 0:
        zero = im.lift(0.0, x)
        return [x, fe.broadcast_to(fe.compare("eq", zero, zero), list(x.shape))]
    draw = im.g.rand(list(x.shape), str(x.dtype) if str(x.dtype) in ("f32", "f64") else "f32")
    kept = fe.compare("ge", draw, im.lift(float(p), draw))
    scale = 0.0 if p == 1 else 1.0 / (1.0 - p)
    return [x * fe.cast(kept, str(x.dtype)) * scale, kept]


def _draw_dtype(op: str, dtype, generator, default: str = "f32") -> str:
    """The lg dtype of a draw given PyTorch's `dtype` (else `default`)."""
    if generator is not None:
        raise ValueError(f"{op} with a generator of its own (sbpc draws from compile(seed=...))")
    wanted = _DTYPES.get(str(dtype)) if dtype is not None else default
    if wanted not in ("f32", "f64"):
        raise ValueError(f"{op} of dtype {dtype} (sbpc draws float32 and float64)")
    return wanted


@rule("aten.rand")
def _rand(im: _Importer, size, dtype=None, layout=None, device=None, pin_memory=None, generator=None):
    """lg.uniform: sbpc's own draw in [0, 1), new at every step and the same
    under every plan (drop path's `floor(keep + rand)` keeps a sample exactly
    where lg.dropout at rate 1 - keep would)."""
    return im.g.rand([int(d) for d in size], _draw_dtype("rand", dtype, generator))


@rule("aten.randn")
def _randn(im: _Importer, size, dtype=None, layout=None, device=None, pin_memory=None, generator=None):
    """Standard normal numbers by Box and Muller's transform of two of sbpc's
    uniform draws u, v: sqrt(-2 ln(1 - u)) cos(2 pi v). The draws' 24-bit
    steps (1 - u is at least 2^-24) bound |x| by 5.77: the normal's tail
    beyond it (a chance of 8e-9) is never drawn."""
    return _normal(im, [int(d) for d in size], _draw_dtype("randn", dtype, generator))


def _normal(im: _Importer, shape: list[int], dtype: str):
    u, v = im.g.rand(shape, dtype), im.g.rand(shape, dtype)
    radius = fe.sqrt(fe.log(1.0 - u) * -2.0)
    return radius * fe.cos(v * (2.0 * math.pi))


@rule("aten.randperm")
def _randperm(im: _Importer, n, dtype=None, layout=None, device=None, pin_memory=None, generator=None):
    """A random permutation of 0..n-1: the order that sorts n of sbpc's
    uniform draws (the lower index first among equal draws). The draws
    have 24 bits, so from about n = 4,000 on two of them are likely equal,
    and such a pair keeps its order: a slight bias PyTorch's randperm has
    not."""
    if generator is not None:
        raise ValueError("randperm with a generator of its own (sbpc draws from compile(seed=...))")
    wanted = _DTYPES.get(str(dtype)) if dtype is not None else "i64"
    if wanted not in ("i64", "i32"):
        raise ValueError(f"randperm of dtype {dtype} (sbpc makes int64 and int32 permutations)")
    _, order = fe.topk(im.g.rand([int(n)], "f32"), int(n), 0, largest=False)
    return order if wanted == "i64" else fe.cast(order, wanted)


def _like(op: str, draw):
    def lower(im: _Importer, x, dtype=None, layout=None, device=None, pin_memory=None, memory_format=None,
              generator=None):
        """`torch.rand_like` / `randn_like` (a diffusion model's noise): the
        draw of `x`'s shape, in its dtype unless another is given."""
        x = im.lift(x)
        return draw(im, list(x.shape), _draw_dtype(op, dtype, generator, default=str(x.dtype)))

    return lower


RULES["aten.rand_like"] = _like("rand_like", lambda im, shape, dtype: im.g.rand(shape, dtype))
RULES["aten.randn_like"] = _like("randn_like", lambda im, shape, dtype: _normal(im, shape, dtype))
