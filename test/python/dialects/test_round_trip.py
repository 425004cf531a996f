"""Property tests: random well-typed lg graphs verify, print, reparse (custom
and generic form) and evaluate identically."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from support.random_graphs import random_graphs, text

import sbpc
from sbpc.semantics.reference import evaluate


def _same(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for key in a:
        np.testing.assert_array_equal(a[key], b[key])  # NaNs compare equal here
        assert a[key].dtype == b[key].dtype


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_graphs())
def test_random_graphs_round_trip_and_evaluate_identically(case):
    module, feeds = case.module, case.feeds
    module.verify()
    expected = evaluate(module, feeds)

    custom = text(module)
    reparsed = sbpc.parse_module(custom)
    assert text(reparsed) == custom, "printing is not a fixed point of parse"
    _same(expected, evaluate(reparsed, feeds))

    generic = text(module, generic=True)
    from_generic = sbpc.parse_module(generic)
    assert text(from_generic) == custom
    _same(expected, evaluate(from_generic, feeds))
