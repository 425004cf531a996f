"""The memory allocator (`planning/first_fit.py`) on random lifetimes: no
two live buffers overlap, and the arena stays close to the live-set bound."""

import statistics

from hypothesis import given, settings
from hypothesis import strategies as st
from support.lifetimes import buffers

from sbpc.planning.first_fit import live_bound, place


def lifetimes():
    """Non-empty buffers of 64 bytes to 4 KiB."""
    return buffers(min_count=1, units=st.integers(1, 64))


RATIOS: list[float] = []


@settings(max_examples=200, deadline=None)
@given(lifetimes())
def test_allocator_never_overlaps_live_buffers(buffers):
    arena = place(buffers)
    for i, a in enumerate(buffers):
        assert a.offset >= 0 and a.offset + a.size <= arena
        for b in buffers[i + 1 :]:
            if a.start <= b.end and b.start <= a.end:
                assert a.offset + a.size <= b.offset or b.offset + b.size <= a.offset, (a, b)
    bound = live_bound(buffers)
    assert bound <= arena
    RATIOS.append(arena / bound)


def test_allocator_is_close_to_the_lower_bound():
    # Runs after the property test above has filled RATIOS (same module).
    if len(RATIOS) < 20:
        test_allocator_never_overlaps_live_buffers()
    ratios = sorted(RATIOS)
    median = statistics.median(ratios)
    print(f"\narena / live-set bound over {len(ratios)} random cases: median {median:.3f}, "
          f"p90 {ratios[int(0.9 * len(ratios))]:.3f}, max {ratios[-1]:.3f}")
    assert median <= 1.05
