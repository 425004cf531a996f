"""The multi-device interpreter of sbp-level IR: evaluates sbp-level IR by holding
every device's local tensor in numpy, running each op's local kernel and
each collective by its semantics, then assembling the global outputs.

It is the oracle for every pass after sbp-infer: on every graph it must agree
with the global reference interpreter (`sbpc.semantics.reference.evaluate`). It also
measures the bytes every collective moves (the average, over the devices of
the mesh, of what a device receives from other ranks), which the boxing pass
records and the tests compare.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue

from sbpc.dialects import lg, sbp
from sbpc.dialects.dtypes import numpy_dtype
from sbpc.dialects.pieces import Coord, balanced, coords, owned_rows, partial_kind, piece
from sbpc.dialects.sbp import DTensorType, Mesh, PlainNd, Sbp, global_shape, lookup_placement, nd_to_plain
from sbpc.semantics.local_eval import LocalContext, combine, distribute, local_kernel
from sbpc.semantics.reference import EvaluationError, evaluate, find_graph

Pieces = dict[Coord, np.ndarray]


@dataclass
class Distributed:
    """A value as the devices hold it."""

    mesh: Mesh
    nd: PlainNd
    shape: tuple[int, ...]
    dtype: np.dtype
    pieces: Pieces

    def rank_of(self, c: Coord) -> int:
        return self.mesh.ranks[int(np.ravel_multi_index(c, self.mesh.shape))]


@dataclass
class DistributedResult:
    outputs: dict[str, np.ndarray]
    bytes_moved: dict[Operation, float] = field(default_factory=dict)
    """Per collective (and redistributing annotation): average bytes a device receives."""


def _fill(kind: str | None) -> float:
    return -np.inf if kind == Sbp.PMAX else 0.0


def _regions(shape, nd, mesh_shape) -> dict[Coord, tuple[slice, ...]]:
    return {c: piece(shape, nd, mesh_shape, c) for c in coords(mesh_shape)}


def _size(region: tuple[slice, ...]) -> int:
    return math.prod(s.stop - s.start for s in region)


def _intersect(a: tuple[slice, ...], b: tuple[slice, ...]) -> int:
    return math.prod(max(0, min(x.stop, y.stop) - max(x.start, y.start)) for x, y in zip(a, b))


def distribute_exact(value: np.ndarray, nd: PlainNd, mesh_shape) -> Pieces:
    """Deterministic pieces of a global value: partial axes hold the value on
    their first device and zeros (-inf for max) on the others."""
    kind = partial_kind(nd)
    partial_axes = [a for a, s in enumerate(nd) if s.is_partial]
    out = {}
    for c, region in _regions(value.shape, nd, mesh_shape).items():
        local = np.array(value[region])
        if any(c[a] for a in partial_axes):
            local = np.full_like(local, _fill(kind))
        out[c] = local
    return out


# --------------------------------------------------------------------------
# Collectives: within each group of devices that differ only on the listed
# mesh axes, assemble the group's tensor from the source pieces, then cut the
# destination pieces from it.
# --------------------------------------------------------------------------


def _groups(mesh_shape, axes) -> list[list[Coord]]:
    groups: dict[Coord, list[Coord]] = {}
    for c in coords(mesh_shape):
        key = tuple(x for a, x in enumerate(c) if a not in axes)
        groups.setdefault(key, []).append(c)
    return list(groups.values())


def run_collective(kind: str, value: Distributed, dst_nd: PlainNd, axes: list[int],
                   ends: np.ndarray | None = None, index: np.ndarray | None = None) -> tuple[Pieces, float]:
    """New pieces after the collective `kind` (all_reduce, all_gather, ...)
    over mesh `axes`, and the average bytes a device receives. Into or out
    of rows owned by rows at run time (G or I), `ends` are the group ends
    and `index` the index: `_run_owned_rows`."""
    if any(s.is_grouped or s.is_indexed for s in (*value.nd, *dst_nd)):
        return _run_owned_rows(kind, value, dst_nd, axes, ends, index)
    mesh_shape = value.mesh.shape
    src_regions = _regions(value.shape, value.nd, mesh_shape)
    dst_regions = _regions(value.shape, dst_nd, mesh_shape)
    src_kind, dst_kind = partial_kind(value.nd), partial_kind(dst_nd)
    itemsize = value.dtype.itemsize
    out: Pieces = {}
    received = 0.0
    for group in _groups(mesh_shape, axes):
        lo = [min(src_regions[c][k].start for c in group) for k in range(len(value.shape))]
        hi = [max(src_regions[c][k].stop for c in group) for k in range(len(value.shape))]
        box = tuple(slice(a, b) for a, b in zip(lo, hi))

        def rel(region, box=box):
            return tuple(slice(r.start - b.start, r.stop - b.start) for r, b in zip(region, box))

        partial_source = any(value.nd[a].is_partial for a in axes)
        if kind == "make_partial":
            # A split axis keeps every piece in place; a whole (B) axis keeps
            # it on the group's first device only; the rest is the identity
            # of the reduction.
            whole_axes = [a for a in axes if value.nd[a] == Sbp.B]
            for c in group:
                local = np.full([s.stop - s.start for s in dst_regions[c]], _fill(dst_kind), value.dtype)
                if not any(c[a] for a in whole_axes):
                    local[rel(src_regions[c])] = value.pieces[c]
                out[c] = local
            continue
        if partial_source:
            whole = _reduced([value.pieces[c] for c in group], src_kind)
        else:
            whole = np.zeros([b - a for a, b in zip(lo, hi)], value.dtype)
            covered = np.zeros(whole.shape, bool)
            for c in group:
                whole[rel(src_regions[c])] = value.pieces[c]
                covered[rel(src_regions[c])] = True
            if not covered.all():
                raise EvaluationError(f"'sbp.{kind}': the source pieces do not tile the group's tensor")
        g = len(group)
        for i, c in enumerate(group):
            out[c] = np.array(whole[rel(dst_regions[c])])
            mine = value.pieces[c].size
            if kind == "all_reduce":
                chunks = [b - a for a, b in (balanced(whole.size, g, j) for j in range(g))]
                got = (g - 1) * chunks[i] + (whole.size - chunks[i])
            elif kind == "reduce_scatter":
                got = (g - 1) * out[c].size
            elif kind == "all_gather":
                got = out[c].size - mine
            elif kind == "all_to_all":
                got = sum(_intersect(src_regions[o], dst_regions[c]) for o in group if o != c)
            elif kind == "slice":
                got = 0
            else:
                raise EvaluationError(f"the sbp interpreter has no collective '{kind}'")
            received += got * itemsize
    return out, received / len(coords(mesh_shape))


def _reduced(pieces: list[np.ndarray], kind: Sbp | None) -> np.ndarray:
    """The value partial pieces stand for: their sum, or their max (P<max>)."""
    stack = np.stack(pieces)
    return stack.max(axis=0) if kind == Sbp.PMAX else stack.sum(axis=0)


def _run_owned_rows(kind: str, value: Distributed, dst_nd: PlainNd, axes: list[int],
                    ends: np.ndarray | None, index: np.ndarray | None) -> tuple[Pieces, float]:
    """A collective into or out of rows owned at run time (G: grouped by the
    ends, I: gathered by the index), on the mesh axis that owns them. Such a
    tensor is stored whole and each device's own rows are its values
    (pieces.owned_rows); a device sends only those, and keeps zeros in the
    rows it stores but does not own (but from B, which keeps the whole)."""
    mesh_shape = value.mesh.shape
    rows = value.shape[0]
    src_regions = _regions(value.shape, value.nd, mesh_shape)
    dst_regions = _regions(value.shape, dst_nd, mesh_shape)
    src_kind, dst_kind = partial_kind(value.nd), partial_kind(dst_nd)
    fill = _fill(dst_kind)
    out: Pieces = {}
    received = 0.0
    for group in _groups(mesh_shape, axes):
        # the group's tensor in local coordinates: its rows whole, the other
        # axes as the (shared) pieces of the axes outside the collective
        first = src_regions[group[0]]
        whole = np.zeros([rows, *(s.stop - s.start for s in first[1:])], value.dtype)
        partial_source = any(value.nd[a].is_partial for a in axes)
        if partial_source:
            whole = _reduced([value.pieces[c] for c in group], src_kind)
        else:
            for c in group:
                own = owned_rows(value.nd, mesh_shape, c, rows, ends, index)
                if own is None:  # B (whole) or S(0) (its rows)
                    whole[src_regions[c][0]] = value.pieces[c]
                else:
                    whole[own] = value.pieces[c][own]
        for c in group:
            if kind == "slice":  # B -> G or I keeps the whole (and reads neither ends nor index)
                out[c] = np.array(value.pieces[c])
                continue
            src_own = owned_rows(value.nd, mesh_shape, c, rows, ends, index)
            if kind == "make_partial":  # own rows in the reduction's identity
                local = np.full(value.pieces[c].shape, fill, value.dtype)
                local[src_own] = value.pieces[c][src_own]
                out[c] = local
                continue
            own = owned_rows(dst_nd, mesh_shape, c, rows, ends, index)
            if own is None:  # to B or S(0): the rows
                local = np.array(whole[dst_regions[c][0]])
            else:
                local = np.zeros_like(whole)
                local[own] = whole[own]
            out[c] = local
            mine = np.zeros(rows, bool)
            mine[src_own if src_own is not None else src_regions[c][0]] = True
            wanted = np.zeros(rows, bool)
            wanted[own if own is not None else dst_regions[c][0]] = True
            row_bytes = value.dtype.itemsize * (whole.size // max(rows, 1))
            received += float((wanted & ~mine).sum() * row_bytes) if not partial_source else \
                float(wanted.sum() * row_bytes * (len(group) - 1))
    return out, received / len(coords(mesh_shape))


def run_transfer(value: Distributed, dst: Distributed) -> tuple[Pieces, float]:
    """Between placements: every destination piece is cut from the global
    tensor; a device receives what its own rank did not already hold."""
    whole = combine(value.pieces, value.nd, value.mesh.shape, value.shape, value.dtype)
    pieces = distribute_exact(whole, dst.nd, dst.mesh.shape)
    src_regions = _regions(value.shape, value.nd, value.mesh.shape)
    held = {value.rank_of(c): r for c, r in src_regions.items()}
    received = 0.0
    for c, region in _regions(value.shape, dst.nd, dst.mesh.shape).items():
        own = held.get(dst.rank_of(c))
        received += (_size(region) - (_intersect(region, own) if own is not None else 0)) * value.dtype.itemsize
    return pieces, received / dst.mesh.size


# --------------------------------------------------------------------------
# The interpreter
# --------------------------------------------------------------------------


def _describe(op: Operation, value: SSAValue, shape, dtype) -> Distributed:
    t = value.type
    if not isinstance(t, DTensorType):
        raise EvaluationError(f"'{op.name}': the sbp interpreter needs distributed values; run sbp-infer first")
    mesh = lookup_placement(op, t.placement).mesh()
    return Distributed(mesh, nd_to_plain(t.nd_sbp), tuple(shape), np.dtype(dtype), {})


def evaluate_distributed(
    module: ModuleOp | lg.GraphOp,
    feeds: Mapping[str, Any],
    params: Mapping[str, Any] | None = None,
    graph: str | None = None,
    rng: np.random.Generator | None = None,
) -> DistributedResult:
    """Evaluates the sbp-level graph device by device. The sources (inputs,
    parameters, constants) take their global values from the reference
    interpreter; a partial source holds, with `rng`, random summands that
    add up to its value (random candidates for a max; float types only),
    else the value on its first device and zeros on the others (a
    collective that never reduced would pass with those)."""
    graph_op = find_graph(module, graph)
    # Sources take their global values from the reference interpreter, which
    # also checks the feeds.
    globals_: dict[SSAValue, np.ndarray] = {}
    evaluate(graph_op, feeds, params, trace=globals_)
    values: dict[SSAValue, Distributed] = {}
    result = DistributedResult({})
    for op in graph_op.body.ops:
        if isinstance(op, lg.OutputOp):
            for name, v in zip(op.names.data, op.values):
                d = values[v]
                result.outputs[name.data] = combine(d.pieces, d.nd, d.mesh.shape, d.shape, d.dtype)
            return result
        out = op.results[0]
        shape = global_shape(out.type)
        dtype = numpy_dtype(out.type.element_type)
        target = _describe(op, out, shape, dtype)
        if isinstance(op, (lg.InputOp, lg.ParamOp, lg.ConstantOp)):
            if rng is not None and np.issubdtype(dtype, np.floating):
                target.pieces = distribute(globals_[out], target.nd, target.mesh.shape, rng)
            else:
                target.pieces = distribute_exact(globals_[out], target.nd, target.mesh.shape)
        elif isinstance(op, sbp.TransferOp | sbp.AnnotateOp):
            source = values[op.operands[0]]
            if source.mesh == target.mesh and source.nd == target.nd:
                target.pieces = source.pieces
            else:
                target.pieces, result.bytes_moved[op] = run_transfer(source, target)
        elif isinstance(op, sbp.CollectiveOp):
            source = values[op.operands[0]]
            ends, index = (None if v is None else combine(values[v].pieces, values[v].nd, values[v].mesh.shape,
                                                           values[v].shape, values[v].dtype)
                           for v in (op.ends, op.index))
            target.pieces, result.bytes_moved[op] = run_collective(
                op.name.removeprefix("sbp."), source, target.nd, list(op.mesh_axes.get_values()), ends, index
            )
        elif isinstance(op, lg.LgOp):
            inputs = [values[o] for o in op.operands]
            for d in inputs:
                if d.mesh != target.mesh:
                    raise EvaluationError(f"'{op.name}': operand on @{d.mesh.name}, op on @{target.mesh.name}")
            in_shapes = tuple(d.shape for d in inputs)
            for c in coords(target.mesh.shape):
                ctx = LocalContext(
                    in_shapes,
                    shape,
                    tuple(piece(d.shape, d.nd, d.mesh.shape, c) for d in inputs),
                    piece(shape, target.nd, target.mesh.shape, c),
                    target.nd,
                )
                target.pieces[c] = local_kernel(op, ctx, *(d.pieces[c] for d in inputs)).astype(dtype)
        else:
            raise EvaluationError(f"'{op.name}': the sbp interpreter has no semantics for this op")
        values[out] = target
    raise EvaluationError(f"graph @{graph_op.sym_name.data} has no lg.output")
