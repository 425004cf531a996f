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
