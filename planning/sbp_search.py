"""The searches for the SBP choice problem (sbp_problem.py), by name:
`greedy` (OneFlow's default: program order, each op its cheapest
signature given its producers'), `auto` (SbpGraph's elimination of nodes
of degree <= 2, then coordinate descent on what remains) and `ilp`
(the integer program, sbp_ilp.py, falling back to auto's answer where it
cannot prove its own). sbp-infer and sbp-autoplan choose among them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from .sbp_problem import Problem

STRATEGIES = ("greedy", "auto", "ilp")


def solve_greedy(problem: Problem) -> list[int]:
    nodes = problem.nodes
    choice: list[int | None] = [None] * len(nodes)
    is_source = [all(p is None for p in node.producers) for node in nodes]
    incoming: dict[int, list[int]] = {}
    for u, v in problem.edges:
        incoming.setdefault(v, []).append(u)
    for v, node in enumerate(nodes):
        if is_source[v]:
            continue
        total = node.cost.copy()
        deferred: dict[int, np.ndarray] = {}
        for u in incoming.get(v, []):
            if u > v:
                continue  # a tie to a later node is charged when that node is decided
            edge = problem.edges[(u, v)]
            if choice[u] is None:
                # an undecided source: decide it jointly with this consumer
                joint = nodes[u].cost[:, None] + edge
                deferred[u] = joint.argmin(axis=0)
                total += joint.min(axis=0)
            else:
                total += edge[choice[u]]
        choice[v] = int(total.argmin())
        for u, best in deferred.items():
            choice[u] = int(best[choice[v]])
    for v, node in enumerate(nodes):
        if choice[v] is None:
            choice[v] = int(node.cost.argmin())
    return choice  # type: ignore[return-value]


ELIMINATION_LIMIT = 4_000_000
"""Largest k_u * k_v * k_w table a chain elimination may build."""


@dataclass
class Eliminated:
    """What elimination leaves of a problem: the nodes it could not remove
    (`core`, each node's cost with what was folded into it, their edges)
    and the records that decide the removed nodes from the core's choice."""

    cost: list[np.ndarray]
    adj: list[dict[int, np.ndarray]]
    records: list[tuple]
    core: list[int]

    def own_cheapest(self, start: Sequence[int]) -> list[int]:
        """`start` with each core node at its own cheapest choice."""
        choice = list(start)
        for v in self.core:
            choice[v] = int(self.cost[v].argmin())
        return choice

    def descend(self, start: Sequence[int]) -> list[int]:
        """Coordinate descent of the core from `start`, then the removed
        nodes decided from it."""
        choice, cost, adj = list(start), self.cost, self.adj
        for _ in range(50):
            changed = False
            for v in self.core:
                total = cost[v].copy()
                for u, m in adj[v].items():
                    total += m[:, choice[u]]
                best = int(total.argmin())
                if total[best] < total[choice[v]] - 1e-15:
                    choice[v], changed = best, True
            if not changed:
                break
        for record in reversed(self.records):
            kind, v = record[0], record[1]
            if kind == "fix":
                choice[v] = record[2]
            elif kind == "leaf":
                choice[v] = int(record[3][choice[record[2]]])
            else:
                choice[v] = int(record[4][choice[record[2]], choice[record[3]]])
        return choice


def eliminate(problem: Problem) -> Eliminated:
    """SbpGraph's elimination of the nodes of degree <= 2: a leaf folds into
    its neighbour, a chain node into an edge between its two."""
    nodes = problem.nodes
    cost = [node.cost.copy() for node in nodes]
    adj: list[dict[int, np.ndarray]] = [{} for _ in nodes]  # adj[a][b]: [k_a, k_b]

    def add_edge(a: int, b: int, m: np.ndarray) -> None:
        if b in adj[a]:
            adj[a][b] = adj[a][b] + m
        else:
            adj[a][b] = m
        adj[b][a] = adj[a][b].T

    for (u, v), m in problem.edges.items():
        add_edge(u, v, m)

    records: list[tuple] = []
    alive = [True] * len(nodes)
    work = list(range(len(nodes)))
    while work:
        v = work.pop()
        if not alive[v]:
            continue
        neighbors = list(adj[v])
        if len(neighbors) == 0:
            records.append(("fix", v, int(cost[v].argmin())))
        elif len(neighbors) == 1:
            (u,) = neighbors
            table = adj[u][v] + cost[v][None, :]  # [k_u, k_v]
            records.append(("leaf", v, u, table.argmin(axis=1)))
            cost[u] = cost[u] + table.min(axis=1)
            del adj[u][v]
            work.append(u)
        elif len(neighbors) == 2:
            u, w = neighbors
            a, b = adj[u][v], adj[v][w]
            if a.shape[0] * a.shape[1] * b.shape[1] > ELIMINATION_LIMIT:
                continue
            table = a[:, :, None] + cost[v][None, :, None] + b[None, :, :]  # [k_u, k_v, k_w]
            records.append(("chain", v, u, w, table.argmin(axis=1)))
            del adj[u][v], adj[w][v]
            add_edge(u, w, table.min(axis=1))
            work.extend((u, w))
        else:
            continue
        alive[v] = False
        adj[v] = {}
    return Eliminated(cost, adj, records, [v for v in range(len(nodes)) if alive[v]])


def solve_auto(problem: Problem) -> list[int]:
    """Elimination, then coordinate descent of what remains from two starts:
    greedy's answer and each node's own cheapest choice (with what
    elimination folded into it); the cheaper (exact cost) of the two and
    greedy's own, refined. Greedy decides in program order, and a descent
    one node at a time cannot leave where it lands: on a ResNet, whose batch
    normalizations tie each layer's nodes together, it kept the later
    stages' activations gathered, which the second start's descent does not
    (sbp-infer's own cost 37.8 -> 37.3 ms; measured 49-51 -> 46-47 ms a
    step)."""
    greedy = solve_greedy(problem)
    eliminated = eliminate(problem)
    exact = problem.exact()
    winner = min((eliminated.descend(greedy), eliminated.descend(eliminated.own_cheapest(greedy)), greedy),
                 key=exact.total)
    return exact.refine(list(winner))


def solve_ilp(problem: Problem, gap: float = 0.0) -> list[int]:
    """The integer program's answer where it is proven optimal; else (also
    when it stopped within `gap` of its bound) the cheaper (exact cost) of
    its refined answer and auto's (sbp_ilp.py)."""
    from . import sbp_ilp  # scipy loads only for this strategy

    exact = problem.exact()
    small = len(problem.nodes) <= sbp_ilp.SHARE_ABOVE
    result = sbp_ilp.solve_ilp(problem, sbp_ilp.TIME_LIMIT, share=not small, gap=gap)
    if result.optimal and small and gap == 0:
        return result.choice
    return min(exact.refine(list(result.choice)), solve_auto(problem), key=exact.total)


SOLVERS = {"greedy": solve_greedy, "auto": solve_auto, "ilp": solve_ilp}
