"""Which values rows grouped by expert (G) may be: the classes of rows that
one routing's group ends order (dialects/row_groups.py)."""

import sbpc
from sbpc.dialects import lg
from sbpc.dialects.row_groups import row_groups

GRAPH = """
sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @g on @m {
  %a = lg.input "a" : tensor<16x8xf32>
  %early = lg.relu %a : tensor<16x8xf32>
  %c1 = lg.input "c1" : tensor<2xi32>
  %c2 = lg.input "c2" : tensor<2xi32>
  %e1 = lg.cumsum %c1 axis 0 : tensor<2xi32> -> tensor<2xi32>
  %e2 = lg.cumsum %c2 axis 0 : tensor<2xi32> -> tensor<2xi32>
  %late = lg.tanh %early : tensor<16x8xf32>
  %w = lg.param "w" init #lg.normal<0.0, 0.1> : tensor<2x8x8xf32>
  %y1 = lg.grouped_matmul %late, %w, %e1 : (tensor<16x8xf32>, tensor<2x8x8xf32>, tensor<2xi32>) -> tensor<16x8xf32>
  %g1 = lg.gelu %y1 : tensor<16x8xf32>
  %t = lg.transpose %g1 perm [1, 0] : tensor<16x8xf32> -> tensor<8x16xf32>
  %r = lg.reshape %g1 : tensor<16x8xf32> -> tensor<128xf32>
  %b = lg.input "b" : tensor<16x8xf32>
  %y2 = lg.grouped_matmul %b, %w, %e2 : (tensor<16x8xf32>, tensor<2x8x8xf32>, tensor<2xi32>) -> tensor<16x8xf32>
  %mixed = lg.add %y2, %b : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>
  lg.output ["t", "r", "mixed"] %t, %r, %mixed : tensor<8x16xf32>, tensor<128xf32>, tensor<16x8xf32>
}
"""

# the same, but one routing's rows added to the other's
JOINED = GRAPH.replace(
    '  lg.output ["t", "r", "mixed"] %t, %r, %mixed : tensor<8x16xf32>, tensor<128xf32>, tensor<16x8xf32>',
    '  %both = lg.add %g1, %mixed : (tensor<16x8xf32>, tensor<16x8xf32>) -> tensor<16x8xf32>\n'
    '  lg.output ["both"] %both : tensor<16x8xf32>')


def _ops(text):
    graph = next(op for op in sbpc.parse_module(text).ops if isinstance(op, lg.GraphOp))
    return graph, {op.results[0].name_hint: op for op in graph.body.ops if op.results}


def test_rows_are_grouped_by_the_one_routing_that_orders_them_after_its_ends():
    graph, ops = _ops(GRAPH)
    groups = row_groups(graph.body.ops)
    assert groups is not None
    e1, e2 = ops["e1"].results[0], ops["e2"].results[0]
    # a grouped matmul, and the row-by-row ops on its rows after its ends
    assert groups.grouping(ops["y1"]) is e1 and groups.grouping(ops["g1"]) is e1
    assert groups.grouping(ops["late"]) is e1
    # before the ends: the collective into its rows could not read them yet
    assert groups.ends_of(ops["early"].results[0]) is e1 and groups.grouping(ops["early"]) is None
    # rows that change meaning (a transpose, a reshape to other rows) are not linked
    assert groups.ends_of(ops["t"].results[0]) is None and groups.ends_of(ops["r"].results[0]) is None
    # the other routing's rows, and the rows added to them
    assert groups.grouping(ops["y2"]) is e2 and groups.grouping(ops["mixed"]) is e2


def test_rows_of_two_routings_added_together_are_grouped_by_neither():
    """Every value linked to both routings' rows is left whole or evenly
    split: its rows mean neither routing's order."""
    graph, ops = _ops(JOINED)
    groups = row_groups(graph.body.ops)
    assert groups is not None
    for name in ("both", "g1", "y1", "y2", "mixed", "late"):
        assert groups.grouping(ops[name]) is None, name
    assert groups.ends_of(ops["b"].results[0]) is None


def test_a_graph_without_grouped_matmuls_pays_one_pass():
    module = sbpc.parse_module("""
sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @g on @m {
  %a = lg.input "a" : tensor<4x4xf32>
  %b = lg.relu %a : tensor<4x4xf32>
  lg.output ["b"] %b : tensor<4x4xf32>
}
""")
    graph = next(op for op in module.ops if isinstance(op, lg.GraphOp))
    assert row_groups(graph.body.ops) is None


def test_an_op_reading_two_routings_rows_unlinked_groups_by_neither():
    """A lookup of one routing's rows (the table) by indices in the other
    routing's order: its result is in the indices' order, but the table's
    ends are the other routing's, so the op groups nothing."""
    graph, ops = _ops("""
sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @g on @m {
  %c1 = lg.input "c1" : tensor<2xi32>
  %c2 = lg.input "c2" : tensor<2xi32>
  %e1 = lg.cumsum %c1 axis 0 : tensor<2xi32> -> tensor<2xi32>
  %e2 = lg.cumsum %c2 axis 0 : tensor<2xi32> -> tensor<2xi32>
  %w = lg.param "w" init #lg.normal<0.0, 0.1> : tensor<2x8x8xf32>
  %b = lg.input "b" : tensor<16x8xf32>
  %y2 = lg.grouped_matmul %b, %w, %e2 : (tensor<16x8xf32>, tensor<2x8x8xf32>, tensor<2xi32>) -> tensor<16x8xf32>
  %ids = lg.input "ids" : tensor<16xi64>
  %cross = lg.embedding %y2, %ids : (tensor<16x8xf32>, tensor<16xi64>) -> tensor<16x8xf32>
  %y1 = lg.grouped_matmul %cross, %w, %e1 : (tensor<16x8xf32>, tensor<2x8x8xf32>, tensor<2xi32>) -> tensor<16x8xf32>
  lg.output ["y1"] %y1 : tensor<16x8xf32>
}
""")
    groups = row_groups(graph.body.ops)
    assert groups is not None
    assert groups.ends_of(ops["cross"].results[0]) is ops["e1"].results[0]
    assert groups.ends_of(ops["y2"].results[0]) is ops["e2"].results[0]
    assert groups.grouping(ops["cross"]) is None
