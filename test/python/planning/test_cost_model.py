"""The cost model's share of a tensor a device holds (local_fraction), which
prices every op's compute and every boxing, against the pieces the
devices really hold (dialects/pieces.py). The collectives' volumes
(axis_volume) are checked against the bytes the sbp interpreter moves in
lowering/test_sbp_insert_boxing.py."""

import math

import pytest
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
    assert problem.axis_groups(mesh) == ((0, 2), (0, 1))
    nbytes = 64 * 64 * 4
    along_0 = problem.boxing((Sbp.P, Sbp.B), (Sbp.B, Sbp.B), mesh, 2, nbytes)
    along_1 = problem.boxing((Sbp.B, Sbp.P), (Sbp.B, Sbp.B), mesh, 2, nbytes)
    assert along_0 - along_1 == pytest.approx(sync, rel=1e-12)


BOXED = """
sbp.placement @p cpu ranks RANKS mesh [SIZE]
lg.graph @g on @p {
  %x = lg.input "x" : !sbp.dtensor<256x128xf32, @p, SRC>
  %y = sbp.annotate %x : !sbp.dtensor<256x128xf32, @p, SRC> -> !sbp.dtensor<256x128xf32, @p, DST>
  lg.output ["y"] %y : !sbp.dtensor<256x128xf32, @p, DST>
}
"""


@pytest.mark.parametrize("ranks", [1, 2])
@pytest.mark.parametrize("src, dst", [("S<0>", "B"), ("B", "S<0>"), ("B", "P"), ("S<0>", "P"), ("B", "S<1>"),
                                      ("S<1>", "B"), ("S<1>", "S<0>"), ("S<0>", "S<1>")])
def test_sbp_infer_prices_a_boxing_as_the_simulator_prices_the_actors_it_becomes(ranks, src, dst):
    """One timing model: what sbp-infer charges a boxing (boxing_cost) is
    what the step-time simulator charges the plan's actors for it, the
    collective's kind over its group (Cluster.collective_time), a local
    step's copy and the executor's overhead per actor. Measured as the
    simulated step with the boxing less the same graph without it (its
    result fetched in the source layout: the feed is the same, and a
    partial destination has no feed of its own to compare with). On one
    rank nothing crosses a link, but the library still copies the input
    into the result. A split of columns is packed for MPI or unpacked from
    it (an all_to_all both ways), which the runtime copies and both charge."""
    from xdsl.context import Context

    from sbpc.dialects import parse_module
    from sbpc.lowering.compile import CompilePass
    from sbpc.perf.cluster import preset
    from sbpc.perf.step_time import simulate_plan
    from sbpc.planning.boxing_planner import boxing_cost

    cpu = preset("cpu")

    group = list(range(ranks))

    def step(a: str, b: str) -> float:
        text = BOXED.replace("RANKS", str(group)).replace("SIZE", str(ranks))
        module = parse_module(text.replace("SRC", a).replace("DST", b))
        CompilePass(bucket=False).apply(Context(), module)
        return simulate_plan(module, cpu).step_time

    nbytes = 256 * 128 * 4
    s, d = (Sbp.S(int(t[2])) if t.startswith("S") else Sbp.B if t == "B" else Sbp.P for t in (src, dst))
    charged = boxing_cost((s,), (d,), (ranks,), 2, nbytes, cpu.rates(group), [group])
    assert charged > 0
    assert step(src, dst) - step(src, src) == pytest.approx(charged, rel=1e-6)


GRADIENT = """
sbp.placement @p cpu ranks [0, 1] mesh [2]
lg.graph @g on @p {
  %lr = lg.input "lr" : tensor<f32>
  %x = lg.input "x" : !sbp.dtensor<64x32xf32, @p, S<0>>
  %w = lg.param "w" init #lg.normal<0.0, 0.1> : tensor<32x16xf32>
  %h = lg.matmul %x, %w : (!sbp.dtensor<64x32xf32, @p, S<0>>, tensor<32x16xf32>) -> tensor<64x16xf32>
  %t = lg.tanh %h : tensor<64x16xf32>
  %g = lg.matmul %x, %t transpose_lhs : (!sbp.dtensor<64x32xf32, @p, S<0>>, tensor<64x16xf32>) -> tensor<32x16xf32>
  %s = lg.mul %g, %lr : (tensor<32x16xf32>, tensor<f32>) -> tensor<32x16xf32>
  %w_new = lg.sub %w, %s : (tensor<32x16xf32>, tensor<32x16xf32>) -> tensor<32x16xf32>
  lg.output ["t", "new.w"] %t, %w_new : tensor<64x16xf32>, tensor<32x16xf32>
}
"""


def test_a_gradients_reduction_is_priced_as_a_member_of_the_steps_bucket():
    """sbp-bucket-collectives joins the reductions of the values that only
    updates read (gradients) into buckets: sbp-infer prices such a
    reduction as one member of a bucket of as many members as the step
    trains parameters (one: no bucket), and every other value's as a
    collective of its own. The update's own ops and the sources are not
    gradients."""
    from sbpc.dialects import lg, parse_module
    from sbpc.perf.cluster import preset
    from sbpc.planning.sbp_problem import build_problem

    cpu = preset("cpu")
    problem = build_problem(lg.graphs(parse_module(GRADIENT))[0], cpu.rates([0, 1]))
    names = [n.op.name for n in problem.nodes]
    forward = names.index("lg.matmul")
    backward = names.index("lg.matmul", forward + 1)
    assert [v for v, gradient in enumerate(problem.gradients) if gradient] == [backward]
    assert problem.bucket_members == 1
    nbytes = 32 * 16 * 4
    mesh = problem.nodes[backward].mesh
    alone = problem.boxing((Sbp.P,), (Sbp.B,), mesh, 2, nbytes)
    member = problem.boxing((Sbp.P,), (Sbp.B,), mesh, 2, nbytes, gradient=True)
    assert alone == pytest.approx(cpu.collective_time("all_reduce", [0, 1], nbytes, nbytes)
                                  + cpu.device.actor_overhead, rel=1e-12)
    assert member == alone  # one trained parameter: a bucket of one stays a collective of its own
    problem.bucket_members = 8
    problem._boxing.clear()
    assert problem.boxing((Sbp.P,), (Sbp.B,), mesh, 2, nbytes, gradient=True) == cpu.bucket_member_time(
        "all_reduce", [0, 1], nbytes, nbytes, nbytes, 8)
    # an all_gather is no reduction: a gradient gathered whole pays a collective of its own
    assert problem.boxing((Sbp.S(0),), (Sbp.B,), mesh, 2, nbytes, gradient=True) == problem.boxing(
        (Sbp.S(0),), (Sbp.B,), mesh, 2, nbytes)
    # where a bucket's copies cost more than the call a member saves (4 MiB
    # of gradient), sbp-bucket-collectives leaves the reduction alone: so
    # does its price
    large = 1024 * 1024 * 4
    member = cpu.bucket_member_time("reduce_scatter", [0, 1], large / 2, large, large / 2, 8)
    alone = cpu.collective_time("reduce_scatter", [0, 1], large / 2, large / 2) + cpu.device.actor_overhead
    assert alone < member
    assert problem.boxing((Sbp.P,), (Sbp.S(0),), mesh, 2, large, gradient=True) == pytest.approx(alone, rel=1e-12)


def test_a_bucket_member_pays_its_share_of_the_bucket():
    """M gradients alike joined into a bucket cost, together, what the
    bucket costs: one collective of all their bytes (one call's fixed cost:
    latency steps, sync), its concat and a slice each as
    sbp-bucket-collectives prices them (Cluster.bucket_pack_time and
    bucket_unpack_time, which that pass calls too; the slices on what they
    copy out), and an actor for the concat, the collective and each slice.
    Where ranks share a core, a member of a large bucket costs less than a
    call of its own."""
    from sbpc.perf.cluster import load_cluster

    for cluster, ranks in ((load_cluster("cpu", 2), [0, 1]), (load_cluster("cpu", 4), [0, 2]),
                           (load_cluster("h100-node", 8), list(range(8)))):
        overhead = cluster.device.actor_overhead
        n, p = 4096.0, len(ranks)
        for members in (1, 2, 16):
            bucket = (cluster.collective_time("reduce_scatter", ranks, members * n)
                      + cluster.bucket_pack_time(members * n) + cluster.bucket_unpack_time(members, members * n / p)
                      + (2 + members) * overhead)
            total = members * cluster.bucket_member_time("reduce_scatter", ranks, n, n, n / p, members)
            assert total == pytest.approx(bucket, rel=1e-12)
    shared = load_cluster("cpu", 4)
    assert (shared.bucket_member_time("all_reduce", [0, 2], 4096.0, 4096.0, 4096.0, 16)
            < shared.collective_time("all_reduce", [0, 2], 4096.0) + shared.device.actor_overhead)


def test_sbp_infer_prices_a_slice_and_a_row_gather_on_what_they_read():
    """Each candidate's local work is priced on the bytes the op's kernel
    touches (LgOp.bytes_touched), as the simulator prices its actor: a
    slice its result's bytes out of its operand, an embedding the rows it
    gathers and the indices. On every candidate, including those that
    split the operand the slice reads a part of."""
    from sbpc.dialects import lg, parse_module
    from sbpc.perf.cluster import load_cluster
    from sbpc.planning.sbp_problem import build_problem

    module = parse_module("""
sbp.placement @m cpu ranks [0, 1] mesh [2]
lg.graph @g on @m {
  %ids = lg.input "ids" : tensor<512xi64>
  %x = lg.input "x" : tensor<4096x64xf32>
  %rows = lg.embedding %x, %ids : (tensor<4096x64xf32>, tensor<512xi64>) -> tensor<512x64xf32>
  %s = lg.slice %x starts [0, 0] limits [512, 64] strides [1, 1] : tensor<4096x64xf32> -> tensor<512x64xf32>
  lg.output ["rows", "s"] %rows, %s : tensor<512x64xf32>, tensor<512x64xf32>
}
""")
    cpu = load_cluster("cpu", 2)
    problem = build_problem(lg.graphs(module)[0], cpu.rates([0, 1]))
    shapes = {"lg.slice": [(4096, 64)], "lg.embedding": [(4096, 64), (512,)]}
    result = 512 * 64 * 4
    priced = set()
    for node in problem.nodes:
        kind = node.op.name
        if kind not in shapes:
            continue
        for (ins, out), seconds in zip(node.candidates, node.compute):
            out_share = local_fraction(out, (2,), (512, 64))
            shares = [local_fraction(nd, (2,), shape) for nd, shape in zip(ins, shapes[kind])]
            flops = type(node.op).flops(shapes[kind], (512, 64)) * min(out_share, *shares)
            touched = 2 * out_share * result
            if kind == "lg.embedding":
                touched += shares[1] * 512 * 8  # the indices
            assert seconds == pytest.approx(cpu.core_time(kind, flops, touched), rel=1e-9), (kind, ins, out)
            priced.add(kind)
    assert priced == set(shapes)
