"""`sbp-infer`: chooses an SBP signature for every op of a graph.

Every lg op offers its valid 1-D signatures (`sbp_rule`, next to the op);
N-D signatures are their products over the mesh axes. The pass reads the
graph once into plain data (candidates, cost vectors, boxing-cost matrices),
solves, and writes the answer back:

- every value gets a `!sbp.dtensor` type (placement and nd-SBP);
- every lg op records its choice in `sbp.signature`;
- where a consumer needs another distribution than its producer gives, an
  `sbp.annotate` requests the redistribution (sbp-insert-boxing lowers it);
- the graph records `sbp.strategy` and `sbp.total_cost` (seconds, by the
  cost model); with `explain`, every op lists its candidates and their costs.

Strategies:
- `greedy` (OneFlow's default): in program order each op takes its cheapest
  signature given its producers' choices; a source (input, parameter,
  constant) is decided together with its first consumer.
- `auto`: a global search. Like OneFlow's SbpGraph, it eliminates nodes of
  degree <= 2 (leaves fold into their neighbour, chain links into an edge,
  parallel edges merge) by dynamic programming, which is exact on trees and
  series-parallel graphs; what remains is improved by coordinate descent
  from the greedy plan. It is never worse than greedy (both are costed and
  the cheaper kept).
- `ilp`: the optimum of the exact cost, as an integer program solved by
  HiGHS (`sbp_ilp.py`), proven on graphs up to a few hundred ops; on larger
  ones repeated blocks share decisions, and where the solver stops before
  proving its answer, the cheaper of its answer and `auto`'s is kept.

The problem (candidates, costs, edge matrices) and its exact cost live in
`planning/sbp_problem.py`, the searches in `planning/sbp_search.py`, and
writing an answer back in `planning/sbp_solution.py`; this pass runs them.

Hints are constraints: a result typed `!sbp.dtensor` keeps its distribution,
and `sbp.annotate` fixes the distribution of its result. Placement: an op
runs where its result is hinted, else where its `sbp.placement` attribute
says (pipeline stages; gradient and update ops inherit it), else where its
first operand runs, else on the graph's `on @mesh`.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields
from typing import Any

from xdsl.context import Context
from xdsl.dialects.builtin import ModuleOp
from xdsl.passes import ModulePass
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg
from sbpc.dialects.sbp import PlacementOp
from sbpc.planning.cost_model import DEFAULT_DEVICE, device_for, load_device
from sbpc.planning.sbp_problem import build_problem
from sbpc.planning.sbp_search import SOLVERS, STRATEGIES, solve_ilp
from sbpc.planning.sbp_solution import apply_solution


@dataclass(frozen=True)
class SbpInferOptions:
    """The options of sbp-infer that pipelines running it (compile) expose too."""

    strategy: str = "auto"
    """`auto` (global search), `greedy`, or `ilp` (the exact optimum by an integer program)."""
    device: str = DEFAULT_DEVICE
    """A cluster preset (`cpu`, `h100-node`, `h100-16nodes`, ...; `cuda` is
    `h100`) or a cluster file (`sbp-calibrate`'s)."""

    def infer_options(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in fields(SbpInferOptions)}


@dataclass(frozen=True)
class SbpInferPass(SbpInferOptions, ModulePass):
    """Chooses an SBP signature for every op; see the module docstring."""

    name = "sbp-infer"

    explain: bool = False
    """Record every op's candidates and their costs in `sbp.explain`."""
    gap: float = 0.0
    """`ilp`: stop the solver within this fraction of its bound and refine
    its plan locally (0: prove the optimum; sbp-autoplan's layer profiles
    take 5%, which refined lands within 0.5% of it on GPT layers)."""

    def apply(self, ctx: Context, op: ModuleOp) -> None:
        if self.strategy not in SOLVERS:
            raise PassFailedException(
                f"sbp-infer: unknown strategy '{self.strategy}' "
                f"(choose {', '.join(STRATEGIES[:-1])} or {STRATEGIES[-1]})"
            )
        ranks = sorted({r for p in op.ops if isinstance(p, PlacementOp) for r in p.mesh().ranks})
        @functools.cache
        def device(spec: str):
            try:
                return load_device(spec, ranks)
            except ValueError as e:
                raise PassFailedException(f"sbp-infer: {e}") from None

        device(self.device)  # a bad option fails on any module
        for graph in lg.graphs(op):
            problem = build_problem(graph, device(device_for(graph, self.device)))
            choice = solve_ilp(problem, self.gap) if self.strategy == "ilp" else SOLVERS[self.strategy](problem)
            apply_solution(graph, problem, choice, self.strategy, self.explain)
