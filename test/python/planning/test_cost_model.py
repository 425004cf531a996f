"""The cost model's share of a tensor a device holds (local_fraction), which
prices every op's compute and every boxing, against the pieces the
devices really hold (dialects/pieces.py). The collectives' volumes
(axis_volume) are checked against the bytes the sbp interpreter moves in
lowering/test_sbp_insert_boxing.py."""

import math

from hypothesis import given, settings
from hypothesis import strategies as st

from sbpc.dialects.pieces import coords, piece
from sbpc.dialects.sbp import Sbp
from sbpc.planning.cost_model import local_fraction


@st.composite
def split_cases(draw):
    mesh = tuple(draw(st.lists(st.sampled_from([2, 3, 4]), min_size=1, max_size=2)))
    rank = draw(st.integers(1, 3))
    nd = tuple(draw(st.sampled_from([Sbp.B, Sbp.P, *(Sbp.S(i) for i in range(rank))])) for _ in mesh)
    devices = {}
    for s, p in zip(nd, mesh):
        if s.axis is not None:
            devices[s.axis] = devices.get(s.axis, 1) * p
    # each split axis either divides evenly or has no more elements than devices (some pieces empty):
    # the cases where the fullest device's share is exactly the model's
    shape = tuple(draw(st.sampled_from([devices[a] * 2, devices[a], max(1, devices[a] - 1), 1]))
                  if a in devices else draw(st.integers(1, 5)) for a in range(rank))
    return shape, nd, mesh


@settings(max_examples=200, deadline=None)
@given(split_cases())
def test_the_share_a_device_holds_is_the_fullest_piece(case):
    shape, nd, mesh = case
    fullest = max(math.prod(s.stop - s.start for s in piece(shape, nd, mesh, c)) for c in coords(mesh))
    assert local_fraction(nd, mesh, shape) == fullest / math.prod(shape)


def test_a_batch_smaller_than_the_mesh_is_priced_by_its_fullest_device():
    # 3 rows on 4 devices: one row each on three of them, none on the fourth
    assert local_fraction((Sbp.S(0),), (4,), (3, 8)) == 1 / 3
    assert local_fraction((Sbp.S(0), Sbp.S(0)), (2, 2), (3, 8)) == 1 / 3
    assert local_fraction((Sbp.P,), (4,), (3, 8)) == 1.0  # a partial holds the whole tensor's size


def test_a_collective_among_ranks_sharing_a_core_is_charged_the_shared_core_sync():
    # 4 ranks on the 2 cores of the cpu preset grown to 4 devices (as a
    # calibration of 4 ranks on this machine describes them), bound round
    # robin: along mesh axis 0 of a 2x2 mesh, ranks 0 and 2 share core 0;
    # along axis 1, ranks 0 and 1 have a core each. sbp-infer charges a
    # reduction along axis 0 the sync the simulator charges it
    # (Cluster.collective_sync), and one along axis 1 nothing more.
    from sbpc.dialects import lg, parse_module
    from sbpc.perf.cluster import load_cluster
    from sbpc.planning.sbp_problem import build_problem

    module = parse_module("""
sbp.placement @m cpu ranks [0, 1, 2, 3] mesh [2, 2]
lg.graph @g on @m {
  %x = lg.input "x" : tensor<64x64xf32>
  %y = lg.mul %x, %x : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  lg.output ["y"] %y : tensor<64x64xf32>
}
""")
    graph = lg.graphs(module)[0]
    problem = build_problem(graph, load_cluster("cpu", 4).rates([0, 1, 2, 3]))
    mesh = problem.nodes[0].mesh
    sync = load_cluster("cpu", 4).collective_sync([0, 2])
    assert sync > 0 and load_cluster("cpu", 4).collective_sync([0, 1]) == 0.0
    assert problem.axis_sync(mesh) == (sync, 0.0)
    nbytes = 64 * 64 * 4
    along_0 = problem.boxing((Sbp.P, Sbp.B), (Sbp.B, Sbp.B), mesh, 2, nbytes)
    along_1 = problem.boxing((Sbp.B, Sbp.P), (Sbp.B, Sbp.B), mesh, 2, nbytes)
    assert along_0 - along_1 == sync
