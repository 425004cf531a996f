"""Which rows are grouped by which experts' ends: the analysis behind the
grouped distribution G (sbp.GroupedAttr).

A tensor may be G only where one vector of group ends (lg.grouped_matmul's
`ends`) says whose rows are whose. Rows keep their meaning through ops that
compute each row of their result from the same rows of some operands (the
ops whose result may be S(0) from those operands S(0) with the same rows:
lg.base.grouped_twin) and through sbp's annotations and collectives. So the
values linked by such ops form classes, and a class that meets one grouped
matmul's ends (its rows, or its result's) is grouped by those ends. A class
that meets two different ends is grouped by neither: its rows do not mean
one routing's rows.

sbp-infer offers an op a signature with G only where every value it groups
is in the class of one ends, and only after those ends are computed (a
collective into or out of G reads them); sbp-insert-boxing finds the ends a
collective reads here.
"""

from __future__ import annotations

from collections.abc import Iterable

from xdsl.ir import Operation, SSAValue

from . import lg, sbp
from .sbp import Sbp, global_shape


def _root(value: SSAValue) -> SSAValue:
    """The value before any sbp annotation or collective: one routing's ends
    may reach its grouped matmuls boxed to several distributions."""
    while isinstance(value.owner, Operation) and isinstance(value.owner, sbp.AnnotateOp | sbp.CollectiveOp):
        value = value.owner.operands[0]
    return value


class RowGroups:
    """The grouping classes of one graph's values."""

    def __init__(self, ops: Iterable[Operation]):
        self._parent: dict[int, int] = {}
        self._ends: dict[int, set[int]] = {}  # class root -> ids of the ends values it meets
        self._values: dict[int, SSAValue] = {}  # id -> ends value
        self.position: dict[int, int] = {}  # id of an op -> its place in the graph
        for i, op in enumerate(ops):
            self.position[id(op)] = i
            self._link(op)

    # -- union-find over value ids ----------------------------------------------

    def _find(self, key: int) -> int:
        root = key
        while (parent := self._parent.setdefault(root, root)) != root:
            root = parent
        while key != root:  # path compression, iteratively: graphs run to tens of thousands of ops
            self._parent[key], key = root, self._parent[key]
        return root

    def _union(self, a: SSAValue, b: SSAValue) -> None:
        ra, rb = self._find(id(a)), self._find(id(b))
        if ra != rb:
            self._parent[rb] = ra
            self._ends.setdefault(ra, set()).update(self._ends.pop(rb, ()))

    def _meets(self, value: SSAValue, ends: SSAValue) -> None:
        root = _root(ends)
        self._values[id(root)] = root
        self._ends.setdefault(self._find(id(value)), set()).add(id(root))

    def _link(self, op: Operation) -> None:
        if isinstance(op, sbp.AnnotateOp | sbp.CollectiveOp):
            self._union(op.operands[0], op.results[0])
            return
        if isinstance(op, lg.GroupedMatmulOp):
            self._meets(op.lhs, op.ends)
            self._meets(op.result, op.ends)
        elif isinstance(op, lg.GroupedMatmulGradWeightOp):
            self._meets(op.lhs, op.ends)
            self._meets(op.rhs, op.ends)
        if not isinstance(op, lg.SbpRules) or len(op.results) != 1:
            return
        out_shape = global_shape(op.results[0].type)
        if not out_shape:
            return
        in_shapes = tuple(global_shape(o.type) for o in op.operands)
        params = tuple(sorted(op.params().items())) if isinstance(op, lg.LgOp) else ()
        try:
            signatures = type(op).signatures(in_shapes, out_shape, 2, params)
        except TypeError:  # a property without a hash: no rows linked
            return
        linked: set[int] = set()
        for ins, outs in signatures:
            if outs[0] == Sbp.S(0):
                linked.update(j for j, s in enumerate(ins) if s == Sbp.S(0) and in_shapes[j][:1] == out_shape[:1])
        for j in linked:
            self._union(op.operands[j], op.results[0])

    # -- queries -------------------------------------------------------------------

    def ends_of(self, value: SSAValue) -> SSAValue | None:
        """The ends grouping `value`'s rows, or None (no one ends, or several)."""
        met = self._ends.get(self._find(id(value)), set())
        return self._values[next(iter(met))] if len(met) == 1 else None

    def grouping(self, op: Operation) -> SSAValue | None:
        """The one ends by which `op` may group its operands and result (G):
        all of them that meet some ends meet these, and `op` comes after
        them; None where it may group nothing."""
        found: set[int] = set()
        for value in (*op.operands, *op.results):
            met = self._ends.get(self._find(id(value)))
            if met:
                if len(met) > 1:
                    return None
                found |= met
        if len(found) != 1:
            return None
        ends = self._values[found.pop()]
        owner = ends.owner
        if isinstance(owner, Operation) and self.position.get(id(owner), len(self.position)) >= self.position.get(
                id(op), -1):
            return None
        return ends


def row_groups(ops: Iterable[Operation]) -> RowGroups | None:
    """The grouping classes of a graph's ops, or None where no op groups rows
    (no grouped matmul): the common case costs one pass over the ops."""
    ops = list(ops)
    if not any(isinstance(op, lg.GroupedMatmulOp | lg.GroupedMatmulGradWeightOp) for op in ops):
        return None
    return RowGroups(ops)
