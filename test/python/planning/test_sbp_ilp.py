"""sbp-infer{strategy=ilp}: the integer program finds the cheapest plan as
sbp-infer builds it, checked against every plan enumerated."""

from __future__ import annotations

import itertools
import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings
from support.random_graphs import random_graphs, text
from xdsl.context import Context

from sbpc.dialects import lg, make_context, parse_module
from sbpc.lowering.sbp_infer import SbpInferPass
from sbpc.planning.cost_model import load_device
from sbpc.planning.sbp_ilp import repeated_classes, solve_ilp
from sbpc.planning.sbp_problem import build_problem
from sbpc.planning.sbp_search import solve_auto

EXACT_ENUMERATION_LIMIT = 3000
"""Plans the exact-cost check enumerates at most (each costed in Python)."""


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.filter_too_much, HealthCheck.too_slow])
@given(random_graphs(meshes=((2,), (2,), (4,), (2, 2))))
def test_the_exact_program_finds_the_cheapest_plan_as_built(case):
    """The exact cost charges a value once per distinct distribution its uses
    want; the program's optimum is the cheapest of every plan under it."""
    graph = next(iter(lg.graphs(case.module)))
    problem = build_problem(graph, load_device("cpu"))
    sizes = [len(n.candidates) for n in problem.nodes]
    assume(math.prod(sizes) <= EXACT_ENUMERATION_LIMIT)
    exact = problem.exact()
    best = min(exact.total(plan) for plan in itertools.product(*(range(k) for k in sizes)))
    result = solve_ilp(problem)
    assert result.optimal
    assert result.objective == pytest.approx(best, rel=1e-9, abs=1e-15), text(case.module)


MLP_2x2 = """
sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
lg.graph @mlp on @m {
  %x = lg.input "x" : tensor<8x4xf32>
  %a = lg.gelu %x : tensor<8x4xf32>
  %w = lg.param "w" init #lg.normal<0.0, 0.5> seed 1 : tensor<4x8xf32>
  %y = lg.matmul %a, %w : (tensor<8x4xf32>, tensor<4x8xf32>) -> tensor<8x8xf32>
  %z = lg.tanh %y : tensor<8x8xf32>
  lg.output ["y", "z"] %y, %z : tensor<8x8xf32>, tensor<8x8xf32>
}
"""


@pytest.mark.parametrize("device", ["cuda"])
def test_a_2x2_mesh_gets_the_cheapest_of_every_plan(device):
    module = parse_module(MLP_2x2, "mlp")
    problem = build_problem(next(iter(lg.graphs(module))), load_device(device))
    sizes = [len(n.candidates) for n in problem.nodes]
    assert math.prod(sizes) > 10_000  # not a trivial enumeration
    exact = problem.exact()
    best = min(exact.total(plan) for plan in itertools.product(*(range(k) for k in sizes)))
    result = solve_ilp(problem)
    assert result.optimal and result.objective == pytest.approx(best, rel=1e-9)


def test_a_gap_stops_early_and_refines_within_it_and_never_worse_than_auto():
    from sbpc.planning import sbp_search

    module = parse_module(MLP_2x2, "mlp")
    problem = build_problem(next(iter(lg.graphs(module))), load_device("cuda"))
    exact = problem.exact()
    optimum = solve_ilp(problem).objective
    quick = exact.total(sbp_search.solve_ilp(problem, gap=0.05))
    assert optimum <= quick <= 1.05 * optimum + 1e-15
    assert quick <= exact.total(solve_auto(problem)) + 1e-15


def test_repeated_blocks_share_classes_and_a_shared_program_stays_feasible():
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "bench"))
    import _common

    models = _common.load_example("models")
    from sbpc.lowering.sbp_erase import SbpErasePass

    small, deep = (models.gpt("dp", 2, 16, batch=4, seq=4, dim=8, heads=2, layers=n) for n in (2, 6))
    classes = []
    for module in (small, deep):
        SbpErasePass().apply(Context(), module)
        problem = build_problem(next(iter(lg.graphs(module))), load_device("cpu"))
        classes.append(max(repeated_classes(problem)) + 1)
        result = solve_ilp(problem, share=True)
        assert result.objective <= problem.exact().total(solve_auto(problem)) * 1.05
    # four more blocks add only the classes of the blocks' boundaries
    assert classes[1] - classes[0] < 0.1 * classes[0]


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
