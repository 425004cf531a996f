"""`sbp-insert-boxing`: turns every redistribution request into collectives.

After sbp-infer, a consumer whose signature needs another distribution than
its producer gives reads an `sbp.annotate` from the producer's dtensor to the
needed one. This pass replaces each such annotation by the cheapest sequence
of collectives (the boxing planner's plan), each recording the bytes a device
receives on average. Between placements it reduces partial sources on the
source mesh first, moves the pieces with one `sbp.transfer`, and rebuilds a
partial destination locally. Afterwards every op's operands match its
signature exactly, and the only annotations left are no-ops, which go too.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg, sbp
from sbpc.dialects.pieces import coords, piece
from sbpc.dialects.row_groups import row_groups
from sbpc.dialects.sbp import (
    DTensorType,
    Mesh,
    PlainNd,
    Sbp,
    element_bytes,
    format_nd,
    global_shape,
    hierarchy_violation,
    lookup_placement,
    nd_from_plain,
    nd_to_plain,
)
from sbpc.planning.boxing_planner import Step, plan, step_units


def itemsize(t: DTensorType) -> int:
    return element_bytes(t.element_type)


def step_bytes(step: Step, shape: tuple[int, ...], nbytes_per_elem: int, mesh: tuple[int, ...]) -> int:
    """The textbook volume of one step: the average bytes a device receives.
    The group tensor of a step on mesh axis a is the global tensor divided by
    the other mesh axes that split it (the same before and after the step)."""
    return round(step_units(step, mesh) * math.prod(shape) * nbytes_per_elem)


def transfer_bytes(shape, src_nd: PlainNd, src_mesh: Mesh, dst_nd: PlainNd, dst_mesh: Mesh, nbytes: int) -> int:
    """Average bytes a destination device receives: its piece, less what its
    own rank already held on the source placement."""
    held = {
        src_mesh.ranks[i]: piece(shape, src_nd, src_mesh.shape, c) for i, c in enumerate(coords(src_mesh.shape))
    }
    total = 0
    for i, c in enumerate(coords(dst_mesh.shape)):
        region = piece(shape, dst_nd, dst_mesh.shape, c)
        size = math.prod(s.stop - s.start for s in region)
        own = held.get(dst_mesh.ranks[i])
        if own is not None:
            size -= math.prod(max(0, min(x.stop, y.stop) - max(x.start, y.start)) for x, y in zip(region, own))
        total += size
    return round(total * nbytes / dst_mesh.size)


class BoxingBuilder:
    """Emits collectives after an anchor op, in order. A step into or out of
    rows grouped by expert (G) reads the group ends: `group_ends` gives
    them, whole on the mesh, for a value (GroupEnds.whole)."""

    def __init__(self, anchor: Operation, group_ends: Callable[[SSAValue, Mesh], SSAValue] | None = None,
                 index: Callable[[Sbp, Sbp], SSAValue] | None = None):
        self.anchor = anchor
        self.group_ends = group_ends
        self.index = index
        """The index that gathered rows (I) a step into or out of them reads."""

    def emit(self, op: Operation) -> SSAValue:
        block = self.anchor.parent_block()
        assert block is not None  # the anchor is an op of the graph
        block.insert_op_after(op, self.anchor)
        self.anchor = op
        return op.results[0]

    def steps(self, value: SSAValue, steps: tuple[Step, ...], mesh: Mesh) -> SSAValue:
        t = value.type
        assert isinstance(t, DTensorType)
        shape = t.get_shape()
        boxed = value  # the value row_groups knows: each step's result is a new one
        for step in steps:
            result_type = t.with_distribution(mesh.name, nd_from_plain(step.dst))
            op_cls = sbp.COLLECTIVE_OP_OF_KIND[step.kind]
            moved = step_bytes(step, shape, itemsize(t), mesh.shape)
            ends = index = None
            before, after = step.src[step.mesh_axis], step.dst[step.mesh_axis]
            if sbp.reads_group_ends(before, after):
                assert self.group_ends is not None  # box() passes them where a step is grouped
                ends = self.group_ends(boxed, mesh)
                self._after(ends)
            if sbp.reads_index(before, after):
                assert self.index is not None  # box() passes it where a step gathers
                index = self.index(before, after)
                self._after(index)
            value = self.emit(op_cls(value, [step.mesh_axis], result_type, bytes=moved, ends=ends, index=index))
            t = result_type
        return value

    def _after(self, value: SSAValue) -> None:
        """Moves the anchor after `value`'s op if that comes later: the
        annotation sits after its producer, and the group ends a grouped
        step reads may be computed after that (never after its users,
        which sbp-infer grouped only after the ends)."""
        owner = value.owner
        block = self.anchor.parent_block()
        if not isinstance(owner, Operation) or block is None or owner.parent_block() is not block:
            return
        if block.get_operation_index(owner) > block.get_operation_index(self.anchor):
            self.anchor = owner


class GroupEnds:
    """The group ends of a graph's grouped values, whole (B) on a mesh: the
    ends value itself where sbp-infer made it B there, else one boxed copy
    made after it and shared by every grouped step."""

    def __init__(self, graph: lg.GraphOp):
        self.groups = row_groups(graph.body.ops)
        self.whole_on: dict[tuple[int, str], SSAValue] = {}

    def whole(self, value: SSAValue, mesh: Mesh) -> SSAValue:
        ends = self.groups.ends_of(value) if self.groups is not None else None
        if ends is None:
            raise PassFailedException(f"no group ends say whose rows of {value.name_hint or 'a value'} are whose: "
                                      "it cannot be grouped by expert (G)")
        key = (id(ends), mesh.name)
        found = self.whole_on.get(key)
        if found is not None:
            return found
        t = ends.type
        assert isinstance(t, DTensorType)  # after sbp-infer every value is distributed
        whole_nd = tuple(Sbp.B for _ in mesh.shape)
        if nd_to_plain(t.nd_sbp) == whole_nd and t.placement_name == mesh.name:
            found = ends
        else:
            owner = ends.owner
            anchor = owner if isinstance(owner, Operation) else None
            if anchor is None or lookup_placement(anchor, t.placement).mesh() != mesh:
                raise PassFailedException(f"the group ends {ends.name_hint or ''} are not on @{mesh.name}, where "
                                          "rows are grouped by them")
            steps, _ = plan(nd_to_plain(t.nd_sbp), whole_nd, mesh.shape, len(global_shape(t)))
            found = BoxingBuilder(anchor).steps(ends, steps, mesh)
        self.whole_on[key] = found
        return found


def _unpartial(nd: PlainNd, mesh: tuple[int, ...], rank: int) -> tuple[PlainNd, tuple[Step, ...]]:
    """The cheapest non-partial distribution a partial one reduces to, and how."""
    partial_axes = [a for a, s in enumerate(nd) if s.is_partial]
    if not partial_axes:
        return nd, ()
    best = None
    options = [Sbp.B, *(Sbp.S(i) for i in range(rank))]
    for choice in itertools.product(options, repeat=len(partial_axes)):
        target = list(nd)
        for a, s in zip(partial_axes, choice):
            target[a] = s
        try:
            steps, volume = plan(nd, tuple(target), mesh, rank)
        except ValueError:
            continue
        if best is None or volume < best[2]:
            best = (tuple(target), steps, volume)
    assert best is not None
    return best[0], best[1]


def _unpartial_options(nd: PlainNd, rank: int) -> list[PlainNd]:
    """Non-partial distributions from which `nd` is reached by make_partial."""
    partial_axes = [a for a, s in enumerate(nd) if s.is_partial]
    options = []
    for choice in itertools.product([Sbp.B, *(Sbp.S(i) for i in range(rank))], repeat=len(partial_axes)):
        target = list(nd)
        for a, s in zip(partial_axes, choice):
            target[a] = s
        if hierarchy_violation(tuple(target), nd, partial_axes) is None:
            options.append(tuple(target))
    return options


def gathering_index(source: SSAValue, result: SSAValue, before: Sbp, after: Sbp) -> SSAValue:
    """The index a step into or out of rows gathered by an index (I) reads:
    out of them, that of the gather that made them (`source`'s, through
    boxing); into them, that of the gradient of a gather that reads them
    (`result`'s users, which must agree)."""
    if before.is_indexed:
        value = source
        while isinstance(value.owner, sbp.AnnotateOp | sbp.CollectiveOp):
            value = value.owner.operands[0]
        owner = value.owner
        if isinstance(owner, lg.EmbeddingOp):
            return owner.indices
        raise PassFailedException(f"rows distributed as {format_nd((before,))} come from no gather by an index")
    found = {id(u.operation.indices): u.operation.indices for u in result.uses
             if isinstance(u.operation, lg.EmbeddingGradOp) and u.index == 0}
    if len(found) != 1:
        raise PassFailedException(f"rows asked for as {format_nd((after,))} go to {len(found)} gradients of a gather "
                                  "by an index: one index must say whose rows are whose")
    return next(iter(found.values()))


def box(annotate: sbp.AnnotateOp, group_ends: Callable[[SSAValue, Mesh], SSAValue] | None = None) -> SSAValue:
    """Emits the collectives for one redistribution; returns the new value.
    `group_ends` gives the group ends a step into or out of grouped rows
    (G) reads; the index a step into or out of gathered rows (I) reads is
    found from the gathers around (`gathering_index`)."""
    source = annotate.input
    src_t, dst_t = source.type, annotate.result.type
    assert isinstance(src_t, DTensorType) and isinstance(dst_t, DTensorType)
    src_mesh = lookup_placement(annotate, src_t.placement).mesh()
    dst_mesh = lookup_placement(annotate, dst_t.placement).mesh()
    rank = len(global_shape(src_t))
    src_nd, dst_nd = nd_to_plain(src_t.nd_sbp), nd_to_plain(dst_t.nd_sbp)
    builder = BoxingBuilder(annotate, group_ends,
                            lambda before, after: gathering_index(source, annotate.result, before, after))
    try:
        if src_mesh == dst_mesh:
            steps, _ = plan(src_nd, dst_nd, src_mesh.shape, rank)
            return builder.steps(source, steps, src_mesh)
        # Between placements: reduce partials where they are, move, rebuild.
        whole_src, steps = _unpartial(src_nd, src_mesh.shape, rank)
        value = builder.steps(source, steps, src_mesh)
        # A partial destination is built locally from whatever moves least:
        # a split (each device embeds its piece) or a whole copy.
        moved, whole_dst = min(
            (transfer_bytes(src_t.get_shape(), whole_src, src_mesh, nd, dst_mesh, itemsize(src_t)), nd)
            for nd in _unpartial_options(dst_nd, rank)
        )
        value = builder.emit(
            sbp.TransferOp(value, dst_t.with_distribution(dst_mesh.name, nd_from_plain(whole_dst)), bytes=moved)
        )
        steps, _ = plan(whole_dst, dst_nd, dst_mesh.shape, rank)
        return builder.steps(value, steps, dst_mesh)
    except ValueError as e:
        raise PassFailedException(f"'{annotate.name}': {e}") from None


@dataclass(frozen=True)
class SbpInsertBoxingPass(ModulePass):
    name = "sbp-insert-boxing"

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        for graph in lg.graphs(op):
            ends = GroupEnds(graph)
            for annotate in [a for a in graph.body.ops if isinstance(a, sbp.AnnotateOp)]:
                if not isinstance(annotate.input.type, DTensorType):
                    continue  # a hint on a logical value: sbp-infer's input, not ours
                if annotate.input.type == annotate.result.type:
                    value = annotate.input
                else:
                    value = box(annotate, ends.whole)
                    if annotate.result.name_hint:
                        value.name_hint = annotate.result.name_hint
                annotate.result.replace_all_uses_with(value)
                Rewriter.erase_op(annotate)
