"""The SBP choice problem of `sbp-infer` as an integer program, solved
exactly with HiGHS (`scipy.optimize.milp`): `sbp-infer{strategy=ilp}`.

The objective is the exact cost of a plan as sbp-infer builds it
(`sbp_problem.ExactCost`): every op's chosen candidate (compute and memory),
plus, per value, the boxing to each distinct distribution its uses want,
paid once however many uses want it (per use for parameters, which are
redistributed at each use, and for annotations). Alpa and PyTorch's
autoparallel pose the pairwise version, which pays per use; a weight
gradient read by three update ops is all-reduced once, not three times.

- a binary x[v, k] per op v and candidate k, one per op;
- per value u and distribution d one of its uses may want, a continuous
  need[u, d] >= [use wants d] for each such use;
- the boxing from each distribution s the producer may give to d,
  w[u, s, d] <= [u gives s], with sum_s w[u, s, d] >= need[u, d] - [u gives
  d], costed at boxing(s, d): exact for integer x, and a tight relaxation;
- pairwise terms (y over pairs of the two ends' choices, row and column sums
  their indicators) for per-use boxing and for parameters tied to their
  updates, over groups of candidates with identical rows and columns.

With `share`, ops that are the same op at the same place of repeated
structure (`repeated_classes`: transformer blocks, micro-batches) take one
decision, so the program shrinks by the number of repeats.

Measured (GPT, 885 to 3057 ops, this machine): on 1-D meshes HiGHS proves
the optimum in 3 to 20 s and `auto` comes within 0.1% of it; on 2x2 meshes
the program has 180k-270k columns and HiGHS does not finish in 60 s, where
`auto` answers in half a second. `sbp-infer{strategy=ilp}` therefore keeps the
cheaper of the two whenever the optimum is not proven.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass
from typing import Any

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from .sbp_problem import Problem


class IlpError(RuntimeError):
    """The solver returned no solution (it failed or hit its time limit with none)."""


@dataclass
class IlpResult:
    choice: list[int]
    objective: float
    """The program's optimum (or best found), in the problem's cost units."""
    optimal: bool
    """False where the time limit stopped the solver at a feasible, unproven solution."""
    variables: int
    constraints: int


def _groups(matrix: np.ndarray, axis: int) -> tuple[np.ndarray, np.ndarray]:
    """(representative rows (or columns) that differ, group of each original index)."""
    unique, inverse = np.unique(matrix if axis == 0 else matrix.T, axis=0, return_inverse=True)
    return (unique if axis == 0 else unique.T), inverse.reshape(-1)


def repeated_classes(problem: Problem, rounds: int = 3) -> list[int]:
    """A class per node such that nodes of one class are the same op at the
    same place of repeated structure (a transformer's blocks, micro-batches):
    same kind, candidates and costs, and, after `rounds` of refinement
    (Weisfeiler-Lehman), producers and consumers of the same classes."""
    nodes = problem.nodes
    around: list[list[tuple[int, int, bytes]]] = [[] for _ in nodes]  # (neighbour, direction, matrix digest)
    for (u, v), matrix in problem.edges.items():
        digest = np.ascontiguousarray(matrix).tobytes()
        around[u].append((v, 0, digest))
        around[v].append((u, 1, digest))
    color = [hash((n.op.name, tuple(n.candidates), n.cost.tobytes(), problem.sizes[i] if problem.sizes else None))
             for i, n in enumerate(nodes)]
    for _ in range(rounds):
        color = [hash((color[v], tuple(sorted((color[w], d, hash(m)) for w, d, m in around[v]))))
                 for v in range(len(nodes))]
    ids: dict[int, int] = {}
    return [ids.setdefault(c, len(ids)) for c in color]


class _Program:
    """Columns, rows and costs of a mixed-integer program being built."""

    def __init__(self) -> None:
        self.costs: list[float] = []
        self.integer: list[int] = []
        self.upper: list[float] = []
        self.rows: list[int] = []
        self.cols: list[int] = []
        self.vals: list[float] = []
        self.lower_bounds: list[float] = []
        self.upper_bounds: list[float] = []

    def columns(self, count: int, integer: bool = False, upper: float = 1.0) -> int:
        first = len(self.costs)
        self.costs += [0.0] * count
        self.integer += [1 if integer else 0] * count
        self.upper += [upper] * count
        return first

    def row(self, entries: list[tuple[int, float]], lo: float, hi: float) -> None:
        r = len(self.lower_bounds)
        for c, value in entries:
            self.rows.append(r)
            self.cols.append(c)
            self.vals.append(value)
        self.lower_bounds.append(lo)
        self.upper_bounds.append(hi)

    def solve(self, time_limit: float, gap: float = 0.0):
        # Costs are seconds, from picoseconds of compute to milliseconds of
        # boxing, and the solver's tolerances are absolute (an objective gap
        # of 1e-6): scaled by the geometric mean of the smallest and largest,
        # both ends stay within a few orders of 1. The relative gap is closed
        # fully (its default stops at 0.01%; near-ties are the rule).
        # HiGHS's presolve is off: on these programs (one choice per op, tied
        # by boxing rows) it took half the solve and shrank nothing that
        # mattered (an MLP's autoplan: 12.4 s of solves with it, 6.3 s without).
        # The autoplan search asks for the same program again (layouts that
        # differ only after inference, as in recomputation: an MLP's search
        # solved 19 programs, 8 of them repeats, 5 s of its 9): answered
        # from the solves already done.
        key = hashlib.blake2b(repr((self.costs, self.integer, self.upper, self.rows, self.cols, self.vals,
                                    self.lower_bounds, self.upper_bounds, time_limit, gap)).encode()).digest()
        known = _SOLVED.get(key)
        if known is not None:
            _SOLVED.move_to_end(key)
            return known
        c = np.asarray(self.costs)
        positive = np.abs(c[c != 0])
        scale = float(np.sqrt(positive.min() * positive.max())) if positive.size else 1.0
        matrix = coo_array((self.vals, (self.rows, self.cols)), shape=(len(self.lower_bounds), len(c))).tocsr()
        solved = milp(c / scale, integrality=np.asarray(self.integer), bounds=Bounds(0.0, np.asarray(self.upper)),
                      constraints=LinearConstraint(matrix, self.lower_bounds, self.upper_bounds),
                      options={"time_limit": time_limit, "disp": False, "mip_rel_gap": gap, "presolve": False})
        _SOLVED[key] = solved
        if len(_SOLVED) > SOLVED_KEPT:
            _SOLVED.popitem(last=False)
        return solved


SOLVED_KEPT = 64
"""Programs whose solutions one process keeps (least recently asked dropped)."""
_SOLVED: OrderedDict[bytes, Any] = OrderedDict()


def solve_ilp(problem: Problem, time_limit: float = 60.0, share: bool = False, gap: float = 0.0) -> IlpResult:
    """The candidate of every node minimizing the exact cost
    (`problem.exact().total`): a producer pays each distinct distribution
    its uses want once (per use for parameters and annotations), as
    sbp-infer's annotations are built. Per producer and wanted distribution
    d, a continuous `need` is at least every use's indicator of wanting d,
    and the boxing from the producer's distribution s to d is routed through
    `w[s, d] <= O[s]` with `sum_s w[s, d] >= need - O[d]`: exact for integer
    choices, and a tight relaxation. With `share`, the nodes of each
    `repeated_classes` class take one decision: the program shrinks by the
    number of repeats, at the price of optimality where repeats would rather
    differ (the first and last blocks of a model). `gap`: stop once within
    this fraction of the proven bound (0: prove the optimum)."""
    exact = problem.exact()
    nodes = problem.nodes
    cls = repeated_classes(problem) if share else list(range(len(nodes)))
    count = max(cls, default=-1) + 1
    members: list[list[int]] = [[] for _ in range(count)]
    for v, c in enumerate(cls):
        members[c].append(v)
    sizes = [len(nodes[m[0]].candidates) for m in members]
    prog = _Program()
    first: dict[int, int] = {}
    for c in range(count):
        if sizes[c] > 1:
            first[c] = prog.columns(sizes[c], integer=True)
            prog.row([(first[c] + k, 1.0) for k in range(sizes[c])], 1.0, 1.0)
    constant = 0.0

    def add_linear(v: int, per_candidate: np.ndarray, times: float = 1.0) -> None:
        """Adds per_candidate[k] * [v takes k] to the objective."""
        nonlocal constant
        c = cls[v]
        if c in first:
            for k, value in enumerate(per_candidate):
                prog.costs[first[c] + k] += times * float(value)
        else:
            constant += times * float(per_candidate[0])

    def indicator(v: int, pick) -> tuple[list[tuple[int, float]], float]:
        """sum of x[v, k] over candidates k with pick(candidate): (terms, constant)."""
        c = cls[v]
        if c not in first:
            return [], 1.0 if pick(nodes[v].candidates[0]) else 0.0
        return [(first[c] + k, 1.0) for k, cand in enumerate(nodes[v].candidates) if pick(cand)], 0.0

    for v in range(len(nodes)):
        add_linear(v, nodes[v].cost)

    pairwise: dict[tuple[int, int], np.ndarray] = {}

    def add_pair(u: int, v: int, matrix: np.ndarray) -> None:
        cu, cv = cls[u], cls[v]
        if cu > cv:
            cu, cv, matrix = cv, cu, matrix.T
        pairwise[(cu, cv)] = pairwise[(cu, cv)] + matrix if (cu, cv) in pairwise else matrix

    for (a, b), matrix in problem.ties.items():
        add_pair(a, b, matrix)

    # Producers whose fan-out is the same program (tied, with uses of the
    # same classes) share its columns; their costs add.
    groups: dict[tuple, list[int]] = {}
    for u in range(len(nodes)):
        if exact.costly_slots[u]:
            key = (cls[u], tuple(sorted((cls[v], j) for v, j in exact.costly_slots[u])))
            groups.setdefault(key, []).append(u)
    for group in groups.values():
        u = group[0]
        times = float(len(group))
        outs = sorted({cand[1] for cand in nodes[u].candidates})
        shared: dict[tuple, list[tuple[int, int]]] = {}  # (mesh, d) -> the uses that may want it
        for v, j in exact.costly_slots[u]:
            if exact.per_use[u] or nodes[v].fixed_input:
                matrix = np.array([[exact.unit(u, v, j, cu[1], cv[0][j]) for cv in nodes[v].candidates]
                                   for cu in nodes[u].candidates])
                for member in group:  # per use: a pairwise term for each member's own use
                    mv = next(w for w, jj in exact.costly_slots[member] if cls[w] == cls[v] and jj == j)
                    add_pair(member, mv, matrix)
                continue
            # in the candidates' order, not a set's: the program's columns,
            # and so HiGHS's choice among plans of equal cost, must not
            # depend on Python's string hashing (PYTHONHASHSEED)
            for d in dict.fromkeys(cand[0][j] for cand in nodes[v].candidates):
                shared.setdefault((nodes[v].mesh, d), []).append((v, j))
        for (_mesh, d), uses in shared.items():
            v0, j0 = uses[0]
            unit = {s: exact.unit(u, v0, j0, s, d) for s in outs}
            if not any(unit.values()):
                continue
            need = prog.columns(1)
            for v, j in uses:
                terms, const = indicator(v, lambda cand, j=j, d=d: cand[0][j] == d)
                prog.row([(need, 1.0)] + [(col, -value) for col, value in terms], const, np.inf)
            free_terms: list[tuple[int, float]] = []
            free_const = 0.0
            for s in outs:
                if unit[s] == 0.0:  # the producer already gives d here
                    terms, const = indicator(u, lambda cand, s=s: cand[1] == s)
                    free_terms += terms
                    free_const += const
            routed: list[tuple[int, float]] = []
            for s in outs:
                if unit[s] == 0.0:
                    continue
                terms, const = indicator(u, lambda cand, s=s: cand[1] == s)
                if not terms and const == 0.0:
                    continue  # the producer cannot give s
                w = prog.columns(1)
                prog.costs[w] += times * unit[s]
                prog.row([(w, 1.0)] + [(col, -value) for col, value in terms], -np.inf, const)
                routed.append((w, 1.0))
            # sum_s w[s] >= need - O[d]
            prog.row(routed + [(need, -1.0)] + free_terms, -free_const, np.inf)

    for (cu, cv), matrix in pairwise.items():
        if cu == cv:
            add_linear(members[cu][0], np.diagonal(matrix))
            continue
        if cu not in first or cv not in first:
            if cu not in first and cv not in first:
                constant += float(matrix[0, 0])
            elif cu not in first:
                add_linear(members[cv][0], matrix[0])
            else:
                add_linear(members[cu][0], matrix[:, 0])
            continue
        distinct_rows, row_group = _groups(matrix, 0)
        table, col_group = _groups(distinct_rows, 1)
        g_count, h_count = table.shape
        base = prog.columns(g_count * h_count)
        for g in range(g_count):
            for h in range(h_count):
                prog.costs[base + g * h_count + h] = float(table[g, h])
        for g in range(g_count):
            prog.row([(base + g * h_count + h, 1.0) for h in range(h_count)]
                     + [(first[cu] + k, -1.0) for k in np.flatnonzero(row_group == g)], 0.0, 0.0)
        for h in range(h_count):
            prog.row([(base + g * h_count + h, 1.0) for g in range(g_count)]
                     + [(first[cv] + k, -1.0) for k in np.flatnonzero(col_group == h)], 0.0, 0.0)

    choice = [0] * len(nodes)
    if not prog.costs:
        return IlpResult(choice, exact.total(choice), True, 0, 0)
    result = prog.solve(time_limit, gap)
    if result.x is None:
        raise IlpError(f"the integer program ({len(prog.costs)} variables) has no solution: {result.message}")
    for c in first:
        k = int(np.argmax(result.x[first[c]: first[c] + sizes[c]]))
        for v in members[c]:
            choice[v] = k
    return IlpResult(choice, exact.total(choice), result.status == 0, len(prog.costs), len(prog.lower_bounds))


SHARE_ABOVE = 200
"""Graphs of more ops share decisions between repeats (`repeated_classes`)."""

TIME_LIMIT = 60.0
"""Seconds HiGHS may take; then its best plan so far is used (or auto's, if better)."""
