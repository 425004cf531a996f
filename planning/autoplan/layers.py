"""Layers: a forward graph cut where the fewest activations cross (a
transformer's residual stream between its attention and MLP halves), and
layers of one structure grouped into one class that is profiled once
(the layer search's unit; profiler.py, compose.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from xdsl.dialects.builtin import SymbolRefAttr
from xdsl.ir import Operation, SSAValue

from sbpc.dialects import lg
from sbpc.dialects.lg_analysis import narrow_cuts
from sbpc.dialects.pieces import local_shape
from sbpc.dialects.sbp import DTensorType, element_bytes, element_type, global_shape, lookup_placement

from .stages import FORWARD_SOURCES as SOURCES

MIN_LAYER_OPS = 4
"""A layer of fewer ops joins the next one (the embedding's add, the head's loss)."""


@dataclass
class Layer:
    ops: list[Operation]
    ins: list[SSAValue]
    """Activations made by earlier layers and read here, in first-use order."""
    outs: list[SSAValue]
    """Values made here and read by later layers or the graph's outputs."""
    params: list[lg.ParamOp]
    """The parameters it reads, in first-use order."""
    key: tuple = ()
    """Its structure: layers with equal keys share one profile and one choice."""


def split_layers(graph: lg.GraphOp) -> list[Layer]:
    """The forward graph's ops in program order, cut after every op where
    the fewest activations cross (lg_recompute.narrow_cuts)."""
    order = [op for op in graph.body.ops if not isinstance(op, SOURCES)]
    if not order:
        return []
    crossing = narrow_cuts(order)
    fewest = min((len(c) for c in crossing if c), default=0)
    ends = [i for i, c in enumerate(crossing) if c and len(c) == fewest]
    if not ends or ends[-1] != len(order) - 1:
        ends.append(len(order) - 1)
    pieces: list[list[Operation]] = []
    start = 0
    for end in ends:
        pieces.append(order[start:end + 1])
        start = end + 1
    # A short piece of its own kind (the embedding's lookup, the head's
    # loss) joins the next piece (the last ones, the one before), so
    # profiles stay few; repeated pieces stay layers of their own.
    keys = [_layer(piece).key for piece in pieces]
    merged: list[list[Operation]] = []
    pending: list[Operation] = []
    for piece, key in zip(pieces, keys, strict=True):
        pending += piece
        if len(pending) >= MIN_LAYER_OPS or keys.count(key) > 1:
            merged.append(pending)
            pending = []
    if pending:
        if merged:
            merged[-1] += pending
        else:
            merged.append(pending)
    return [_layer(ops) for ops in merged]


def _layer(ops: list[Operation]) -> Layer:
    inside = set(ops)
    ins: list[SSAValue] = []
    params: list[lg.ParamOp] = []
    for op in ops:
        for v in op.operands:
            owner = v.owner
            if isinstance(owner, lg.ParamOp) and owner not in params:
                params.append(owner)
            elif isinstance(owner, Operation) and not isinstance(owner, SOURCES) and owner not in inside \
                    and v not in ins:
                ins.append(v)
    outs: list[SSAValue] = [r for op in ops for r in op.results if any(u.operation not in inside for u in r.uses)]
    layer = Layer(ops, ins, outs, params)
    layer.key = _structure(layer)
    return layer


def _structure(layer: Layer) -> tuple:
    local: dict[SSAValue, tuple] = {}
    ins = {v: ("in", k) for k, v in enumerate(layer.ins)}
    key: list[tuple] = []
    for i, op in enumerate(layer.ops):
        refs = []
        for v in op.operands:
            ref = local.get(v) or ins.get(v)
            if ref is None:
                owner = v.owner
                ref = (owner.name if isinstance(owner, Operation) else "arg", str(v.type))
            refs.append(ref)
        props = tuple(sorted((k, str(a)) for k, a in op.properties.items()))
        key.append((op.name, props, tuple(str(r.type) for r in op.results), tuple(refs)))
        for j, r in enumerate(op.results):
            local[r] = ("op", i, j)
    key.append(tuple(local[v] for v in layer.outs))
    return tuple(key)


def local_bytes(value: SSAValue) -> int:
    t = value.type
    if isinstance(t, DTensorType):
        owner = value.owner
        assert isinstance(owner, Operation)
        mesh = lookup_placement(owner, SymbolRefAttr(t.placement_name)).mesh()
        shape = local_shape(t, mesh, mesh.ranks[0])
    else:
        shape = global_shape(t)
    return math.prod(shape) * element_bytes(element_type(t))
