"""Which slices are one run of their input's bytes (plan.slice_view_start),
against numpy's own slicing of an array of its element indices."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from xdsl.dialects.builtin import ArrayAttr, DenseArrayBase, DictionaryAttr, StringAttr, SymbolRefAttr, i64

from sbpc.dialects import plan


def _slice_actor(starts, limits, strides=None) -> plan.ComputeOp:
    props = DictionaryAttr({"starts": DenseArrayBase.from_list(i64, starts),
                            "limits": DenseArrayBase.from_list(i64, limits),
                            "strides": DenseArrayBase.from_list(i64, strides or [1] * len(starts))})
    return plan.ComputeOp.build(properties={
        "sym_name": StringAttr("s"), "kernel": StringAttr(plan.SLICE_KERNEL), "props": props,
        "ins": ArrayAttr([SymbolRefAttr("x")]), "outs": ArrayAttr([SymbolRefAttr("y")])})


@st.composite
def slices(draw):
    shape = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    starts, limits = [], []
    for d in shape:
        lo = draw(st.integers(0, d - 1))
        starts.append(lo)
        limits.append(draw(st.integers(lo + 1, d)))
    return shape, starts, limits


@settings(max_examples=200, deadline=None)
@given(slices())
def test_a_slice_is_a_view_exactly_where_numpy_finds_one_run_of_the_bytes(case):
    shape, starts, limits = case
    whole = np.arange(int(np.prod(shape))).reshape(shape)
    kept = whole[tuple(slice(lo, hi) for lo, hi in zip(starts, limits))].ravel()
    one_run = bool(np.array_equal(kept, np.arange(kept[0], kept[0] + kept.size)))
    start = plan.slice_view_start(_slice_actor(starts, limits), shape)
    assert (start is not None) == one_run, (shape, starts, limits, start)
    if start is not None:
        assert start == kept[0]


def test_a_strided_slice_is_no_view_and_a_split_axis_kept_whole_is_read_locally():
    assert plan.slice_view_start(_slice_actor([0], [8], [2]), [8]) is None
    # rows 0..4 of a global 4 x 6 whose rows are split over two ranks (a local
    # piece of 2 rows), columns 3..5 of each: the whole rows axis of the piece
    assert plan.slice_view_start(_slice_actor([0, 3], [4, 6]), [2, 6]) is None
    assert plan.slice_view_start(_slice_actor([0, 0], [4, 6]), [2, 6]) == 0
    assert plan.slice_view_start(_slice_actor([1, 0], [2, 6]), [2, 6]) == 6
