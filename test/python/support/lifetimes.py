"""Random buffers for the allocator's tests (planning/first_fit.py): sizes
and lifetimes [start, end] on a short schedule, so that overlaps, ties and
touching ranges are common."""

from hypothesis import strategies as st

from sbpc.planning.first_fit import Buffer

MIXED_UNITS = st.sampled_from([0, 1, 1, 2, 2, 3, 4, 8, 17])
"""Sizes as real plans have them, in units of 64 bytes: empty buffers and many equal sizes."""


@st.composite
def buffers(draw, min_count: int = 0, units=MIXED_UNITS) -> list[Buffer]:
    n = draw(st.integers(min_count, 40))
    length = draw(st.integers(1, 30))
    out = []
    for _ in range(n):
        start = draw(st.integers(-1, length))
        end = draw(st.integers(start, length + 1))
        out.append(Buffer(64 * draw(units), start, end))
    return out
