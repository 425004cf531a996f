"""The SBP choice problem of `sbp-infer` as an integer program, solved
exactly with HiGHS (`scipy.optimize.milp`): `sbp-infer{strategy=ilp}`, and
what `sbp-autoplan` solves for every mesh shape it tries.

The problem (`sbp_infer.Problem`) prices every op's candidate signatures
(compute and memory) and every producer-consumer edge by a matrix of boxing
costs. Its objective is the sum of the chosen candidates' costs and the
chosen entries of the edge matrices. Alpa and PyTorch's autoparallel pose
the same program:

- a binary x[v, k] per op v and candidate k, one per op (sum_k x[v, k] = 1);
- per edge, a non-negative y over pairs (producer's choice, consumer's
  choice) whose row and column sums are the two ops' indicators, so y is
  their product, and the edge costs sum(y * matrix).

An edge matrix has far fewer distinct rows and columns than candidates (a
producer's candidates that yield the same distribution send alike; a
consumer's that need the same input receive alike), so y ranges over groups
of candidates with identical rows and columns: on a 2-D mesh dozens of
candidates per side become a handful. Ops with one candidate are constants:
their edges fold into their neighbours' costs.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import Bounds, LinearConstraint, milp
from scipy.sparse import coo_array

from .sbp_infer import Problem


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


def solve_ilp(problem: Problem, time_limit: float = 60.0) -> IlpResult:
    """The candidate of every node minimizing `problem.total` (exactly, unless
    the time limit stops HiGHS first)."""
    nodes = problem.nodes
    free = [v for v, node in enumerate(nodes) if len(node.candidates) > 1]
    column = 0
    first: dict[int, int] = {}  # x[v, k] is column first[v] + k
    for v in free:
        first[v] = column
        column += len(nodes[v].candidates)
    costs: list[float] = [0.0] * column
    constant = 0.0
    for v, node in enumerate(nodes):
        if v in first:
            costs[first[v]: first[v] + len(node.candidates)] = list(node.cost)
        else:
            constant += float(node.cost[0])
    rows: list[int] = []
    cols: list[int] = []
    vals: list[float] = []
    lower: list[float] = []
    upper: list[float] = []

    def row(entries: list[tuple[int, float]], lo: float, hi: float) -> None:
        r = len(lower)
        for c, value in entries:
            rows.append(r)
            cols.append(c)
            vals.append(value)
        lower.append(lo)
        upper.append(hi)

    for v in free:
        row([(first[v] + k, 1.0) for k in range(len(nodes[v].candidates))], 1.0, 1.0)

    for (u, v), matrix in problem.edges.items():
        if u not in first and v not in first:
            constant += float(matrix[0, 0])
            continue
        if u not in first:  # the producer is fixed: a cost on the consumer's candidates
            for k, c in enumerate(matrix[0]):
                costs[first[v] + k] += float(c)
            continue
        if v not in first:
            for k, c in enumerate(matrix[:, 0]):
                costs[first[u] + k] += float(c)
            continue
        if np.all(matrix == matrix.flat[0]):
            constant += float(matrix.flat[0])
            continue
        distinct_rows, row_group = _groups(matrix, 0)
        table, col_group = _groups(distinct_rows, 1)
        g_count, h_count = table.shape
        if h_count == 1:  # every consumer choice costs alike: a cost on the producer
            for k in range(matrix.shape[0]):
                costs[first[u] + k] += float(table[row_group[k], 0])
            continue
        if g_count == 1:
            for k in range(matrix.shape[1]):
                costs[first[v] + k] += float(table[0, col_group[k]])
            continue
        base = column
        column += g_count * h_count
        costs.extend(float(c) for c in table.reshape(-1))
        for g in range(g_count):
            entries = [(base + g * h_count + h, 1.0) for h in range(h_count)]
            entries += [(first[u] + k, -1.0) for k in np.flatnonzero(row_group == g)]
            row(entries, 0.0, 0.0)
        for h in range(h_count):
            entries = [(base + g * h_count + h, 1.0) for g in range(g_count)]
            entries += [(first[v] + k, -1.0) for k in np.flatnonzero(col_group == h)]
            row(entries, 0.0, 0.0)

    choice = [0] * len(nodes)
    if column == 0:
        return IlpResult(choice, constant, True, 0, 0)
    x_count = sum(len(nodes[v].candidates) for v in free)
    integrality = np.zeros(column)
    integrality[:x_count] = 1
    constraints = LinearConstraint(coo_array((vals, (rows, cols)), shape=(len(lower), column)).tocsr(), lower, upper)
    # Costs are seconds, from picoseconds of compute to milliseconds of
    # boxing, and the solver's tolerances are absolute (an objective gap of
    # 1e-6): scaled by the geometric mean of the smallest and largest, both
    # ends stay within a few orders of 1. The relative gap is closed fully
    # (its default stops at 0.01%; near-ties are the rule between signatures).
    c = np.asarray(costs)
    positive = np.abs(c[c != 0])
    scale = float(np.sqrt(positive.min() * positive.max())) if positive.size else 1.0
    result = milp(c / scale, integrality=integrality, bounds=Bounds(0.0, 1.0), constraints=constraints,
                  options={"time_limit": time_limit, "disp": False, "mip_rel_gap": 0.0})
    if result.x is None:
        raise IlpError(f"the integer program ({column} variables) has no solution: {result.message}")
    for v in free:
        picked = result.x[first[v]: first[v] + len(nodes[v].candidates)]
        choice[v] = int(np.argmax(picked))
    _polish(problem, choice, free)
    return IlpResult(choice, problem.total(choice), result.status == 0, column, len(lower))


def _polish(problem: Problem, choice: list[int], free: list[int], rounds: int = 50) -> None:
    """Single-op moves that lower the objective. The solver's tolerances are
    about 1e-6 of the largest cost, so between candidates whose costs differ
    by less (a 20 ps compute difference beside a 20 us all_reduce) it may
    pick either; these moves settle such near-ties exactly."""
    around: dict[int, list[tuple[int, np.ndarray]]] = {}  # v -> (neighbour w, matrix [k_v, k_w])
    for (u, v), matrix in problem.edges.items():
        around.setdefault(u, []).append((v, matrix))
        around.setdefault(v, []).append((u, matrix.T))
    for _ in range(rounds):
        changed = False
        for v in free:
            total = problem.nodes[v].cost.copy()
            for w, matrix in around.get(v, ()):
                total += matrix[:, choice[w]]
            best = int(total.argmin())
            if total[best] < total[choice[v]] - 1e-12 * abs(total[choice[v]]):
                choice[v], changed = best, True
        if not changed:
            return


def solve(problem: Problem) -> list[int]:
    """sbp-infer{strategy=ilp}: the exact optimum of the pairwise program,
    then improved on the exact cost model (which charges a value boxed once
    for every consumer that needs the same distribution)."""
    return problem.exact().refine(solve_ilp(problem).choice)
