"""The searches for the SBP choice problem (sbp_problem.py), by name:
`greedy` and `auto` (elimination and descent, sbp_problem.py) and `ilp`
(the integer program, sbp_ilp.py, falling back to auto's answer where it
cannot prove its own). sbp-infer and sbp-autoplan choose among them."""

from __future__ import annotations

from .sbp_problem import Problem, solve_auto, solve_greedy

STRATEGIES = ("greedy", "auto", "ilp")


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
