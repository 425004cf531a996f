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

The problem (candidates, costs, edge matrices), its exact cost and the
searches live in `sbp_problem.py`; this file reads the graph into it and
writes the answer back.

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
from xdsl.dialects.builtin import ArrayAttr, FloatAttr, ModuleOp, StringAttr, f64
from xdsl.ir import Operation, SSAValue
from xdsl.passes import ModulePass
from xdsl.rewriter import Rewriter
from xdsl.utils.exceptions import PassFailedException

from sbpc.dialects import lg
from sbpc.dialects.sbp import (
    SIGNATURE_ATTR,
    AnnotateOp,
    DTensorType,
    PlacementOp,
    dtensor_of,
    element_type,
    format_nd,
    global_shape,
    signature_of,
)
from sbpc.planning.cost_model import DEFAULT_DEVICE, device_for, load_device
from sbpc.planning.sbp_problem import NdSignature, Problem, build_problem, tied_updates
from sbpc.planning.sbp_search import SOLVERS, STRATEGIES, solve_ilp


def format_signature(sig: NdSignature) -> str:
    ins, out = sig
    return f"({', '.join(format_nd(nd) for nd in ins)}) -> ({format_nd(out)})"


# --------------------------------------------------------------------------
# Writing the answer back
# --------------------------------------------------------------------------


def apply_solution(graph: lg.GraphOp, problem: Problem, choice: list[int], strategy: str, explain: bool) -> None:
    nodes = problem.nodes
    for v, node in enumerate(nodes):
        ins, out = node.candidates[choice[v]]
        result = node.op.results[0]
        new_type = dtensor_of(global_shape(result.type), element_type(result.type), node.mesh.name, out)
        if result.type != new_type:
            Rewriter.replace_value_with_new_type(result, new_type)
        if isinstance(node.op, lg.SbpRules):
            node.op.attributes[SIGNATURE_ATTR] = signature_of(ins, [out])
        if explain:
            node.op.attributes["sbp.explain"] = _explanation(problem, v, choice)

    # Where a consumer needs another distribution, request it with an annotation
    # right after the producer, shared by every consumer with the same need.
    # A parameter is the exception: it is always there, so its redistribution
    # is made right before each use (the cost model charges every use anyway).
    # A parameter stored split and gathered for a use is then gathered again
    # for the next (forward, backward) and each gathered copy dies at its use:
    # FSDP / ZeRO-3.
    requests: dict[tuple[SSAValue, DTensorType], SSAValue] = {}
    for v, node in enumerate(nodes):
        if node.fixed_input:
            continue
        ins, _ = node.candidates[choice[v]]
        operands = list(node.op.operands)
        for j, operand in enumerate(operands):
            if not isinstance(operand.type, DTensorType):
                continue
            want = dtensor_of(operand.type.get_shape(), operand.type.element_type, node.mesh.name, ins[j])
            if operand.type == want:
                continue
            owner = operand.owner
            assert isinstance(owner, Operation)
            if isinstance(owner, lg.ParamOp):
                annotate = AnnotateOp(operand, want)
                block = node.op.parent_block()
                assert block is not None  # node.op is an op of the graph
                block.insert_op_before(annotate, node.op)
                operands[j] = annotate.result
                continue
            key = (operand, want)
            if key not in requests:
                annotate = AnnotateOp(operand, want)
                block = owner.parent_block()
                assert block is not None  # owner is an op of the graph
                block.insert_op_after(annotate, owner)
                requests[key] = annotate.result
            operands[j] = requests[key]
        if operands != list(node.op.operands):
            node.op.operands = operands

    # Updated parameters are fetched in their parameter's distribution.
    output = graph.output()
    operands = list(output.operands)  # set once at the end: each setting re-registers every use
    positions: dict[SSAValue, list[int]] = {}  # where each value is fetched (a scan per update was quadratic)
    for j, value in enumerate(operands):
        positions.setdefault(value, []).append(j)
    for param_node, producer_node in tied_updates(graph, {n.op.results[0]: i for i, n in enumerate(nodes)}):
        fetched_as = nodes[param_node].op.results[0].type
        assert isinstance(fetched_as, DTensorType)  # every value is distributed once inference ran
        produced = nodes[producer_node].op.results[0]
        for j in positions.get(produced, ()):
            value = operands[j]
            if value is produced and value.type != fetched_as:
                annotate = AnnotateOp(value, fetched_as)
                graph.body.block.insert_op_before(annotate, output)
                operands[j] = annotate.result
    output.operands = operands

    graph.attributes["sbp.strategy"] = StringAttr(strategy)
    graph.attributes["sbp.total_cost"] = FloatAttr(problem.exact().total(choice), f64)


def _explanation(problem: Problem, v: int, choice: list[int]) -> ArrayAttr:
    node = problem.nodes[v]
    boxing = problem.boxing_of(v, choice)
    lines = []
    for k, sig in enumerate(node.candidates):
        mark = "* " if k == choice[v] else ""
        total = node.compute[k] + node.memory[k] + boxing[k]
        lines.append(
            StringAttr(
                f"{mark}{format_signature(sig)}: compute {node.compute[k]:.3g} boxing {boxing[k]:.3g} "
                f"memory {node.memory[k]:.3g} total {total:.3g}"
            )
        )
    return ArrayAttr(lines)


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
