"""Skipping what needs a GPU where there is none."""

import pytest

from sbpc.runtime import cuda


def gpu_or_skip():
    try:
        cuda.driver()
    except cuda.CudaUnavailable as e:
        pytest.skip(f"no GPU here: {e}")
