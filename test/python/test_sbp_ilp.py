"""sbp-infer{strategy=ilp}: the integer program finds the optimum of the
SBP choice problem, checked against every plan enumerated."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from random_graphs import random_graphs, text
from xdsl.context import Context

from sbpc.dialects import lg, make_context, parse_module
from sbpc.lowering.cost_model import DEVICES
from sbpc.lowering.sbp_ilp import solve_ilp
from sbpc.lowering.sbp_infer import SbpInferPass, build_problem, solve_auto

ENUMERATION_LIMIT = 10_000_000
"""Plans a brute-force check enumerates at most (one float each)."""


def every_plan_cost(problem) -> np.ndarray | None:
    """The objective of every plan at once: a tensor with one axis per op
    (its candidates), the sum of the ops' costs and the edges' matrices
    broadcast over it; None if there are more plans than ENUMERATION_LIMIT."""
    sizes = [len(n.candidates) for n in problem.nodes]
    if math.prod(sizes) > ENUMERATION_LIMIT:
        return None
    total = np.zeros(sizes)
    axes = len(sizes)
    for v, node in enumerate(problem.nodes):
        shape = [1] * axes
        shape[v] = sizes[v]
        total = total + node.cost.reshape(shape)
    for (u, v), matrix in problem.edges.items():
        shape = [1] * axes
        shape[u], shape[v] = sizes[u], sizes[v]
        total = total + (matrix if u < v else matrix.T).reshape(shape) if u != v else total
    return total


def check_optimal(problem, drawn: bool = True) -> None:
    every = every_plan_cost(problem)
    if drawn:
        assume(every is not None)
    assert every is not None
    result = solve_ilp(problem)
    assert result.optimal
    best = float(every.min())
    assert result.objective == pytest.approx(best, rel=1e-9, abs=1e-15)
    assert problem.total(result.choice) == pytest.approx(best, rel=1e-9, abs=1e-15)
    # and the search it replaces is never better
    assert problem.total(solve_auto(problem)) >= best - 1e-12 * max(1.0, abs(best))


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(random_graphs(meshes=((2,), (2,), (4,), (2, 2))))
def test_the_program_finds_the_cheapest_of_every_plan(case):
    graph = next(iter(lg.graphs(case.module)))
    check_optimal(build_problem(graph, DEVICES["cpu"]))


MLP_2x2 = """
sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
lg.graph @mlp on @m {
  %x = lg.input "x" : tensor<8x4xf32>
  %w1 = lg.param "w1" init #lg.normal<0.0, 0.5> seed 1 : tensor<4x8xf32>
  %h = lg.matmul %x, %w1 : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
  %a = lg.gelu %h : tensor<8x8xf32>
  %w2 = lg.param "w2" init #lg.normal<0.0, 0.5> seed 2 : tensor<8x4xf32>
  %y = lg.matmul %a, %w2 : (tensor<8x8xf32>, tensor<8x4xf32>) -> tensor<8x4xf32>
  lg.output ["y"] %y : tensor<8x4xf32>
}
"""


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_an_mlp_on_a_2x2_mesh_gets_the_cheapest_plan(device):
    module = parse_module(MLP_2x2, "mlp")
    graph = next(iter(lg.graphs(module)))
    problem = build_problem(graph, DEVICES[device])
    assert math.prod(len(n.candidates) for n in problem.nodes) > 1000  # not a trivial enumeration
    check_optimal(problem, drawn=False)


def test_the_strategy_runs_as_a_pass_and_records_itself():
    module = parse_module(MLP_2x2, "mlp")
    SbpInferPass(strategy="ilp").apply(make_context(), module)
    module.verify()
    graph = next(iter(lg.graphs(module)))
    assert graph.attributes["sbp.strategy"].data == "ilp"
    auto = parse_module(MLP_2x2, "mlp")
    SbpInferPass(strategy="auto").apply(Context(), auto)
    assert graph.attributes["sbp.total_cost"].value.data <= \
        next(iter(lg.graphs(auto))).attributes["sbp.total_cost"].value.data * (1 + 1e-9), text(module)
