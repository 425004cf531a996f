"""Random ops: dropout and uniform draws."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sbpc import frontend as fe
from sbpc.torch_import.aten.registry import rule
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


@rule("aten.rand")
def _rand(im: _Importer, size, dtype=None, layout=None, device=None, pin_memory=None, generator=None):
    """lg.uniform: sbpc's own draw in [0, 1), new at every step and the same
    under every plan (drop path's `floor(keep + rand)` keeps a sample exactly
    where lg.dropout at rate 1 - keep would)."""
    if generator is not None:
        raise ValueError("rand with a generator of its own (sbpc draws from compile(seed=...))")
    wanted = _DTYPES.get(str(dtype)) if dtype is not None else "f32"
    if wanted not in ("f32", "f64"):
        raise ValueError(f"rand of dtype {dtype} (sbpc draws float32 and float64)")
    return im.g.rand([int(d) for d in size], wanted)
