"""Random ops: dropout."""

from __future__ import annotations

from typing import TYPE_CHECKING

from sbpc import frontend as fe
from sbpc.torch_import.aten.registry import rule

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
